"""What a run exchanged and where its time went: counted traffic beside the plan's prediction,
and per-layer timers. Tables for rank 0 and dicts for ``--metrics-out``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from spdnn.comm.mpi import Communicator
from spdnn.model.plan import Plan
from spdnn.model.records import (
    CountedTraffic,
    GradientSumSeconds,
    LayerTraffic,
    PassSeconds,
    TimingReport,
    TrafficReport,
)
from spdnn.runtime.halo import Traffic

_TIMERS = ("compute", "comm", "wait")


class Timers:
    """Seconds per layer (column k-1) in compute, in packing/posting messages (``comm``) and
    waiting for them; row 0 forward, row 1 backward."""

    def __init__(self, n_layers: int) -> None:
        self.compute = np.zeros((2, n_layers))
        self.comm = np.zeros((2, n_layers))
        self.wait = np.zeros((2, n_layers))
        self.grad_post = np.zeros(n_layers)  # starting the gradient sums over replicas
        self.grad_wait = np.zeros(n_layers)  # waiting for them after the backward pass
        self.grad_select = np.zeros(n_layers)  # compressing them (part of grad_post)

    def add(self, direction: str, i: int, compute: float = 0.0, comm: float = 0.0,
            wait: float = 0.0) -> None:
        row = 0 if direction == "forward" else 1
        self.compute[row, i] += compute
        self.comm[row, i] += comm
        self.wait[row, i] += wait


def plan_volume(comm: Communicator, plan: Plan, ghost_rows: Sequence[int]
                ) -> tuple[np.ndarray, np.ndarray, str]:
    """Rows per pass of each layer, forward and backward: the plan's own statistics (computed
    by the partitioner from the whole network) when it has them, else the sum over the ranks
    of the ghost rows each schedule receives. The last item names the source."""
    n = len(ghost_rows)
    stats = plan.meta.get("stats") if isinstance(plan.meta.get("stats"), dict) else {}
    fwd, bwd = stats.get("forward"), stats.get("backward")
    if all(isinstance(v, list) and len(v) == n and all(isinstance(x, int) for x in v)
           for v in (fwd, bwd)):
        return np.array(fwd, dtype=np.int64), np.array(bwd, dtype=np.int64), "plan"
    forward = comm.allreduce(np.array(ghost_rows, dtype=np.int64))
    backward = forward.copy()
    backward[:1] = 0  # no fold into the inputs
    return forward, backward, "schedule"


def _ints(a: np.ndarray) -> tuple[int, ...]:
    return tuple(int(v) for v in a)


def accounting(comm: Communicator, traffic: Traffic, volume: tuple[np.ndarray, np.ndarray, str],
               itemsize: int, data: Communicator | None = None,
               predicted: dict[str, np.ndarray] | None = None,
               forward_itemsize: int | None = None) -> TrafficReport:
    """Counted rows and bytes (all ranks) beside the prediction, per layer and direction:
    rows = volume_k x passes, bytes = volume_k x samples x item size, passes and samples
    summed over the replicas (``data``); and the values each rank put into the gradient sums
    over the replicas. ``predicted``: rows and bytes per layer as the schedules in force
    predicted them, topology by topology (a job whose topology changed).
    ``forward_itemsize``: the rows' item size forward when not ``itemsize`` (bfloat16's 2:
    the partial sums folded backward stay float32)."""
    forward, backward, source = volume
    t = traffic.total(comm, data)
    pred = predicted or {
        "forward_rows": forward * t.forward_passes,
        "forward_bytes": forward * t.forward_samples * (forward_itemsize or itemsize),
        "backward_rows": backward * t.backward_passes,
        "backward_bytes": backward * t.backward_samples * itemsize,
    }
    counted = {k: getattr(t, k) for k in pred}
    equal = all(np.array_equal(counted[k], pred[k]) for k in pred)
    return TrafficReport(
        counted=CountedTraffic(**{k: _ints(v) for k, v in counted.items()},
                               forward_sent=_ints(t.forward_sent),
                               backward_sent=_ints(t.backward_sent),
                               forward_messages=_ints(t.forward_messages),
                               backward_messages=_ints(t.backward_messages)),
        predicted=LayerTraffic(**{k: _ints(v) for k, v in pred.items()}),
        equal=bool(equal), plan_volume_rows=int(forward.sum() + backward.sum()),
        predicted_from=source,  # type: ignore[arg-type]
        gradient_sum_values=_ints(t.grad_values), gradient_sum_bytes=_ints(t.grad_bytes),
        gradient_sum_selected=_ints(t.grad_selected),
        gradient_sum_considered=_ints(t.grad_considered))


def format_accounting(acc: TrafficReport) -> str:
    c, p = acc.counted, acc.predicted
    lines = ["layer  forward rows (counted/plan)  backward rows (counted/plan)  "
             "MB as dense rows / MB sent"]
    for k in range(len(c.forward_rows)):
        mb = (c.forward_bytes[k] + c.backward_bytes[k]) / 1e6
        sent = (c.forward_sent[k] + c.backward_sent[k]) / 1e6
        lines.append(f"{k + 1:5d}  {c.forward_rows[k]:>12,} / {p.forward_rows[k]:<12,}"
                     f"  {c.backward_rows[k]:>12,} / {p.backward_rows[k]:<12,}"
                     f"  {mb:9.2f} / {sent:.2f}")
    dense = sum(c.forward_bytes) + sum(c.backward_bytes)
    sent = sum(c.forward_sent) + sum(c.backward_sent)
    verdict = "equal" if acc.equal else "DIFFERENT"
    ratio = f" ({dense / sent:.2f}x fewer)" if sent else ""
    lines.append(f"the plan's rows are {dense / 1e6:,.2f} MB as dense rows in all passes "
                 f"(training and evaluation); {sent / 1e6:,.2f} MB were sent{ratio}. Counted "
                 f"rows and dense bytes are {verdict} to the plan's volume x passes (x batch x "
                 "item size)")
    return "\n".join(lines)


def format_traffic(acc: TrafficReport, parts: int, replicas: int) -> str:
    """The traffic table (none with one model part: nothing crosses ranks on that axis) and
    the gradient sums over replicas."""
    lines = [format_accounting(acc) if parts > 1 else "1 model part: no rows exchanged"]
    if any(acc.gradient_sum_values):
        line = (f"gradient sums over {replicas} replicas: "
                f"{sum(acc.gradient_sum_values):,} values put in, "
                f"{sum(acc.gradient_sum_bytes) / 1e6:,.1f} MB")
        considered = sum(acc.gradient_sum_considered)
        if considered:
            line += (f" (compressed: {sum(acc.gradient_sum_selected):,} of {considered:,} "
                     "values sent, with their positions)")
        lines.append(line)
    return "\n".join(lines)


def timing(comm: Communicator, timers: Timers) -> TimingReport:
    """Per-layer seconds in compute, message packing/posting and waiting, and in starting the
    gradient sums over replicas (plus the wait for them), max over ranks."""
    def slowest(a: np.ndarray) -> tuple[float, ...]:
        return tuple(float(v) for v in comm.allreduce(a, "max"))

    passes = {name: PassSeconds(forward=slowest(getattr(timers, name)[0]),
                                backward=slowest(getattr(timers, name)[1])) for name in _TIMERS}
    return TimingReport(**passes, gradient_sum=GradientSumSeconds(
        post=slowest(timers.grad_post), select=slowest(timers.grad_select),
        wait=slowest(timers.grad_wait)))


def format_timing(tm: TimingReport) -> str:
    gs = tm.gradient_sum
    replicas = any(gs.post)
    lines = ["layer  forward compute/post/wait (s)   backward compute/post/wait (s)"
             + ("   gradient sum post/wait (s)" if replicas else "")]
    for k in range(len(tm.compute.forward)):
        f = [getattr(tm, n).forward[k] for n in _TIMERS]
        b = [getattr(tm, n).backward[k] for n in _TIMERS]
        line = (f"{k + 1:5d}  {f[0]:9.3f} {f[1]:7.3f} {f[2]:7.3f}     "
                f"{b[0]:9.3f} {b[1]:7.3f} {b[2]:7.3f}")
        if replicas:
            line += f"     {gs.post[k]:9.3f} {gs.wait[k]:7.3f}"
        lines.append(line)
    return "\n".join(lines)


@dataclass(frozen=True, kw_only=True)
class Counters:
    """What a rank has moved so far, per axis: the exchange between the parts of a replica
    (model axis: values of the rows carried, bytes sent) and the gradient sums between the
    replicas (data axis: values, indices included when compressed, and bytes); with the
    compressors' selected / considered values and their selection time."""

    sent: float
    model_values: float
    gradient_values: float
    gradient_bytes: float
    selected: float
    considered: float
    select_seconds: float

    @staticmethod
    def now(dnet: Any) -> Counters:  # noqa: ANN401 (a DistributedNetwork; no import cycle)
        t, item = dnet.traffic, dnet.dtype.itemsize
        return Counters(sent=float(t.bytes_sent),
                        model_values=float(t.forward_bytes.sum() + t.backward_bytes.sum()) / item,
                        gradient_values=float(t.grad_values.sum()),
                            gradient_bytes=float(t.grad_bytes.sum()),
                        selected=float(t.grad_selected.sum()),
                            considered=float(t.grad_considered.sum()),
                        select_seconds=float(dnet.timers.grad_select.sum()))

    def minus(self, other: Counters) -> Counters:
        return Counters(**{f.name: getattr(self, f.name) - getattr(other, f.name)
                           for f in fields(self)})

    def total(self, comm: Communicator) -> Counters:
        """Summed over the ranks of ``comm``; the selection time is the slowest rank's."""
        names = [f.name for f in fields(self) if f.name != "select_seconds"]
        summed = comm.allreduce(np.array([getattr(self, n) for n in names]))
        return Counters(**dict(zip(names, summed.tolist())),
                        select_seconds=comm.allreduce_scalar(self.select_seconds, "max"))

    def ratio(self, spec: Any) -> float | None:  # noqa: ANN401 (a CompressSpec)
        """Achieved compression ratio: selected / considered values (None: no compression)."""
        return self.selected / self.considered if spec.enabled and self.considered else None
