"""The MPI runtime: distributed SGD, inference, checkpoints, accounting.

Every function takes the communicator explicitly. Sample order, losses and the optimizer are
those of spdnn.reference, so P ranks compute what one process computes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from . import kernels
from .atomic import atomic_path, write_text
from .bundle import NetworkBundle, NpzReader, save_network
from .comm import AgreedError, Communicator
from .datasets import Dataset
from .distributed import DistributedNetwork
from .errors import InputError, SpdnnError
from .network import Layer, Network
from .plan import Plan, load_plan, plan_statistics
from .reference import SGD, SGDConfig, batch_order, batches

CHECKPOINT_FORMAT = "spdnn-checkpoint/1"


# --------------------------------------------------------------------------- set-up


def single_rank_plan(sizes: tuple[int, ...], fingerprint: str) -> Plan:
    return Plan(1, tuple(np.zeros(n, dtype=np.int32) for n in sizes),
                {"method": "single", "fingerprint": fingerprint})


def open_network(comm: Communicator, network: str, plan_path: str | None,
                 dtype: Any = None) -> tuple[NetworkBundle, Plan, DistributedNetwork]:
    """Open the bundle and plan on every rank, check they fit this job, load my rows."""
    bundle = comm.check(lambda: NetworkBundle(network))
    fingerprint = bundle.fingerprint()

    def get_plan() -> Plan:
        if plan_path is None:
            if comm.size > 1:
                raise SpdnnError(f"--plan is required with {comm.size} ranks "
                                 "(make one with spdnn-partition)")
            return single_rank_plan(bundle.sizes, fingerprint)
        plan = load_plan(plan_path)
        if plan.nparts != comm.size:
            raise InputError(plan_path, f"plan is for P={plan.nparts} ranks but this job has "
                                        f"{comm.size} (mpirun -n {plan.nparts})")
        plan.check_for(bundle.sizes, fingerprint, plan_path)
        return plan

    plan = comm.check(get_plan)
    dnet = comm.check(lambda: DistributedNetwork.load(bundle, plan, comm, dtype))
    kernels.warm_up()
    return bundle, plan, dnet


def local_inputs(dnet: DistributedNetwork, x: np.ndarray, source: str) -> np.ndarray:
    """This rank's feature columns of a (samples x features) array, C-contiguous."""
    if x.shape[1] != dnet.sizes[0]:
        raise InputError(source, f"data has {x.shape[1]} features but the network's layer 0 "
                                 f"has {dnet.sizes[0]} neurons")
    return np.ascontiguousarray(x[:, dnet.input_rows], dtype=dnet.dtype)


# --------------------------------------------------------------------------- training


@dataclass(frozen=True)
class TrainConfig:
    epochs: int
    batch_size: int
    sgd: SGDConfig
    seed: int = 0
    shuffle: bool = True
    loss: str = "cross_entropy"
    max_steps: int | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None


@dataclass(frozen=True)
class EpochReport:
    epoch: int
    steps: int
    loss: float
    train_accuracy: float
    test_accuracy: float | None
    seconds: float
    samples_per_second: float
    megabytes_sent: float


@dataclass
class Position:
    """Where training stands: completed steps, and the batch to run next."""

    step: int = 0
    epoch: int = 0
    batch: int = 0


def evaluate(dnet: DistributedNetwork, x_local: np.ndarray, y: np.ndarray,
             batch_size: int = 1024) -> float:
    correct = 0
    for start in range(0, len(y), batch_size):
        x0 = np.ascontiguousarray(x_local[start:start + batch_size].T)
        ws = dnet.forward(x0)
        pred = dnet.predict_classes(dnet.output(ws.zs[-1]))
        correct += int(np.sum(pred == y[start:start + batch_size]))
    return correct / len(y) if len(y) else float("nan")


