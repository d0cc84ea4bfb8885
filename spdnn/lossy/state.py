"""What a checkpoint keeps of lossy training, so that a resume continues it exactly.

- Compression: every rank's residuals (error feedback) and SIDCo stage state, one file per
  rank, ``step{S}-replica{R}-rank{p}.npz`` with ``rw{k}``, ``rb{k}`` (the residual of layer k's
  weights and biases, in the order of the weights in part p's rank file) and ``s{k}``. Replicas
  hold different residuals, so a resume needs the same compressor and number of replicas; the
  plan may change (residuals follow their weights).
- Critical set: ``step{S}-critical.npz`` (rank 0): ``pending``, the losses the current full
  pass has measured so far, and ``losses``, those of the last complete one (absent before).

The manifest names the files and the settings (``compress``, ``replicas``, ``critical_set``,
``refresh``); docs/formats.md.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from spdnn.comm.mpi import Communicator
from spdnn.errors import InputError
from spdnn.io.atomic import atomic_path
from spdnn.io.npz import NpzReader
from spdnn.lossy.compress import CompressSpec
from spdnn.lossy.critical import CriticalSet


def residual_name(step: int, replica: int, part: int) -> str:
    return f"step{step:09d}-replica{replica:04d}-rank{part:05d}.npz"


def critical_name(step: int) -> str:
    return f"step{step:09d}-critical.npz"


def _save(path: Path, arrays: dict[str, np.ndarray]) -> None:
    with atomic_path(path, "the checkpoint") as tmp, open(tmp, "wb") as fh:
        np.savez(fh, **arrays)


def write_lossy(comm: Communicator, dnet: Any, crit: CriticalSet | None, step: int,  # noqa: ANN401
                d: Path) -> dict[str, Any]:
    """Write this rank's share of the lossy state (collective over ``comm``, all ranks);
    returns the manifest's entries for it."""
    grid, sums = dnet.grid, dnet.sums
    entries: dict[str, Any] = {}
    if sums.spec.enabled:
        entries.update(compress=sums.spec.text(), compress_min_values=sums.spec.min_values,
                       replicas=grid.replicas)
        if grid.replicas > 1:
            arrays: dict[str, np.ndarray] = {}
            for layer, c in zip(dnet.layers, sums.compressors):
                if c is not None:
                    nw, k = layer.weight.nnz, layer.index
                    arrays |= {f"rw{k}": c.residual[:nw], f"rb{k}": c.residual[nw:],
                               f"s{k}": c.state}
            comm.check(lambda: _save(d / residual_name(step, grid.replica, grid.model.rank),
                                     arrays))
            entries["residual_files"] = [[residual_name(step, r, p) for p in range(grid.parts)]
                                         for r in range(grid.replicas)]
    if crit is not None:
        pending = crit.gathered(grid.data)
        arrays = {"pending": pending} | ({"losses": crit.losses}
                                         if crit.losses is not None else {})
        comm.check(lambda: _save(d / critical_name(step), arrays) if comm.rank == 0 else None)
        entries.update(critical=critical_name(step), critical_set=crit.fraction,
                       refresh=crit.refresh)
    return entries


def lossy_files(manifest: dict[str, Any]) -> list[str]:
    """The files of the lossy state a manifest names."""
    files = [f for row in manifest.get("residual_files", []) for f in row]
    return files + ([manifest["critical"]] if "critical" in manifest else [])


@dataclass(frozen=True)
class LossyState:
    """The state read back for this rank: per layer the residual and stage state (None:
    start afresh), and the critical set's losses."""

    residuals: list[np.ndarray | None]
    states: list[np.ndarray | None]
    losses: np.ndarray | None = None
    pending: np.ndarray | None = None

    def apply(self, dnet: Any, crit: CriticalSet | None) -> None:  # noqa: ANN401
        for c, r, s in zip(dnet.sums.compressors, self.residuals, self.states):
            if c is not None and r is not None and len(r) == c.n:
                c.residual[:] = r
                if s is not None:
                    c.state[:] = s
        if crit is not None and self.pending is not None:
            crit.losses = self.losses
            # The pass's losses so far are summed over the replicas at its end: one holds them.
            crit.pending[:] = self.pending if dnet.grid.replica == 0 else 0


def _changed(path: Path, what: str, then: Any, now: Any) -> InputError:  # noqa: ANN401
    return InputError(path, f"checkpoint was written with {what} {then}, this run has {now}: "
                            "resume with the same (or --resume-with-changes, which starts the "
                            "lossy state afresh)")


