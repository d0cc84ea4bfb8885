"""pytest plugin for MPI test runs (``-p spdnn.testing``, loaded by tests/conftest.py).

Under ``mpiexec -n P`` a test that fails on one rank while the others wait in a collective
would hang the job (DESIGN.md section 6). This plugin aborts the whole job as soon as a test
fails on any rank with P > 1; pytest-timeout (thread method) and the launcher's timeout are the
other two guards.
"""

from __future__ import annotations

import sys

import pytest


def _world():  # noqa: ANN202
    try:
        from mpi4py import MPI
    except ImportError:  # pragma: no cover - mpi4py is a dependency
        return None
    return MPI.COMM_WORLD if MPI.Is_initialized() else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # noqa: ANN001, ANN201
    outcome = yield
    report = outcome.get_result()
    if report.failed and item.config.getoption("--with-mpi", default=False):
        world = _world()
        if world is not None and world.Get_size() > 1:
            sys.stderr.write(f"\n[rank {world.Get_rank()}] {item.nodeid} failed "
                             f"({report.when}); aborting all ranks\n{report.longreprtext}\n")
            sys.stderr.flush()
            world.Abort(1)