def train(comm: Communicator, dnet: DistributedNetwork, data: Dataset, cfg: TrainConfig,
          position: Position | None = None, optimizer_state: list | None = None,
          on_epoch: Callable[[EpochReport], None] | None = None,
          on_step: Callable[[int, int], None] | None = None) -> list[EpochReport]:
    """Minibatch SGD; returns one report per epoch run (all ranks get the same reports)."""
    pos = position or Position()
    opt = SGD(cfg.sgd, dnet.parameters(), optimizer_state or [])
    x_local = local_inputs(dnet, data.x_train, data.name)
    xt_local = local_inputs(dnet, data.x_test, data.name) if data.x_test is not None else None
    reports = []
    n = len(data.y_train)
    n_batches = (n + cfg.batch_size - 1) // cfg.batch_size
    while pos.epoch < cfg.epochs:
        t0 = time.perf_counter()
        sent0 = int(dnet.traffic.forward_bytes.sum() + dnet.traffic.backward_bytes.sum())
        total_loss, correct, seen, steps = 0.0, 0, 0, 0
        order = batch_order(n, pos.epoch, cfg.seed, cfg.shuffle)
        for b, idx in enumerate(batches(order, cfg.batch_size)):
            if b < pos.batch:
                continue  # resumed mid-epoch: these batches were done before
            x0 = np.ascontiguousarray(x_local[idx].T)
            ws = dnet.forward(x0)
            value, ok, gw, gb = dnet.backward(ws, data.y_train[idx], cfg.loss)
            if not np.isfinite(value):
                kept = (f"; the last good checkpoint is kept in {cfg.checkpoint_dir}"
                        if cfg.checkpoint_dir else "")
                raise AgreedError(f"non-finite loss ({value}) at epoch {pos.epoch + 1}, step "
                                  f"{pos.step + 1}: training stopped (lower --lr?){kept}")
            opt.step([a for pair in zip(gw, gb) for a in pair])
            dnet.sync()
            total_loss += value * len(idx)
            correct += ok
            seen += len(idx)
            steps += 1
            pos.step += 1
            pos.batch = b + 1
            if pos.batch == n_batches:
                pos.epoch, pos.batch = pos.epoch + 1, 0
            if on_step:
                on_step(b + 1, n_batches)
            stop = cfg.max_steps is not None and pos.step >= cfg.max_steps
            if cfg.checkpoint_dir and cfg.checkpoint_every and \
                    pos.step % cfg.checkpoint_every == 0 and not stop:
                save_checkpoint(comm, dnet, opt, pos, cfg.checkpoint_dir)
            if stop:
                break
        seconds = comm.max_scalar(time.perf_counter() - t0)
        sent = comm.sum_scalar(float(dnet.traffic.forward_bytes.sum()
                                     + dnet.traffic.backward_bytes.sum() - sent0))
        test = evaluate(dnet, xt_local, data.y_test) if xt_local is not None else None
        epoch_done = pos.epoch if pos.batch == 0 else pos.epoch + 1
        report = EpochReport(epoch_done, pos.step, total_loss / max(seen, 1),
                             correct / max(seen, 1), test, seconds,
                             seen / max(seconds, 1e-12), sent / 1e6)
        reports.append(report)
        if on_epoch:
            on_epoch(report)
        if cfg.max_steps is not None and pos.step >= cfg.max_steps:
            break
    if cfg.checkpoint_dir:
        save_checkpoint(comm, dnet, opt, pos, cfg.checkpoint_dir)
    return reports


# --------------------------------------------------------------------------- accounting


def accounting(comm: Communicator, dnet: DistributedNetwork, bundle: NetworkBundle
               ) -> dict[str, Any]:
    """Counted rows and bytes (all ranks) beside the plan's prediction, per layer and direction.

    Predicted rows of layer k = plan volume_k x passes; bytes = volume_k x samples x item size.
    """
    from .plan import network_patterns

    stats = plan_statistics(network_patterns(bundle), dnet.plan.owners, dnet.plan.nparts)
    t = dnet.traffic.total(comm)
    item = dnet.dtype.itemsize
    pred = {
        "forward_rows": np.array(stats.forward) * t.forward_passes,
        "forward_bytes": np.array(stats.forward) * t.forward_samples * item,
        "backward_rows": np.array(stats.backward) * t.backward_passes,
        "backward_bytes": np.array(stats.backward) * t.backward_samples * item,
    }
    counted = {k: getattr(t, k) for k in pred}
    equal = all(np.array_equal(counted[k], pred[k]) for k in pred)
    return {"counted": {k: v.tolist() for k, v in counted.items()},
            "predicted": {k: v.tolist() for k, v in pred.items()},
            "equal": bool(equal), "plan_volume_rows": stats.volume}


