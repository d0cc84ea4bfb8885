"""Seeded fuzzing of every file format spdnn reads: valid files are mutated (truncation, byte
flips, header fields, tokens) and each outcome must be either a valid result or an InputError
(which the commands print as one line with exit code 2) - never another exception.

``SPDNN_FUZZ_CASES`` sets the mutations per format (default 60: a few hundred in all in the
suite); a larger value searches longer.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from partition.methods import partition_network
from spdnn.errors import InputError
from spdnn.io.bundle import NetworkBundle, load_network, save_network
from spdnn.io.checkpoint_format import read_manifest
from spdnn.io.checkpoint_format import shard_layer as _shard_layer
from spdnn.io.formats import read_mtx, read_triples, write_mtx, write_triples
from spdnn.io.idx import read_idx, write_idx
from spdnn.io.npz import NpzReader
from spdnn.io.planfile import load_plan, save_plan
from spdnn.io.safetensors import read_safetensors, write_safetensors
from spdnn.model.plan import network_patterns
from tests.helpers import small_network

CASES = int(os.environ.get("SPDNN_FUZZ_CASES", "60"))
SIZES = (12, 9, 7, 4)


def mutate(raw: bytes, rng: np.random.Generator) -> bytes:
    """One random mutation of a file's bytes."""
    b = bytearray(raw)
    kind = rng.integers(0, 6)
    if kind == 0 and len(b) > 1:  # truncation
        return bytes(b[: int(rng.integers(0, len(b)))])
    if kind == 1:  # a few byte flips anywhere
        for _ in range(int(rng.integers(1, 9))):
            b[int(rng.integers(0, len(b)))] = int(rng.integers(0, 256))
        return bytes(b)
    if kind == 2:  # a flip near the start (headers)
        b[int(rng.integers(0, min(len(b), 64)))] ^= 1 << int(rng.integers(0, 8))
        return bytes(b)
    if kind == 3:  # numbers in text headers (npy shapes, Matrix Market sizes, JSON fields)
        text = bytes(b).decode("latin-1")
        numbers = list(re.finditer(r"\d+", text))
        if numbers:
            m = numbers[int(rng.integers(0, len(numbers)))]
            new = str(rng.choice([0, 1, -1, 2**31, 2**63, 10**12, 10**20]))
            if len(new) <= len(m.group()) or rng.random() < 0.5:
                text = text[:m.start()] + new + text[m.end():]
            return text.encode("latin-1")
        return bytes(b)
    if kind == 4 and len(b) > 8:  # a block duplicated or removed
        i, j = sorted(int(x) for x in rng.integers(0, len(b), 2))
        return bytes(b[:i] + b[i:j] * int(rng.integers(0, 3)) + b[j:])
    return bytes(b) + bytes(rng.integers(0, 256, int(rng.integers(1, 32)), dtype=np.uint8))


