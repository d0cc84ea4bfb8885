"""Predicted time of a training step and of an inference batch on a grid of model parts x
replicas, from a ``Workload`` (what each rank computes and sends) and a machine (calibration,
optionally a cluster description: ``spdnn.cost.cluster.Machine``). No MPI: a replay of the
runtime's schedule, one clock per rank of a replica, layer by layer:

- forward: post the expand (per message a software cost, and the packing of the rows), compute
  the owned-column product while the messages travel (latency + bytes / bandwidth, one
  sender's messages one after another, a receiver's bytes through its own link), wait for the
  last one, compute the ghost-column product fused with the activation. Between ranks of one
  node a CPU copies the bytes (shared memory, inside the MPI calls made between chunks of
  work): the receiver's work grows by the message's ping-pong time instead of overlapping it
  (charging both ends, as before 2026-11-24, over-predicted every 2 x 1 case by 20-35%);
- loss: the small all-reduces over the parts (every clock meets there);
- backward: the ghost rows' products, post the fold, the owned rows' products, start this
  layer's gradient sums over the replicas (its weights' and its biases'), wait for the
  partial sums and add them;
- the gradient sums run one after another (Rabenseifner's reduce-scatter + allgather or
  recursive doubling, the faster: what MPICH and Open MPI pick by size; across nodes
  node-aware, ``Machine.gradient_sum_stages``; without a cluster, the measured all-reduce
  curve), but MPI moves a non-blocking collective only inside MPI calls: they advance while
  a rank runs a layer that folds (its owned rows in chunks, MPI called between them, and the
  wait for the partial sums); what is left when the backward pass ends runs then, before the
  SGD update and the refresh of the derived matrices. (Measured: a sum finished in the
  background only when MPI was called several times during the work beside it; a model that
  overlapped the sums with the whole backward pass predicted a fraction of their time.)

Kernel times come from the calibration's tables, looked up by batch, X-buffer rows and reuse
(nonzeros per row read: the owned and the ghost products each their own; a dense block, which
the runtime hands to BLAS, from its dense table by size and batch), blended between the
cold-cache and the warm-cache table by how far the rank's working set for a step exceeds its
share of the last-level cache (``warm_share``), then scaled by the calibration's reference
steps at the replica's batch size.

Ranks are placed as the runtime numbers them (rank = replica x parts + part, consecutive ranks
on one node); every replica does the same work, so one replica is replayed. Bytes are those of
``--exchange dense`` (the encoded modes send at most these plus a header).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from spdnn.cost._replay import LOSS_COLLECTIVES, StepReplay, warm_share, working_set
from spdnn.cost.cluster import Machine
from spdnn.cost.workload import Workload
from spdnn.model.plan import Plan

__all__ = ["LOSS_COLLECTIVES", "Prediction", "grids", "predict", "predict_many", "single_part",
           "warm_share", "working_set"]


@dataclass(kw_only=True)
class Prediction:
    """Seconds of one step (training) or batch (inference) on ``parts`` x ``replicas``."""

    method: str
    parts: int
    replicas: int
    batch: int
    seconds: float
    compute: float  # on the rank that finishes last: its kernels and fixed costs
    exchange: float  # its posting of and waiting for messages
    gradient: float  # its starting of and waiting for the gradient sums
    layers: list[dict[str, float]] = field(default_factory=list)
    compute_kernels: float = 0.0  # the part of ``compute`` the kernel tables predict

    @property
    def ranks(self) -> int:
        return self.parts * self.replicas

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "parts": self.parts, "replicas": self.replicas,
                "ranks": self.ranks, "batch": self.batch, "seconds": self.seconds,
                "compute": self.compute, "exchange": self.exchange, "gradient": self.gradient,
                "layers": self.layers}


def predict(work: Workload, machine: Machine, batch: int, replicas: int = 1,
            dtype: str = "float32", training: bool = True, optimizer: Any = None  # noqa: ANN401
            ) -> Prediction:
    """Replay one training step (or inference batch) of ``batch`` samples; ``optimizer``:
    the config of the optimizer whose update the step runs (spdnn.optim; None: SGD's
    defaults)."""
    return predict_many([(work, machine, batch, replicas)], dtype, training, optimizer)[0]


def predict_many(runs: list[tuple[Workload, Machine, int, int]], dtype: str = "float32",
                 training: bool = True, optimizer: Any = None) -> list[Prediction]:  # noqa: ANN401
    """``predict`` for each (workload, machine, batch, replicas), replayed side by side a
    layer at a time, so that each layer's messages are read once for all the runs of a
    workload (a ``StreamedWorkload`` counts them again at every read)."""
    steps = []
    for work, machine, batch, replicas in runs:
        if work.parts * replicas > 1:
            machine.check()
        steps.append(StepReplay(work, machine, batch, replicas, dtype, optimizer))
    works = list({id(w): w for w, *_ in runs}.values())
    layers = len(works[0].layers) if works else 0
    if any(len(w.layers) != layers for w in works):
        raise ValueError("predict_many: the workloads are of different networks")
    for i in range(layers):
        _layer_of_each(works, steps, i, StepReplay.forward_layer)
    for step in steps:
        step.loss()
    if training:
        for i in range(layers - 1, -1, -1):
            _layer_of_each(works, steps, i, StepReplay.backward_layer)
        for step in steps:
            step.backward_end()
            step.update()
    out = []
    for (work, _, batch, replicas), step in zip(runs, steps):
        p = int(np.argmax(step.clock))
        out.append(Prediction(method=work.method, parts=work.parts, replicas=replicas,
                              batch=batch,
                              seconds=float(step.clock[p]), compute=float(step.compute[p]),
                              exchange=float(step.exch[p]), gradient=float(step.grad[p]),
                              layers=step.layers, compute_kernels=float(step.kernel_time[p])))
    return out


def _layer_of_each(works: list[Workload], steps: list[StepReplay], i: int, advance) -> None:  # noqa: ANN001
    for work in works:
        lw = work.layer(i)
        for step in steps:
            if step.work is work:
                advance(step, i, lw)


def single_part(sizes: tuple[int, ...]) -> Plan:
    """The plan of one model part (every neuron on rank 0): pure data parallelism."""
    return Plan(1, tuple(np.zeros(n, dtype=np.int32) for n in sizes), {"method": "single"})


def grids(works: list[Workload], ranks: int, batch: int) -> list[tuple[Workload, int]]:
    """Every (plan, replicas) with plan parts x replicas = ``ranks`` and at least one sample
    per replica."""
    return [(w, ranks // w.parts) for w in works
            if ranks % w.parts == 0 and ranks // w.parts <= batch]