def format_accounting(acc: dict[str, Any]) -> str:
    c, p = acc["counted"], acc["predicted"]
    lines = ["layer  forward rows (counted/plan)  backward rows (counted/plan)  MB sent"]
    for k in range(len(c["forward_rows"])):
        mb = (c["forward_bytes"][k] + c["backward_bytes"][k]) / 1e6
        lines.append(f"{k + 1:5d}  {c['forward_rows'][k]:>12,} / {p['forward_rows'][k]:<12,}"
                     f"  {c['backward_rows'][k]:>12,} / {p['backward_rows'][k]:<12,}"
                     f"  {mb:9.2f}")
    total = sum(c["forward_bytes"]) + sum(c["backward_bytes"])
    verdict = "equal" if acc["equal"] else "DIFFERENT"
    lines.append(f"exchanged {total / 1e6:,.2f} MB in all; counted rows and bytes are "
                 f"{verdict} to the plan's volume x passes (x batch x item size)")
    return "\n".join(lines)


def timing(comm: Communicator, dnet: DistributedNetwork) -> dict[str, Any]:
    """Per-layer seconds in compute, message packing/posting and waiting, max over ranks."""
    t = dnet.timers
    return {name: {"forward": comm.allreduce_max(getattr(t, name)[0].copy()).tolist(),
                   "backward": comm.allreduce_max(getattr(t, name)[1].copy()).tolist()}
            for name in ("compute", "comm", "wait")}