def fuzz(valid: Path, load: Callable[[Path], object], seed: int,
         target: Path | None = None, named: Path | None = None) -> None:
    """Load ``CASES`` seeded mutants of ``valid`` (written to ``target``, by default beside
    it): each must load, or be refused with an InputError that names ``named`` (by default
    ``target``; a directory: some file in it)."""
    rng = np.random.default_rng(seed)
    raw = valid.read_bytes()
    target = target or valid.with_name("mutant" + "".join(valid.suffixes))
    failures = []
    refused = 0
    for case in range(CASES):
        mutant = mutate(raw, rng)
        target.write_bytes(mutant)
        t0 = time.monotonic()
        try:
            load(target)
        except InputError as exc:
            assert str(named or target) in str(exc), str(exc)  # the error names the file
            refused += 1
        except Exception:  # noqa: BLE001 - anything else is what this test hunts
            failures.append(f"case {case}: {traceback.format_exc(limit=3)}")
        if time.monotonic() - t0 > 10:
            failures.append(f"case {case}: took {time.monotonic() - t0:.0f} s")
    assert not failures, f"{len(failures)} of {CASES} mutants:\n" + "\n".join(failures[:5])
    # The mutations reach the error paths: most mutants are refused, as they should be.
    assert refused >= CASES // 3, f"only {refused} of {CASES} mutants were refused"
    print(f"{valid.name}: {refused} of {CASES} mutants refused, the others loaded valid")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("fuzz")
    net = small_network(SIZES)
    save_network(net, d / "net.npz")
    save_plan(partition_network(network_patterns(net), 2, method="cyclic",
                                fingerprint=net.fingerprint()), d / "plan.npz")
    m = sp.random(9, 12, density=0.3, random_state=0, format="csr")
    write_mtx(d / "m.mtx", m)
    write_triples(d / "m.tsv", m)
    rng = np.random.default_rng(0)
    write_idx(d / "img.idx", rng.integers(0, 255, (6, 3, 4), dtype=np.uint8))
    (d / "img.idx.gz").write_bytes(gzip.compress((d / "img.idx").read_bytes()))
    # A checkpoint rank file and manifest, as save_checkpoint writes them.
    arrays = {}
    for k, layer in enumerate(net.layers, start=1):
        w = layer.weight
        arrays.update({f"rows{k}": np.arange(w.shape[0]), f"counts{k}": np.diff(w.indptr),
                       f"cols{k}": w.indices.astype(np.int64), f"w{k}": w.data,
                       f"b{k}": layer.bias, f"mw{k}": w.data * 0.5, f"mb{k}": layer.bias})
    np.savez(d / "shard.npz", **arrays)
    (d / "ck").mkdir()
    (d / "ck" / "step000000004-rank00000.npz").write_bytes((d / "shard.npz").read_bytes())
    (d / "ck" / "manifest.json").write_text(json.dumps({
        "format": "spdnn-checkpoint/1", "step": 4, "epoch": 1, "batch": 1, "nparts": 1,
        "fingerprint": net.fingerprint(), "dtype": "float64", "n_layers": 3, "batch_size": 8,
        "seed": 0, "shuffle": True, "files": ["step000000004-rank00000.npz"]}))
    return d


def test_network_bundles(files):
    def load(p: Path) -> None:
        net = load_network(p)
        net.validate()
        with NetworkBundle(p) as bundle:  # the partitioner's path
            bundle.validate()
            network_patterns(bundle)
    fuzz(files / "net.npz", load, 1)


def test_network_bundle_rows(files):
    def load(p: Path) -> None:  # what each rank reads at start-up
        with NetworkBundle(p) as bundle:
            for k in range(1, bundle.n_layers + 1):
                bundle.rows(k, np.arange(0, bundle.shapes[k - 1][0], 2))
    fuzz(files / "net.npz", load, 2)


def test_plans(files):
    fp = load_network(files / "net.npz").fingerprint()

    def load(p: Path) -> None:
        load_plan(p).check_for(SIZES, fp, str(p))
    fuzz(files / "plan.npz", load, 3)


def test_checkpoint_files(files):
    def load(p: Path) -> None:
        with NpzReader(p, "checkpoint") as r:
            for k in range(1, 4):
                _shard_layer(r, k, SIZES[k], SIZES[k - 1])
    fuzz(files / "shard.npz", load, 4)


def test_checkpoint_manifests(files):
    fp = load_network(files / "net.npz").fingerprint()
    settings = {"batch_size": 8, "seed": 0, "shuffle": True}

    # The mutants are written as the checkpoint's own manifest: its errors must name that file.
    valid = files / "manifest.json"
    valid.write_bytes((files / "ck" / "manifest.json").read_bytes())
    # A mutant may list a rank file that does not exist: that error names the missing file.
    fuzz(valid, lambda p: read_manifest(str(p.parent), fp, settings), 5,
         target=files / "ck" / "manifest.json", named=files / "ck")


@pytest.mark.parametrize("name, reader", [("m.mtx", read_mtx), ("m.tsv", read_triples),
                                          ("img.idx", read_idx), ("img.idx.gz", read_idx)])
def test_text_and_binary_formats(files, name, reader):
    fuzz(files / name, reader, 6)


def test_safetensors_files(files):
    """A pruned model (weight_orig, weight_mask, bias per layer) as spdnn writes it."""
    path = files / "model.safetensors"
    write_safetensors(small_network(SIZES), path, pruned=True)
    fuzz(path, read_safetensors, 7)
