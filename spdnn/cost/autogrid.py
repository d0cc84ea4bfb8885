"""``spdnn train --replicas auto``: the grid the cost model predicts fastest for this job's P,
among the plans given (``--plan`` once per candidate) and pure data parallelism, that fits
each rank's memory (the job's limit, and the cluster's memory per node when it gives one)."""

from __future__ import annotations

from typing import Any, Literal

from spdnn.comm.mpi import Communicator
from spdnn.errors import InputError, SpdnnError


def choose_grid(comm: Communicator, *, network: str, plans: list[str],
                replicas: int | Literal["auto"], calibration: str | None, cluster: str | None,
                batch: int, dtype: str, verbose: bool = True,
                memory_limit: int | None = None, baseline: int | None = None,
                optimizer: Any = None) -> tuple[str | None, int]:  # noqa: ANN401
    """(plan path or None, replicas) for this job; with ``replicas="auto"`` rank 0 predicts
    every grid, prints the one it takes and the others, and every rank gets the choice.
    ``memory_limit``: bytes a rank may hold (None: ``spdnn.runtime.memory_budget.default_limit``;
    0: none); ``baseline``: a rank's own bytes, measured by the job (None: measured here);
    ``optimizer``: the training's optimizer config (its update's cost and state)."""

    def check() -> None:  # on every rank, so that the error is agreed and printed once
        if replicas != "auto" and len(plans) > 1:
            raise SpdnnError("several --plan need --replicas auto (which picks one of them)")
        if replicas == "auto" and not calibration:
            raise SpdnnError("--replicas auto needs --calibration FILE (from spdnn calibrate)")

    comm.check(check)
    if replicas != "auto":
        return (plans[0] if plans else None), replicas
    from spdnn.runtime.memory_budget import default_limit

    limit = memory_limit if memory_limit is not None else default_limit(comm)[0]
    if baseline is None:
        from spdnn.runtime import memory_report

        baseline = memory_report.measure_baseline(dtype, node_ranks=comm.node_size(),
                                                  training=True)
    choice = comm.check(lambda: _decide(comm.size, plans, network, calibration, cluster, batch,
                                        dtype, limit, baseline, optimizer)
                        if comm.rank == 0 else None)
    path, chosen, report = comm.bcast(choice)
    if comm.rank == 0 and verbose:
        print(report, flush=True)
    return path, chosen


def _peak(work: object, replicas: int, batch: int, dtype: str,
          baseline: int | None = None, optimizer_arrays: int = 1, relu: bool = True) -> int:
    """The largest rank's predicted training peak under a grid (spdnn.model.memory), above
    ``baseline`` (default: this process's, measured); ``relu``: predict's."""
    from spdnn.model.csr import as_dtype, stored_itemsize
    from spdnn.model.memory import predict, replica_batch, shapes_of
    from spdnn.runtime import memory_report

    # bfloat16: float32 sums and state beside 16-bit blocks
    return max(predict(shapes_of(work, p), batch=replica_batch(batch, replicas),
                       itemsize=as_dtype(dtype).itemsize, training=True,
                       optimizer_arrays=optimizer_arrays, stored=stored_itemsize(dtype),
                       baseline=memory_report.baseline() if baseline is None else baseline,
                       relu=relu).total
               for p in range(work.parts))  # type: ignore[attr-defined]


def _decide(ranks: int, plans: list[str], network: str, calibration: str, cluster: str | None,
            batch: int, dtype: str, limit: int, base: int, optimizer: Any  # noqa: ANN401
            ) -> tuple[str | None, int, str]:
    from spdnn.cost.cluster import load_machine
    from spdnn.cost.costmodel import predict, single_part
    from spdnn.cost.workload import workload
    from spdnn.io.bundle import NetworkBundle
    from spdnn.io.planfile import load_plan
    from spdnn.model.activations import relu_only
    from spdnn.model.plan import network_patterns
    machine = load_machine(calibration, cluster)
    bundle = NetworkBundle(network)
    bundle.validate()
    patterns = network_patterns(bundle)
    fingerprint = bundle.fingerprint()
    candidates = []
    if ranks <= batch:
        candidates.append((None, workload(patterns, single_part(bundle.sizes)), ranks))
    parts = []
    for path in plans:
        plan = load_plan(path)
        plan.check_for(bundle.sizes, fingerprint, path)
        parts.append(plan.parts)
        if ranks % plan.parts == 0 and ranks // plan.parts <= batch:
            candidates.append((path, workload(patterns, plan), ranks // plan.parts))
    if plans and all(ranks % n for n in parts):
        raise InputError(plans[0] if len(plans) == 1 else ", ".join(plans),
                         f"no plan fits {ranks} ranks (parts: "
                         f"{', '.join(map(str, parts))}): P must be a multiple of a plan's parts")
    if not candidates:
        raise SpdnnError(f"--replicas auto: no grid of {ranks} ranks gives every replica a "
                         f"sample of --batch-size {batch}")
    from spdnn.model.memory import format_bytes

    room = [m for m in (limit, machine.cluster.rank_memory if machine.cluster else None) if m]
    allowed = min(room) if room else 0
    from spdnn.optim import SGDConfig, state_arrays

    states = state_arrays(SGDConfig() if optimizer is None else optimizer)
    relu = relu_only(bundle.meta.get("activations", ()))
    peaks = {id(w): _peak(w, r, batch, dtype, base, states, relu) for _, w, r in candidates}
    too_big = [(path, r, peaks[id(w)]) for path, w, r in candidates
               if allowed and peaks[id(w)] > allowed]
    candidates = [c for c in candidates if not allowed or peaks[id(c[1])] <= allowed]
    if not candidates:
        raise SpdnnError(f"--replicas auto: no grid of {ranks} ranks fits {format_bytes(allowed)}"
                         " a rank: " + ", ".join(f"{r} replica(s) of {path or 'no plan'} "
                                                 f"need {format_bytes(p)}"
                                                 for path, r, p in too_big))
    preds = sorted(((predict(w, machine, batch, r, dtype, optimizer=optimizer), path)
                    for path, w, r in candidates), key=lambda pp: pp[0].seconds)
    best, path = preds[0]
    where = f"cluster {machine.cluster.name}" if machine.cluster else "this host's calibration"

    def grid(p, plan_path) -> str:  # noqa: ANN001
        name = plan_path if plan_path else "no plan"
        return f"{p.parts} part(s) x {p.replicas} replica(s) ({name}, {p.method})"

    lines = [f"--replicas auto: {grid(best, path)}, predicted {1e3 * best.seconds:.2f} ms per "
             f"step of {batch} samples on {where} (compute {100 * best.compute / best.seconds:.0f}"
             f"%, exchange {100 * best.exchange / best.seconds:.0f}%, gradient sums "
             f"{100 * best.gradient / best.seconds:.0f}%)"]
    lines += [f"  also predicted: {grid(p, pp)}: {1e3 * p.seconds:.2f} ms" for p, pp in preds[1:]]
    lines += [f"  left out: {r} replica(s) of {pp or 'no plan'}: predicted peak "
              f"{format_bytes(p)} a rank, over {format_bytes(allowed)}" for pp, r, p in too_big]
    return path, best.replicas, "\n".join(lines)