def load_lossy(dnet: Any, directory: str, spec: CompressSpec,  # noqa: ANN401
               crit: CriticalSet | None, allow_changes: bool = False) -> LossyState:
    """This rank's lossy state from a checkpoint that ``load_checkpoint`` accepted."""
    from spdnn.io.checkpoint_format import manifest_fields, manifest_path, positions, shard_layer

    path = manifest_path(directory)
    manifest = manifest_fields(directory)  # validated (load_checkpoint read it already)
    grid = dnet.grid
    none: list[np.ndarray | None] = [None] * dnet.n_layers
    residuals, states = list(none), list(none)
    had = (manifest.get("compress", "none"), manifest.get("replicas", grid.replicas),
           manifest.get("compress_min_values", 0))
    now = (spec.text(), grid.replicas, spec.min_values)
    if had != now and not allow_changes:
        raise _changed(path, "--compress / replicas / --compress-min-values",
                       " / ".join(map(str, had)), " / ".join(map(str, now)))
    if had == now and spec.enabled and grid.replicas > 1:
        rows = manifest.get("residual_files")
        parts = len(manifest["files"])
        if not (isinstance(rows, list) and len(rows) == grid.replicas and all(
                isinstance(r, list) and len(r) == parts and
                all(isinstance(f, str) and Path(f).name == f for f in r) for r in rows)):
            raise InputError(path, f"manifest field 'residual_files' must list {parts} file "
                                   f"names for each of {grid.replicas} replicas")
        with contextlib.ExitStack() as stack:  # closed on an error too
            def open_all(names: list[str]) -> list[NpzReader]:
                return [stack.enter_context(NpzReader(Path(directory) / f, "checkpoint"))
                        for f in names]

            weights, mine = open_all(manifest["files"]), open_all(rows[grid.replica])
            same_plan = parts == grid.parts
            for i, layer in enumerate(dnet.layers):
                k = layer.index
                shards = [shard_layer(r, k, dnet.sizes[k], dnet.sizes[k - 1]) for r in weights]
                if not any(f"rw{k}" in r.keys for r in mine):
                    continue
                rw, rb = [], []
                for r, a in zip(mine, shards):
                    for name, n in ((f"rw{k}", len(a["w"])), (f"rb{k}", len(a["b"]))):
                        v = r.get(name) if name in r.keys else np.zeros(n, dnet.dtype)
                        if v.ndim != 1 or v.dtype.kind != "f" or len(v) != n or \
                                not np.all(np.isfinite(v)):
                            raise InputError(r.path, f"'{name}' must hold {n} finite values")
                        (rw if name.startswith("rw") else rb).append(v)
                idx, bias = positions(layer, dnet.sizes[k - 1], dnet.sizes[k], shards, directory)
                residuals[i] = np.concatenate([np.concatenate(rw)[idx], np.concatenate(rb)[bias]])
                own = mine[grid.model.rank] if same_plan else None
                if own is not None and f"s{k}" in own.keys:
                    s = own.get(f"s{k}")
                    if s.shape != (4,) or s.dtype.kind != "f" or not np.all(np.isfinite(s)):
                        raise InputError(own.path, f"'s{k}' must hold 4 finite values")
                    states[i] = s
    if crit is None:
        return LossyState(residuals, states)
    had_crit = (manifest.get("critical_set"), manifest.get("refresh"))
    if had_crit != (crit.fraction, crit.refresh):
        if not allow_changes:
            raise _changed(path, "--critical-set / --refresh", " / ".join(map(str, had_crit)),
                           f"{crit.fraction} / {crit.refresh}")
        return LossyState(residuals, states)
    name = manifest.get("critical")
    if not isinstance(name, str) or Path(name).name != name:
        raise InputError(path, "manifest field 'critical' must name a file in this directory")
    with NpzReader(Path(directory) / name, "checkpoint") as r:
        arrays = {key: r.get(key) for key in ("pending", "losses") if key in r.keys}
        for key, v in arrays.items():
            if v.shape != (crit.n,) or v.dtype.kind != "f" or not np.all(np.isfinite(v)):
                raise InputError(r.path, f"'{key}' must hold {crit.n} finite values (one per "
                                         "training sample)")
        if "pending" not in arrays:
            raise InputError(r.path, "'pending' is missing")
    return LossyState(residuals, states, arrays.get("losses"), arrays["pending"])