def format_timing(tm: dict[str, Any]) -> str:
    lines = ["layer  forward compute/post/wait (s)   backward compute/post/wait (s)"]
    for k in range(len(tm["compute"]["forward"])):
        f = [tm[n]["forward"][k] for n in ("compute", "comm", "wait")]
        b = [tm[n]["backward"][k] for n in ("compute", "comm", "wait")]
        lines.append(f"{k + 1:5d}  {f[0]:9.3f} {f[1]:7.3f} {f[2]:7.3f}     "
                     f"{b[0]:9.3f} {b[1]:7.3f} {b[2]:7.3f}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- inference


@dataclass(frozen=True)
class ChallengeRun:
    categories: np.ndarray
    seconds: float
    n_inputs: int
    edges: int

    @property
    def rate(self) -> float:
        return self.n_inputs * self.edges / max(self.seconds, 1e-12)


def challenge_infer(comm: Communicator, dnet: DistributedNetwork, images: sp.csr_matrix,
                    edges: int) -> ChallengeRun:
    """Graph Challenge inference (hidden activation and cap on every layer); samples whose
    activation column died are dropped on every rank alike (when no bias is positive, a zero
    column stays zero)."""
    batch = images.shape[0]
    layers = dnet.layers
    xbuf = np.zeros((layers[0].n_owned_prev + layers[0].exchange.n_ghost, batch), dnet.dtype)
    xbuf[: layers[0].n_owned_prev] = images[:, dnet.input_rows].T.toarray()
    ids = np.arange(batch)
    can_drop = comm.max_scalar(max((float(lay.bias.max(initial=0)) for lay in layers),
                                   default=0.0)) <= 0
    comm.barrier()
    t0 = time.perf_counter()
    for i, layer in enumerate(layers):
        n = len(layer.rows)
        ghosts = layers[i + 1].exchange.n_ghost if i + 1 < len(layers) else 0
        nxt = np.empty((n + ghosts, xbuf.shape[1]), dnet.dtype)
        z = np.empty((n, xbuf.shape[1]), dnet.dtype)
        flags = np.zeros(xbuf.shape[1], dtype=np.int32)
        dnet.forward_layer(i, xbuf, z, nxt[:n], flags if can_drop else None)
        xbuf = nxt
        if can_drop:
            alive = (comm.allreduce_max(flags) if comm.size > 1 else flags) > 0
            kept = int(alive.sum())
            # Dead columns stay zero, so they can ride along until enough died that a copy
            # pays for itself.
            if kept <= 0.75 * len(alive):
                keep = np.flatnonzero(alive)
                compact = np.empty((xbuf.shape[0], kept), dnet.dtype)
                np.take(xbuf[:n], keep, axis=1, out=compact[:n])
                xbuf, ids = compact, ids[keep]
    seconds = comm.max_scalar(time.perf_counter() - t0)
    n = len(layers[-1].rows)
    final = comm.allreduce_max(np.any(xbuf[:n] != 0, axis=0).astype(np.int32)) > 0
    return ChallengeRun(np.sort(ids[final] + 1), seconds, batch, edges)


# --------------------------------------------------------------------------- save


def gather_network(comm: Communicator, dnet: DistributedNetwork) -> Network | None:
    """The whole network on rank 0 (None elsewhere), layer by layer."""
    layers = []
    for layer in dnet.layers:
        w = layer.weight
        part = (layer.rows, np.diff(w.indptr), layer.global_columns(), w.data, layer.bias)
        parts = comm.gather(part)
        if comm.rank == 0:
            rows = np.concatenate([p[0] for p in parts])
            counts = np.concatenate([p[1] for p in parts])
            cols = np.concatenate([p[2] for p in parts])
            data = np.concatenate([p[3] for p in parts])
            bias = np.concatenate([p[4] for p in parts])
            n_out, n_in = dnet.sizes[layer.index], dnet.sizes[layer.index - 1]
            m = sp.csr_matrix((data, (np.repeat(rows, counts), cols)), shape=(n_out, n_in))
            m.sort_indices()
            b = np.empty(n_out, dtype=bias.dtype)
            b[rows] = bias
            layers.append(Layer(m, b))
    if comm.rank != 0:
        return None
    return Network(tuple(layers), dnet.meta["activation"], dnet.meta["cap"],
                   dnet.meta["output_activation"])


def save_trained(comm: Communicator, dnet: DistributedNetwork, path: str,
                 extra: dict[str, Any]) -> None:
    net = gather_network(comm, dnet)
    if net is not None:
        net = Network(net.layers, net.activation, net.cap, net.output_activation, extra)
    comm.check(lambda: save_network(net, path) if net is not None else None)


# --------------------------------------------------------------------------- checkpoints


def save_checkpoint(comm: Communicator, dnet: DistributedNetwork, opt: SGD, pos: Position,
                    directory: str) -> None:
    """Each rank writes its rows (global indices) and momentum; rank 0 then commits a
    manifest naming them. Files are written under temporary names and renamed; the manifest
    is the commit point, so an interrupted write leaves the previous checkpoint intact."""
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
            if opt.buffers[j] is not None:
                arrays[f"{name}{k}"] = opt.buffers[j]
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
            "batch": pos.batch, "nparts": comm.size, "fingerprint": dnet.plan.fingerprint,
            "dtype": str(dnet.dtype), "n_layers": dnet.n_layers,
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
    except (OSError, ValueError):
        return []


def read_manifest(directory: str, fingerprint: str) -> dict[str, Any]:
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
    for f in manifest["files"]:
        if not (Path(directory) / f).is_file():
            raise InputError(Path(directory) / f, "checkpoint file listed in the manifest is "
                                                  "missing")
    return manifest


def load_checkpoint(comm: Communicator, dnet: DistributedNetwork, directory: str
                    ) -> tuple[Position, list]:
    """Fill my rows (any P and plan) from a checkpoint; returns the position and momentum."""
    manifest = read_manifest(directory, dnet.plan.fingerprint or "")
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


def write_json(comm: Communicator, path: str | None, payload: dict[str, Any]) -> None:
    if path:
        comm.check(lambda: write_text(path, json.dumps(payload, indent=2, sort_keys=True,
                                                        default=float) + "\n")
                   if comm.rank == 0 else None)


def report_dict(r: EpochReport) -> dict[str, Any]:
    return asdict(r)

