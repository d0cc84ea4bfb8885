"""``spdnn train --replicas auto``: the grid the cost model predicts fastest for this job's P,
among the plans given (``--plan`` once per candidate) and pure data parallelism."""

from __future__ import annotations

from typing import Literal

from spdnn.comm import Communicator
from spdnn.errors import InputError, SpdnnError


def choose_grid(comm: Communicator, *, network: str, plans: list[str],
                replicas: int | Literal["auto"], calibration: str | None, cluster: str | None,
                batch: int, dtype: str, verbose: bool = True) -> tuple[str | None, int]:
    """(plan path or None, replicas) for this job; with ``replicas="auto"`` rank 0 predicts
    every grid, prints the one it takes and the others, and every rank gets the choice."""

    def check() -> None:  # on every rank, so that the error is agreed and printed once
        if replicas != "auto" and len(plans) > 1:
            raise SpdnnError("several --plan need --replicas auto (which picks one of them)")
        if replicas == "auto" and not calibration:
            raise SpdnnError("--replicas auto needs --calibration FILE (from spdnn calibrate)")

    comm.check(check)
    if replicas != "auto":
        return (plans[0] if plans else None), replicas
    choice = comm.check(lambda: _decide(comm.size, plans, network, calibration, cluster, batch,
                                        dtype) if comm.rank == 0 else None)
    path, chosen, report = comm.bcast(choice)
    if comm.rank == 0 and verbose:
        print(report, flush=True)
    return path, chosen


def _decide(ranks: int, plans: list[str], network: str, calibration: str, cluster: str | None,
            batch: int, dtype: str) -> tuple[str | None, int, str]:
    from spdnn.cost.cluster import load_machine
    from spdnn.cost.costmodel import predict, single_part
    from spdnn.cost.workload import workload
    from spdnn.io.bundle import NetworkBundle
    from spdnn.io.planfile import load_plan
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
        parts.append(plan.nparts)
        if ranks % plan.nparts == 0 and ranks // plan.nparts <= batch:
            candidates.append((path, workload(patterns, plan), ranks // plan.nparts))
    if plans and all(ranks % n for n in parts):
        raise InputError(plans[0] if len(plans) == 1 else ", ".join(plans),
                         f"no plan fits {ranks} ranks (parts: "
                         f"{', '.join(map(str, parts))}): P must be a multiple of a plan's parts")
    if not candidates:
        raise SpdnnError(f"--replicas auto: no grid of {ranks} ranks gives every replica a "
                         f"sample of --batch-size {batch}")
    preds = sorted(((predict(w, machine, batch, r, dtype), path)
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
    return path, best.replicas, "\n".join(lines)
