"""Checkpoints: a directory with ``manifest.json`` and one ``step{S}-rank{r}.npz`` per rank
(format in README, "File formats"). Rank files are written first, the manifest last, each under
a temporary name then renamed: the manifest is the commit point, so an interrupted write keeps
the previous checkpoint. Only finite state is written. Resume works on any P and plan.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .atomic import atomic_path, write_text
from .comm import AgreedError, Communicator
from .distributed import DistributedNetwork
from .errors import InputError
from .npz import NpzReader

CHECKPOINT_FORMAT = "spdnn-checkpoint/1"
# Settings that fix the sample order: resuming with other values would not continue the run.
RUN_SETTINGS = ("batch_size", "seed", "shuffle")


@dataclass
class Position:
    """Where training stands: completed steps, and the batch of the epoch to run next."""

    step: int = 0
    epoch: int = 0
    batch: int = 0


def save_checkpoint(comm: Communicator, dnet: DistributedNetwork, buffers: list, pos: Position,
                    directory: str, settings: dict[str, Any]) -> None:
    """Each rank writes its rows (global indices), values and momentum ``buffers``; rank 0
    then commits a manifest naming the files. Collective."""
    d = Path(directory)
    arrays: dict[str, np.ndarray] = {}
    for i, layer in enumerate(dnet.layers):
        k = layer.index
        arrays[f"rows{k}"] = layer.rows
        arrays[f"counts{k}"] = np.diff(layer.weight.indptr)
        arrays[f"cols{k}"] = layer.global_columns()
        arrays[f"w{k}"] = layer.weight.data
        arrays[f"b{k}"] = layer.bias
        for j, name in ((2 * i, "mw"), (2 * i + 1, "mb")):
            if buffers[j] is not None:
                arrays[f"{name}{k}"] = buffers[j]
    finite = all(np.all(np.isfinite(a)) for a in arrays.values() if a.dtype.kind == "f")
    if not comm.allreduce_scalar(float(finite), "min"):
        kept = (f"the last good checkpoint in {directory} is kept"
                if (d / "manifest.json").is_file() else "no checkpoint was written")
        raise AgreedError(f"weights became non-finite (NaN or Inf) by step {pos.step}: {kept} "
                          "(lower --lr?)")
    name = f"step{pos.step:09d}-rank{comm.rank:05d}.npz"

    def write() -> None:
        d.mkdir(parents=True, exist_ok=True)
        with atomic_path(d / name) as tmp, open(tmp, "wb") as fh:
            np.savez(fh, **arrays)

    comm.check(write)
    if comm.rank == 0:
        old = _manifest_files(d)
        manifest = {
            "format": CHECKPOINT_FORMAT, "step": pos.step, "epoch": pos.epoch,
            "batch": pos.batch, "nparts": comm.size, "fingerprint": dnet.fingerprint,
            "dtype": str(dnet.dtype), "n_layers": dnet.n_layers, **settings,
            "files": [f"step{pos.step:09d}-rank{r:05d}.npz" for r in range(comm.size)],
        }
        write_text(d / "manifest.json", json.dumps(manifest, indent=2) + "\n")
        for f in old:
            if f not in manifest["files"]:
                (d / f).unlink(missing_ok=True)
    comm.barrier()


def _manifest_files(d: Path) -> list[str]:
    try:
        return list(json.loads((d / "manifest.json").read_text()).get("files", []))
    except (OSError, ValueError, AttributeError):
        return []


def read_manifest(directory: str, fingerprint: str, settings: dict[str, Any]
                  ) -> dict[str, Any]:
    """The manifest, checked against this network and this run's settings."""
    path = Path(directory) / "manifest.json"
    if not path.is_file():
        raise InputError(path, "no checkpoint manifest here")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(path, f"corrupt checkpoint manifest ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != CHECKPOINT_FORMAT:
        raise InputError(path, f"not a {CHECKPOINT_FORMAT} manifest")
    if manifest.get("fingerprint") not in (None, fingerprint):
        raise InputError(path, "checkpoint was written for another network")
    for key in RUN_SETTINGS:
        if key in manifest and key in settings and manifest[key] != settings[key]:
            option = {"batch_size": "--batch-size", "seed": "--seed",
                      "shuffle": "--no-shuffle"}[key]
            raise InputError(path, f"checkpoint was written with {key} {manifest[key]}, this "
                                   f"run has {settings[key]}: resume with the same {option}")
    files = manifest.get("files")
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise InputError(path, "manifest 'files' must be a list of file names")
    for f in files:
        if not (Path(directory) / f).is_file():
            raise InputError(Path(directory) / f, "checkpoint file listed in the manifest is "
                                                  "missing")
    return manifest


def load_checkpoint(dnet: DistributedNetwork, directory: str, settings: dict[str, Any]
                    ) -> tuple[Position, list]:
    """Fill my rows (any P and plan) from a checkpoint written by a run with the same
    ``settings``; returns the position and momentum."""
    manifest = read_manifest(directory, dnet.fingerprint, settings)
    readers = [NpzReader(Path(directory) / f, "checkpoint") for f in manifest["files"]]
    momentum = []
    for layer in dnet.layers:
        k = layer.index
        n_in = dnet.sizes[k - 1]
        my_keys = layer.rows[np.repeat(np.arange(len(layer.rows)),
                                       np.diff(layer.weight.indptr))].astype(np.int64) * n_in \
            + layer.global_columns()
        keys, w, mw, rows, b, mb = [], [], [], [], [], []
        for r in readers:
            counts = r.get(f"counts{k}")
            rr = r.get(f"rows{k}")
            keys.append(np.repeat(rr.astype(np.int64), counts) * n_in + r.get(f"cols{k}"))
            w.append(r.get(f"w{k}"))
            rows.append(rr)
            b.append(r.get(f"b{k}"))
            if f"mw{k}" in r.keys:
                mw.append(r.get(f"mw{k}"))
                mb.append(r.get(f"mb{k}"))
        keys_all = np.concatenate(keys)
        order = np.argsort(keys_all)
        pos = np.searchsorted(keys_all, my_keys, sorter=order)
        idx = order[np.minimum(pos, len(order) - 1)]
        if len(my_keys) and not np.array_equal(keys_all[idx], my_keys):
            raise InputError(directory, f"checkpoint does not hold every weight of layer {k}")
        layer.weight.data[:] = np.concatenate(w)[idx]
        rows_all = np.concatenate(rows)
        where = np.full(dnet.sizes[k], -1, dtype=np.int64)
        where[rows_all] = np.arange(len(rows_all))
        if np.any(where[layer.rows] < 0):
            raise InputError(directory, f"checkpoint does not hold every bias of layer {k}")
        layer.bias[:] = np.concatenate(b)[where[layer.rows]]
        if mw:
            momentum += [np.concatenate(mw)[idx].astype(dnet.dtype),
                         np.concatenate(mb)[where[layer.rows]].astype(dnet.dtype)]
        else:
            momentum += [None, None]
    for r in readers:
        r.close()
    dnet.sync()
    return Position(manifest["step"], manifest["epoch"], manifest["batch"]), momentum
