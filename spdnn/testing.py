"""pytest plugin for MPI test runs (``-p spdnn.testing``, loaded by tests/conftest.py).

Under ``mpiexec -n P`` a test that fails on one rank while the others wait in a collective
would hang the job. This plugin aborts the whole job as soon as a test fails on any rank with
P > 1; pytest-timeout (thread method) and the launcher's timeout are the other two guards.
"""

from __future__ import annotations

import sys

import pytest

from .comm import abort_world, world_size


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # noqa: ANN001, ANN201
    outcome = yield
    report = outcome.get_result()
    if report.failed and item.config.getoption("--with-mpi", default=False) \
            and world_size() > 1:
        sys.stderr.write(f"\n{item.nodeid} failed ({report.when}); aborting all ranks\n"
                         f"{report.longreprtext}\n")
        sys.stderr.flush()
        abort_world(1)
