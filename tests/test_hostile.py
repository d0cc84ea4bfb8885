"""Hostile input, as a user would hand it over: every malformed file, hostile header and bad
option ends with exit code 2 and exactly one line on stderr naming the file (or option) and the
problem; no traceback, nothing left behind, and a bounded run time. Distributed commands are also
run under 2 ranks, where the line must still be printed once.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from partition.methods import partition_network
from spdnn.bundle import save_network
from spdnn.plan import network_patterns, save_plan
from tests.helpers import MPIEXEC, ROOT, small_network

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "MPIEXEC_TIMEOUT": "60"}
SIZES = (12, 9, 7, 4)


def run(ranks: int, *args: object, module: str = "spdnn", env: dict | None = None,
        timeout: float = 90) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", module, *map(str, args)]
    if ranks > 1:
        if MPIEXEC is None:
            pytest.skip("no MPI launcher")
        cmd = [MPIEXEC, "-n", str(ranks), *cmd]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**ENV, **(env or {})})
    assert time.monotonic() - t0 < 60, f"took {time.monotonic() - t0:.0f} s"
    return proc


def assert_one_line(proc: subprocess.CompletedProcess, *fragments: object) -> None:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert len(lines) == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    for f in fragments:
        assert str(f) in lines[0], (str(f), lines[0])


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A valid network, its data, a 2-rank plan and a checkpoint to break copies of."""
    d = tmp_path_factory.mktemp("hostile")
    net = small_network(SIZES)
    save_network(net, d / "net.npz")
    save_plan(partition_network(network_patterns(net), 2, "cyclic",
                                fingerprint=net.fingerprint()), d / "plan2.npz")
    rng = np.random.default_rng(0)
    np.savez(d / "data.npz", x_train=rng.standard_normal((20, 12)),
             y_train=rng.integers(0, 4, 20), x_test=rng.standard_normal((5, 12)),
             y_test=rng.integers(0, 4, 5))
    proc = run(1, "train", "--network", d / "net.npz", "--data", f"npz:{d / 'data.npz'}",
               "--epochs", "1", "--batch-size", "8", "--checkpoint-dir", d / "ckpt")
    assert proc.returncode == 0, proc.stderr
    return d


