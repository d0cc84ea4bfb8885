"""The checkpoint format ``spdnn-checkpoint/1`` (docs/formats.md): the manifest and the rank
files, read and checked field by field. The runtime's checkpoints and the lossy state both read
through here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from spdnn.errors import InputError
from spdnn.io.jsonfiles import ManifestFile
from spdnn.io.jsonread import as_dict, read
from spdnn.io.npz import NpzReader

CHECKPOINT_FORMAT = "spdnn-checkpoint/1"
# Settings that fix the sample order and the arithmetic: resuming with other values would not
# continue the run (unless the user says so: --resume-with-changes).
RUN_SETTINGS = ("batch_size", "seed", "shuffle", "dtype", "lsh", "rehash")
_OPTIONS = {"batch_size": "--batch-size", "seed": "--seed", "shuffle": "--no-shuffle",
            "dtype": "--dtype", "lsh": "--lsh", "rehash": "--rehash"}


def manifest_path(directory: str) -> Path:
    return Path(directory) / "manifest.json"


def manifest_fields(directory: str) -> dict[str, Any]:
    """The manifest's fields, validated (``spdnn.io.jsonfiles.ManifestFile``); the optional
    ones that are absent are left out."""
    path = manifest_path(directory)
    if not path.is_file():
        raise InputError(path, "no checkpoint manifest here")
    return as_dict(read(path, ManifestFile))


def read_manifest(directory: str, fingerprint: str, settings: dict[str, Any],
                  allow_changes: bool = False) -> dict[str, Any]:
    """The manifest, checked field by field, then against this network and this run's
    settings; the rank files it lists must exist."""
    path = manifest_path(directory)
    manifest = manifest_fields(directory)
    if manifest.get("fingerprint") not in (None, fingerprint):
        raise InputError(path, "checkpoint was written for another network")
    for key in RUN_SETTINGS:
        if key in manifest and key in settings and manifest[key] != settings[key] \
                and not allow_changes:
            raise InputError(path, f"checkpoint was written with {key} {manifest[key]}, this "
                                   f"run has {settings[key]}: resume with the same "
                                   f"{_OPTIONS[key]} (or --resume-with-changes)")
    for f in manifest["files"]:
        if not (Path(directory) / f).is_file():
            raise InputError(Path(directory) / f, "checkpoint file listed in the manifest is "
                                                  "missing")
    return manifest


def shard_layer(r: NpzReader, k: int, n_out: int, n_in: int) -> dict[str, np.ndarray]:
    """Layer k of one rank's file, every array checked against the network's sizes."""
    a = {name: r.get(f"{name}{k}") for name in ("rows", "counts", "cols", "w", "b")}
    for name in ("mw", "mb"):
        if f"{name}{k}" in r.keys:
            a[name] = r.get(f"{name}{k}")

    def bad(name: str, problem: str) -> InputError:
        return InputError(r.path, f"'{name}{k}' {problem}")

    for name, v in a.items():
        if v.ndim != 1:
            raise bad(name, f"must be 1-D, has shape {v.shape}")
        kind = "iu" if name in ("rows", "counts", "cols") else "f"
        if v.dtype.kind not in kind:
            raise bad(name, f"has dtype {v.dtype}")
    rows, counts, cols = a["rows"], a["counts"], a["cols"]
    if len(rows) and (rows.min() < 0 or rows.max() >= n_out or len(np.unique(rows)) != len(rows)):
        raise bad("rows", f"must hold distinct rows in [0, {n_out})")
    if len(counts) != len(rows) or (len(counts) and counts.min() < 0):
        raise bad("counts", "must hold one count >= 0 per row")
    nnz = int(counts.sum())
    if len(cols) != nnz or (nnz and (cols.min() < 0 or cols.max() >= n_in)):
        raise bad("cols", f"must hold {nnz} columns in [0, {n_in})")
    for name, n in (("w", nnz), ("b", len(rows)), ("mw", nnz), ("mb", len(rows))):
        if name in a and (len(a[name]) != n or not np.all(np.isfinite(a[name]))):
            raise bad(name, f"must hold {n} finite values")
    if ("mw" in a) != ("mb" in a):
        raise bad("mw", "and 'mb' come together")
    return a


def positions(layer: Any, n_in: int, n_out: int, shards: list[dict[str, np.ndarray]],
              directory: str) -> tuple[np.ndarray, np.ndarray]:
    """Where my weights and biases of ``layer`` sit in the concatenation of the rank files'
    arrays (``shards``, in file order), whatever plan wrote them."""
    k = layer.index
    my_keys = layer.rows[np.repeat(np.arange(len(layer.rows)),
                                   np.diff(layer.weight.indptr))].astype(np.int64) * n_in \
        + layer.global_columns()
    keys_all = np.concatenate([np.repeat(a["rows"].astype(np.int64), a["counts"]) * n_in
                               + a["cols"] for a in shards])
    order = np.argsort(keys_all)
    pos = np.searchsorted(keys_all, my_keys, sorter=order)
    idx = order[np.minimum(pos, max(len(order) - 1, 0))] if len(order) else pos
    if len(my_keys) and (not len(order) or not np.array_equal(keys_all[idx], my_keys)):
        raise InputError(directory, f"checkpoint does not hold every weight of layer {k}")
    rows_all = np.concatenate([a["rows"] for a in shards])
    where = np.full(n_out, -1, dtype=np.int64)
    where[rows_all] = np.arange(len(rows_all))
    if np.any(where[layer.rows] < 0):
        raise InputError(directory, f"checkpoint does not hold every bias of layer {k}")
    return idx, where[layer.rows]
