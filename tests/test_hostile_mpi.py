"""The hostile battery's distributed cases (bad options and data, malformed plans and
checkpoints) on every rank of every MPI run (1, 2, 3, 4 ranks and Open MPI), through
``spdnn``'s entry point in-process: exit code 2 on every rank, one line on rank 0 holding every
fragment, nothing on the others, no traceback. An error found by one rank alone would abort the
job (the run fails). tests/test_hostile.py runs the same cases in one process and a sample of
them under ``mpiexec -n 2`` as a user starts them.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest

from tests.helpers import small_network
from tests.test_hostile import SIZES, checkpoint_cases, option_cases, plan_cases

pytestmark = pytest.mark.mpi


@pytest.fixture
def hostile(comm, mpi_tmp_path) -> Path:
    """The battery's valid files (as tests/test_hostile.py's ``base``), with a plan for this
    job's size; written by rank 0."""
    d = mpi_tmp_path / "hostile"
    if comm.rank == 0:
        import numpy as np

        from partition.api import partition
        from spdnn.api import train
        from spdnn.comm.mpi import Communicator
        from spdnn.io.bundle import save_network
        from spdnn.io.planfile import save_plan
        from spdnn.model.options import TrainOptions

        d.mkdir()
        net = small_network(SIZES)
        save_network(net, d / "net.npz")
        for parts in {2, comm.size}:
            save_plan(partition(net, parts=parts, method="cyclic"), d / f"plan{parts}.npz")
        rng = np.random.default_rng(0)
        np.savez(d / "data.npz", x_train=rng.standard_normal((20, 12)),
                 y_train=rng.integers(0, 4, 20), x_test=rng.standard_normal((5, 12)),
                 y_test=rng.integers(0, 4, 5))
        with Communicator.self_only() as alone:
            train(d / "net.npz", data=f"npz:{d / 'data.npz'}", comm=alone,
                  options=TrainOptions(epochs=1, batch_size=8, checkpoint_dir=d / "ckpt"))
    comm.barrier()
    return d


def _run(argv: list[object], env: dict[str, str]) -> tuple[int, str]:
    from spdnn.cli.parser import main
    from spdnn.kernels import products

    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    products.forget_backend()  # internal: SPDNN_KERNELS is read once per process
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main([str(a) for a in argv])
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        products.forget_backend()
    return code, err.getvalue()


def _check(comm, cases: list[tuple[list, dict, list]]) -> None:  # noqa: ANN001
    failures = []
    for argv, env, fragments in cases:
        comm.barrier()
        code, err = _run(argv, env)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        verdicts = comm.allgather((code, lines))
        what = " ".join(map(str, argv[:1] + argv[-3:]))
        if {c for c, _ in verdicts} != {2}:
            failures.append(f"{what}: exit codes {[c for c, _ in verdicts]} {verdicts[0][1]}")
            continue
        first = verdicts[0][1]
        if len(first) != 1 or "Traceback" in err or \
                not all(str(f) in first[0] for f in fragments):
            failures.append(f"{what}: rank 0 printed {first}, expected {fragments}")
        if any(other for _, other in verdicts[1:]):
            failures.append(f"{what}: other ranks printed {verdicts[1:]}")
    assert not failures, "\n".join(failures)


def _plan(d: Path, ranks: int) -> list:
    return ["--plan", d / f"plan{ranks}.npz"] if ranks > 1 else []


def _cases(comm, build):  # noqa: ANN001, ANN202
    """The case list, built (and its files written) by rank 0 alone."""
    return comm.bcast(build() if comm.rank == 0 else None)


def test_bad_options_and_data_on_every_rank(comm, hostile):
    _check(comm, _cases(comm, lambda: option_cases(hostile, _plan(hostile, comm.size))))


def test_malformed_checkpoints_on_every_rank(comm, hostile):
    _check(comm, _cases(comm, lambda: [(argv, {}, frags) for argv, frags in checkpoint_cases(
        hostile, _plan(hostile, comm.size))]))


def test_malformed_plans_on_every_rank(comm, hostile):
    if comm.size == 1:
        pytest.skip("a plan is given with more than one rank")
    _check(comm, _cases(comm, lambda: [(argv, {}, frags)
                                       for argv, frags in plan_cases(hostile, comm.size)]))