def rewrite(src: Path, dst: Path, **changes: np.ndarray | None) -> Path:
    with np.load(src, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    for k, v in changes.items():
        if v is None:
            arrays.pop(k, None)
        else:
            arrays[k] = v
    np.savez(dst, **arrays)
    return dst


def _npy_claiming(shape: tuple[int, ...]) -> bytes:
    header = f"{{'descr': '<f8', 'fortran_order': False, 'shape': {shape!r}, }}"
    header += " " * (63 - (len(header) + 10) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + b"\0" * 64


def _patch_zip(src: Path, dst: Path, member: str, *, method: int | None = None,
               flags: int | None = None) -> Path:
    """Copy a zip, changing one member's compression method or flag bits in both headers."""
    raw = bytearray(src.read_bytes())
    with zipfile.ZipFile(src) as z:
        info = z.getinfo(member + ".npy")
    local = info.header_offset
    central = raw.find(b"PK\x01\x02")
    while True:  # the central record of this member
        name_len = struct.unpack_from("<H", raw, central + 28)[0]
        if raw[central + 46:central + 46 + name_len] == info.filename.encode():
            break
        central = raw.find(b"PK\x01\x02", central + 4)
    for off, field in ((local, (8, 6)), (central, (10, 8))):
        m_at, f_at = field
        if method is not None:
            struct.pack_into("<H", raw, off + m_at, method)
        if flags is not None:
            struct.pack_into("<H", raw, off + f_at, flags)
    dst.write_bytes(bytes(raw))
    return dst


def _bad_networks(d: Path) -> dict[str, tuple[Path, str]]:
    good = d / "net.npz"
    with np.load(good) as z:
        idx, ptr = z["W1_indices"], z["W1_indptr"]
    out = d / "bad-nets"
    out.mkdir(exist_ok=True)
    neg = idx.copy()
    neg[0] = -1
    unsorted = idx.copy()
    unsorted[[0, 1]] = unsorted[[1, 0]]
    dup = idx.copy()
    dup[1] = dup[0]
    dec = ptr.copy()
    dec[1], dec[2] = dec[2], dec[1]
    wrap = ptr.astype(np.int64)
    wrap[-1] = np.iinfo(np.int64).max
    cases = {
        "negative column": ({"W1_indices": neg}, "column index -1"),
        "unsorted": ({"W1_indices": unsorted}, "unsorted column index"),
        "duplicate": ({"W1_indices": dup}, "duplicate column index"),
        "2-D indices": ({"W1_indices": idx.reshape(-1, 1)}, "1-D"),
        "indptr decreases": ({"W1_indptr": dec}, "indptr is not non-decreasing"),
        "indptr wraps": ({"W1_indptr": wrap}, "do not agree"),
        "negative shape": ({"W1_shape": np.array([-9, 12])}, "W1_shape"),
        "huge shape": ({"W1_shape": np.array([10**12, 10**12])}, "W1_shape"),
        "uint64 shape": ({"W1_shape": np.array([2**64 - 1, 12], dtype=np.uint64)}, "W1_shape"),
        "meta not an object": ({"meta": np.array("[1, 2]")}, "meta must be a JSON object"),
    }
    made = {name: (rewrite(good, out / f"{i}.npz", **ch), frag)
            for i, (name, (ch, frag)) in enumerate(cases.items())}
    claim = out / "claim.npz"
    with np.load(good) as z:
        arrays = {k: z[k] for k in z.files}
    with zipfile.ZipFile(claim, "w") as z:
        for k, v in arrays.items():
            buf = _npy_claiming((10**12,)) if k == "W1_data" else _npy_bytes(v)
            z.writestr(k + ".npy", buf)
    made["header claims 10^12"] = (claim, "claims")
    made["unsupported compression"] = (_patch_zip(good, out / "method.npz", "W1_data",
                                                  method=99), "W1_data")
    made["encrypted member"] = (_patch_zip(good, out / "crypt.npz", "W1_data", flags=1),
                                "W1_data")
    raw = good.read_bytes()
    (out / "cut.npz").write_bytes(raw[: len(raw) * 2 // 3])
    made["truncated"] = (out / "cut.npz", "cut.npz")
    return made


def _npy_bytes(a: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


NETWORK_COMMANDS = {
    "partition": lambda net, d, out: ("partition", [net, "-P", "2", "-o", out / "plan.npz"]),
    "export": lambda net, d, out: ("partition", ["export", net, "-o", out / "net.hgr"]),
    "train": lambda net, d, out: ("spdnn", ["train", "--network", net, "--data",
                                            f"npz:{d / 'data.npz'}", "--epochs", "1",
                                            "--save", out / "t.npz"]),
    "infer": lambda net, d, out: ("spdnn", ["infer", "--network", net, "--inputs",
                                            f"npz:{d / 'data.npz'}", "--metrics-out",
                                            out / "m.json"]),
    "convert": lambda net, d, out: ("spdnn", ["convert", "network", net, "--to", "mtx", "-o",
                                              out / "mtx"]),
}


@pytest.mark.parametrize("command", list(NETWORK_COMMANDS))
def test_malformed_networks_on_every_path(base, command):
    failures = []
    for i, (name, (path, fragment)) in enumerate(_bad_networks(base).items()):
        out = base / f"out-{command}-{i}"
        out.mkdir()
        module, args = NETWORK_COMMANDS[command](path, base, out)
        proc = run(1, *args, module=module)
        try:
            assert_one_line(proc, path.name, fragment)
            assert not any(out.iterdir()), "output left behind"
        except AssertionError as exc:
            failures.append(f"{name}: {exc}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("name", ["negative column", "indptr wraps", "header claims 10^12",
                                  "meta not an object"])
def test_malformed_networks_under_two_ranks(base, name):
    path, fragment = _bad_networks(base)[name]
    proc = run(2, "train", "--network", path, "--plan", base / "plan2.npz", "--data",
               f"npz:{base / 'data.npz'}", "--epochs", "1")
    assert_one_line(proc, path.name, fragment)
