"""Checkpoints: a directory with ``manifest.json`` and one ``step{S}-rank{r}.npz`` per rank
(format in docs/formats.md). Rank files are written first, the manifest last, each under
a temporary name, flushed to the disk, then renamed (spdnn.io.atomic); the manifest is the
commit point, written only once every rank's files are durable, so an interrupted write or a
power loss keeps the previous checkpoint. Only finite state is written. Resume works on any
P and plan.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from spdnn.comm.mpi import AgreedError, Communicator
from spdnn.comm.processes import pid_alive
from spdnn.errors import InputError, SpdnnError
from spdnn.io.atomic import atomic_path, write_text
from spdnn.io.checkpoint_format import (
    CHECKPOINT_FORMAT,
    check_members,
    manifest_fields,
    manifest_path,
    positions,
    read_manifest,
    shard_layer,
)
from spdnn.io.npz import NpzReader
from spdnn.lossy.critical import CriticalSet
from spdnn.lossy.state import lossy_files, write_lossy
from spdnn.model.network import Layer
from spdnn.optim import SavedState
from spdnn.runtime.distributed import DistributedNetwork
from spdnn.runtime.local_layer import LocalLayer


@dataclass
class Position:
    """Where training stands: completed steps, and the batch of the epoch to run next."""

    step: int = 0
    epoch: int = 0
    batch: int = 0


def save_checkpoint(comm: Communicator, dnet: DistributedNetwork, state: SavedState,
                    pos: Position, directory: str, settings: dict[str, Any],
                    crit: CriticalSet | None = None) -> None:
    """Each rank of replica 0 writes its rows (global indices), values and the optimizer's
    ``state`` by name; with compression every rank its residuals, with a critical set rank 0
    its losses (spdnn.lossy.state); rank 0 then commits a manifest naming the files.
    Collective over ``comm`` (all ranks)."""
    d = Path(directory)
    arrays: dict[str, np.ndarray] = {}
    for i, layer in enumerate(dnet.layers):
        k = layer.index
        arrays[f"rows{k}"] = layer.rows
        arrays[f"counts{k}"] = np.diff(layer.weight.indptr)
        arrays[f"cols{k}"] = layer.global_columns()
        arrays[f"w{k}"] = layer.weight.data
        arrays[f"b{k}"] = layer.bias
        for j, part in ((2 * i, "w"), (2 * i + 1, "b")):
            for name, values in state.state[j].items():
                arrays[f"{name}.{part}{k}"] = values
    finite = all(np.all(np.isfinite(a)) for a in arrays.values() if a.dtype.kind == "f")
    if not comm.allreduce_scalar(float(finite), "min"):
        kept = (f"the last good checkpoint in {directory} is kept"
                if (d / "manifest.json").is_file() else "no checkpoint was written")
        raise AgreedError(f"weights became non-finite (NaN or Inf) by step {pos.step}: {kept} "
                          "(lower --lr?)")
    # One file per model part, written by replica 0 (replicas hold identical values).
    name = f"step{pos.step:09d}-rank{dnet.grid.model.rank:05d}.npz"
    writes = dnet.grid.replica == 0

    def write() -> None:
        if not writes:
            return
        try:
            d.mkdir(parents=True, exist_ok=True)
            with atomic_path(d / name, "the checkpoint") as tmp, open(tmp, "wb") as fh:
                np.savez(fh, **arrays)
        except OSError as exc:
            raise InputError(d / name, f"cannot write the checkpoint ({exc.strerror or exc})"
                             ) from None

    comm.check(write)
    lossy = write_lossy(comm, dnet, crit, pos.step, d)
    comm.check(lambda: _commit(d, pos, dnet.grid.parts, dnet,
                               {**settings, **lossy, "optimizer_steps": state.steps})
               if comm.rank == 0 else None)
    # The commit's agreement (an all-gather) is the last synchronisation: no barrier after it.


def network_functions(dnet: DistributedNetwork) -> dict[str, Any]:
    """What the network computes beyond its pattern (the fingerprint's): the hidden layers'
    activations, ReLU's cap and the output layer's activation."""
    return {"activations": [a.spec for a in dnet.activations],
            "cap": "none" if dnet.cap is None else float(dnet.cap),
            "output_activation": dnet.output_activation}


def _commit(d: Path, pos: Position, nparts: int, dnet: DistributedNetwork,
            settings: dict[str, Any]) -> None:
    """Rank 0: write the manifest naming the rank files (the commit point), then remove the
    rank files no manifest names any more."""
    manifest = {
        "format": CHECKPOINT_FORMAT, "step": pos.step, "epoch": pos.epoch,
        "batch": pos.batch, "nparts": nparts, "fingerprint": dnet.fingerprint,
        **network_functions(dnet), "dtype": str(dnet.dtype), "n_layers": dnet.n_layers,
        **settings,
        "files": [f"step{pos.step:09d}-rank{r:05d}.npz" for r in range(nparts)],
    }
    write_text(d / "manifest.json", json.dumps(manifest, indent=2) + "\n",
               "the checkpoint manifest")
    # Rank files of earlier checkpoints, and any a killed run left behind, are no longer
    # named by the manifest (the directory is locked by this run: no other writer).
    named = set(manifest["files"]) | set(lossy_files(manifest))
    for f in [*d.glob("step*-rank*.npz"), *d.glob("step*-critical.npz")]:
        if f.name not in named and f.is_file():
            f.unlink(missing_ok=True)


# The temporaries a killed run of spdnn leaves here (spdnn.io.atomic.temporary names them
# ``.NAME.XXXXXXXX.tmp``): the manifest's and the rank, residual and critical-set files'.
_OUR_TEMPORARY = re.compile(r"\.(manifest\.json|step\d{9}-(rank\d{5}|replica\d{4}-rank\d{5}"
                            r"|critical)\.npz)\.[A-Za-z0-9_]+\.tmp")

# Seconds a takeover waits between reading a stale lock and replacing it (tests widen the race).
_TAKEOVER_PAUSE = 0.0


def take_lock(d: Path) -> bool:
    """Create ``d/lock`` holding this host and process id, or take over one whose process has
    ended on this host; refuse (one line) a lock held by a live run. The whole of it runs
    under ``flock`` on the directory, so of two runs that find the same stale lock exactly one
    takes it. Returns whether ``d`` was created."""
    created = not d.exists()
    d.mkdir(parents=True, exist_ok=True)
    fd = os.open(d, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):  # a file system without locks: best effort
            fcntl.flock(fd, fcntl.LOCK_EX)
        _take(d / "lock")
    finally:
        os.close(fd)  # releases the flock
    for tmp in d.glob(".*.tmp"):
        if _OUR_TEMPORARY.fullmatch(tmp.name):  # a user's own .tmp files stay
            tmp.unlink(missing_ok=True)
    return created


def _take(lock: Path) -> None:
    for _ in range(3):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if not _stale(lock):
                _refuse(lock)
            time.sleep(_TAKEOVER_PAUSE)
            lock.unlink(missing_ok=True)  # the dead run's: no starter can take it meanwhile
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(f"{socket.gethostname()} {os.getpid()}\n")
            fh.flush()
            os.fsync(fh.fileno())
        return
    raise InputError(lock, "could not take the lock")


def _holder(lock: Path) -> tuple[str, str]:
    try:
        host, _, pid = lock.read_text(errors="replace").strip().partition(" ")
    except FileNotFoundError:
        return "", ""
    return host, pid


def _stale(lock: Path) -> bool:
    """The lock names a process of this host that no longer runs (or is gone)."""
    if not lock.exists():
        return True
    host, pid = _holder(lock)
    return host == socket.gethostname() and pid.isdigit() and not pid_alive(int(pid))


def _refuse(lock: Path) -> None:
    host, pid = _holder(lock)
    raise InputError(lock, f"another run (process {pid or '?'} on {host or '?'}) uses this "
                           "checkpoint directory; if it has ended, remove the lock file")


@contextlib.contextmanager
def directory_lock(comm: Communicator, directory: str) -> Iterator[None]:
    """Hold ``DIRECTORY/lock`` (host and process id of rank 0) while a run writes checkpoints
    there: a second live run is refused; a lock left by a process that no longer runs on this
    host is taken over, and temporary files left by a killed run are removed."""
    d = Path(directory)
    lock = d / "lock"

    created = comm.check(lambda: take_lock(d) if comm.rank == 0 else False)
    release = lambda: lock.unlink(missing_ok=True)  # noqa: E731
    comm.before_timeout_abort(release)  # a job ended by --comm-timeout leaves no lock
    try:
        yield
    finally:
        comm.before_timeout_abort(release, add=False)
        if comm.rank == 0:
            lock.unlink(missing_ok=True)
            if created and d.is_dir() and not any(d.iterdir()):
                d.rmdir()


def load_checkpoint(dnet: DistributedNetwork, directory: str, settings: dict[str, Any],
                    allow_changes: bool = False) -> tuple[Position, SavedState | None]:
    """Fill my rows (any P and plan) from a checkpoint written by a run with the same
    ``settings`` and dtype (or other ones, with ``allow_changes``: a changed batch size then
    resumes at the batch holding the first sample not yet seen in the epoch; another
    optimizer starts from fresh state); returns the position and the optimizer's state (None
    when it starts afresh)."""
    settings = {**settings, "dtype": str(dnet.dtype)}
    manifest = read_manifest(directory, dnet.fingerprint, settings, allow_changes,
                             network_functions(dnet))
    state: list[dict[str, np.ndarray]] = []
    with contextlib.ExitStack() as stack:  # closed on an error too
        readers = [stack.enter_context(NpzReader(Path(directory) / f, "checkpoint"))
                   for f in manifest["files"]]
        for r in readers:
            check_members(r, dnet.n_layers)
        for layer in dnet.layers:
            k = layer.index
            shards = [shard_layer(r, k, dnet.sizes[k], dnet.sizes[k - 1]) for r in readers]
            held = {key for key in shards[0] if "." in key} if shards else set()
            if any({key for key in a if "." in key} != held for a in shards):
                raise InputError(directory, f"the rank files hold different optimizer state "
                                            f"for layer {k}")
            _check_state(manifest, {key[:-2] for key in held}, k, directory)
            idx, bias = positions(layer, dnet.sizes[k - 1], dnet.sizes[k], shards, directory)
            layer.weight.data[:] = np.concatenate([a["w"] for a in shards])[idx]
            layer.bias[:] = np.concatenate([a["b"] for a in shards])[bias]
            for part, where in (("w", idx), ("b", bias)):
                state.append({key[:-2]: np.concatenate([a[key] for a in shards])[where].astype(
                    dnet.dtype) for key in sorted(held) if key.endswith("." + part)})
    dnet.weights_updated()  # the products' bfloat16 copies of the weights read
    batch = manifest["batch"]
    old_size, new_size = manifest.get("batch_size"), settings.get("batch_size")
    if isinstance(old_size, int) and old_size > 0 and new_size and old_size != new_size:
        batch = batch * old_size // new_size
    name = manifest["optimizer"]
    saved = None if name != settings.get("optimizer", name) else \
        SavedState(name, manifest.get("optimizer_steps", manifest["step"]), state)
    return Position(manifest["step"], manifest["epoch"], batch), saved


def _check_state(manifest: dict[str, Any], names: set[str], k: int, directory: str) -> None:
    """The state arrays layer k's rank files hold are those the manifest's optimizer keeps
    once it has stepped (its ``kept_state`` under the manifest's settings)."""
    from spdnn.optim import OPTIMIZERS

    name = manifest["optimizer"]
    if manifest["format"] == "spdnn-checkpoint/1":  # SGD, its momentum not recorded
        keeps = names & set(OPTIMIZERS[name].STATE)
    else:
        keeps = OPTIMIZERS[name].kept_state(manifest)
    if manifest.get("optimizer_steps", manifest["step"]) == 0:
        keeps = names & keeps  # no step taken: no state yet
    if names != keeps:
        raise InputError(manifest_path(directory),
                         f"layer {k}: the rank files hold optimizer state "
                         f"{', '.join(sorted(names)) or 'none'}, but {name} keeps "
                         f"{', '.join(sorted(keeps)) or 'none'}")


def check_position(position: Position, directory: str, batch_size: int, max_steps: int | None,
                   n_samples: int) -> None:
    """A resumed position must lie inside this run: a batch of the epoch, below --max-steps."""
    per_epoch = -(-n_samples // batch_size)
    if position.batch >= per_epoch:
        raise InputError(manifest_path(directory), f"batch {position.batch} is beyond the "
                                                   f"{per_epoch} batches of an epoch")
    written_with = manifest_fields(directory).get("batch_size")
    if written_with == batch_size and position.step > (position.epoch + 1) * per_epoch:
        raise InputError(manifest_path(directory), f"step {position.step} at epoch "
                                                   f"{position.epoch} is more steps than "
                                                   f"{position.epoch + 1} epoch(s) of "
                                                   f"{per_epoch} batches hold")
    if max_steps is not None and max_steps < position.step:
        raise SpdnnError(f"--max-steps {max_steps} is below the checkpoint's step "
                         f"{position.step}: nothing would run")


def adopt_topology(dnet: DistributedNetwork, directory: str) -> None:
    """Rebuild my layers with the patterns a checkpoint holds (those its run's updates reached;
    any P and plan wrote it), their values left for ``load_checkpoint`` to fill."""
    with contextlib.ExitStack() as stack:
        files = manifest_fields(directory)["files"]
        readers = [stack.enter_context(NpzReader(Path(directory) / f, "checkpoint"))
                   for f in files]
        for i, layer in enumerate(dnet.layers):
            k = layer.index
            n_in = dnet.sizes[k - 1]
            shards = [shard_layer(r, k, dnet.sizes[k], n_in) for r in readers]
            rows = np.concatenate([np.repeat(a["rows"].astype(np.int64), a["counts"])
                                   for a in shards])
            cols = np.concatenate([a["cols"].astype(np.int64) for a in shards])
            local = np.full(dnet.sizes[k], -1, dtype=np.int64)
            local[layer.rows] = np.arange(len(layer.rows))
            mine = local[rows] >= 0
            keys = np.sort(local[rows[mine]] * n_in + cols[mine])
            if len(np.unique(keys)) != len(keys):
                raise InputError(directory, f"layer {k}: a connection is listed twice")
            w = layer.weight
            indptr = np.concatenate([[0], np.cumsum(np.bincount(keys // n_in,
                                                                minlength=len(layer.rows)))])
            pattern = Layer(sp.csr_matrix((np.zeros(len(keys), w.dtype),
                                           (keys % n_in).astype(w.indices.dtype),
                                           indptr.astype(w.indptr.dtype)),
                                          shape=(len(layer.rows), n_in)), layer.bias)
            rebuilt = LocalLayer.build(dnet.comm, dnet.plan, k, pattern)
            ex_old, ex_new = layer.exchange, rebuilt.exchange
            ex_new.mode, ex_new.cap, ex_new.masked = ex_old.mode, ex_old.cap, ex_old.masked
            dnet.layers[i] = rebuilt
    pool: dict = {}
    for layer in dnet.layers:
        layer.exchange.share_buffers(pool)
    dnet.topology_changed()
