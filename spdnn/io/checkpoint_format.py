"""The checkpoint format ``spdnn-checkpoint/2`` (docs/formats.md; ``/1`` still reads): the
manifest and the rank files, read and checked field by field. The runtime's checkpoints and the
lossy state both read through here. An optimizer's state is stored by name: ``NAME.wK`` and
``NAME.bK`` for each of its arrays (``momentum_buffer``, ``exp_avg``, ...); format 1 held SGD's
one buffer as ``mwK`` and ``mbK``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from spdnn.errors import InputError, option_name
from spdnn.io.jsonfiles import manifest_file, recorded_options
from spdnn.io.jsonread import read
from spdnn.io.npz import NpzReader

CHECKPOINT_FORMAT = "spdnn-checkpoint/2"
# Besides the options declared ``record="same"`` (spdnn.schema: the sample order, the
# arithmetic, the optimizer and its settings, the recipe), the facts a run derives from them
# that a resume must match too, and the options that name them.
DERIVED = {"planned_steps": "{epochs} (the schedule's planned steps)",
           "update_end": "{update_until} and {epochs} (the step updates end at)"}
_STATE_MEMBER = re.compile(r"([a-z][a-z0-9_]*)\.([wb])(\d+)")
_LAYER_MEMBER = re.compile(r"(?:rows|counts|cols|w|b|mw|mb)(\d+)")


def check_members(r: NpzReader, n_layers: int) -> None:
    """Every array of a rank file is one the format defines, for a layer of this network: an
    array it does not know is refused, not ignored."""
    for key in r.keys:
        m = _LAYER_MEMBER.fullmatch(key) or _STATE_MEMBER.fullmatch(key)
        k = int(m.groups()[-1]) if m else 0
        if not 1 <= k <= n_layers:
            raise InputError(r.path, f"holds an array '{key}' that the checkpoint format does "
                                     f"not define for a network of {n_layers} layers")


def manifest_path(directory: str) -> Path:
    return Path(directory) / "manifest.json"


def manifest_fields(directory: str) -> dict[str, Any]:
    """The manifest's fields, validated (``spdnn.io.jsonfiles.manifest_file``); the optional
    ones that are absent are left out (a run setting recorded as null, "none", is kept)."""
    path = manifest_path(directory)
    if not path.is_file():
        raise InputError(path, "no checkpoint manifest here")
    import msgspec

    record = read(path, manifest_file())
    settings = recorded_options()
    return {k: v for k, v in msgspec.structs.asdict(record).items()
            if v is not msgspec.UNSET and (v is not None or k in settings)}


def read_manifest(directory: str, fingerprint: str, settings: dict[str, Any],
                  allow_changes: bool = False, functions: dict[str, Any] | None = None
                  ) -> dict[str, Any]:
    """The manifest, checked field by field, then against this network (its fingerprint,
    and ``functions``: its activations, cap and output activation, where the manifest
    records them) and this run's settings; the rank files it lists must exist."""
    path = manifest_path(directory)
    manifest = manifest_fields(directory)
    manifest.setdefault("optimizer", "sgd")  # format 1: only SGD wrote checkpoints
    if manifest.get("fingerprint") not in (None, fingerprint):
        raise InputError(path, "checkpoint was written for another network")
    for key, value in (functions or {}).items():  # another network, whatever the options
        if key in manifest and manifest[key] != value:
            raise InputError(path, f"checkpoint was written for a network with {key} "
                                   f"{_shown(manifest[key])}, this network has "
                                   f"{_shown(value)}")
    same = [k for k, o in recorded_options().items() if o.record == "same"] + list(DERIVED)
    for key in same:
        if key in manifest and key in settings and _plain(manifest[key]) != _plain(settings[key]) \
                and not allow_changes:
            flag = DERIVED.get(key, "{" + key + "}")
            for name in ("epochs", "update_until", key):
                flag = flag.replace("{" + name + "}", option_name(name, True))
            raise InputError(path, f"checkpoint was written with {key} "
                                   f"{_shown(manifest[key])}, this run has "
                                   f"{_shown(settings[key])}: resume with the same "
                                   f"{flag} (or --resume-with-changes)")
    for f in manifest["files"]:
        if not (Path(directory) / f).is_file():
            raise InputError(Path(directory) / f, "checkpoint file listed in the manifest is "
                                                  "missing")
    return manifest


def _plain(value: Any) -> Any:  # noqa: ANN401
    """Tuples as lists (as JSON holds them), to compare a recorded value with this run's."""
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def _shown(value: Any) -> str:  # noqa: ANN401
    value = _plain(value)
    if value == "" or value is None:
        return "none"
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ",".join(value)
    return ",".join(f"{v:g}" for v in value) if isinstance(value, list) else str(value)


def state_names(r: NpzReader, k: int) -> list[str]:
    """The optimizer state arrays a rank file holds for layer k, by name (format 1's SGD
    buffer ``mwK`` as ``momentum_buffer``)."""
    names = {m.group(1) for key in r.keys if (m := _STATE_MEMBER.fullmatch(key))
             and int(m.group(3)) == k}
    if f"mw{k}" in r.keys or f"mb{k}" in r.keys:
        names.add("momentum_buffer")
    return sorted(names)


def _state_member(r: NpzReader, name: str, part: str, k: int) -> str:
    legacy = {"w": f"mw{k}", "b": f"mb{k}"}[part]
    if name == "momentum_buffer" and legacy in r.keys:
        return legacy
    return f"{name}.{part}{k}"


def shard_layer(r: NpzReader, k: int, n_out: int, n_in: int) -> dict[str, np.ndarray]:
    """Layer k of one rank's file, every array checked against the network's sizes; an
    optimizer's state array NAME of the weights as ``NAME.w``, of the biases ``NAME.b``."""
    a = {name: r.get(f"{name}{k}") for name in ("rows", "counts", "cols", "w", "b")}
    for name in state_names(r, k):
        for part in ("w", "b"):
            member = _state_member(r, name, part, k)
            if member not in r.keys:
                raise InputError(r.path, f"'{member}' is missing beside the other half of "
                                         f"the optimizer state '{name}' of layer {k}")
            a[f"{name}.{part}"] = r.get(member)

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
    for name in a:
        if name in ("rows", "counts", "cols"):
            continue
        n = nnz if name == "w" or name.endswith(".w") else len(rows)
        if len(a[name]) != n or not np.all(np.isfinite(a[name])):
            raise bad(name, f"must hold {n} finite values")
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
