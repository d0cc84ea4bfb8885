"""pytest plugin for MPI test runs (loaded by tests/conftest.py; elsewhere ``-p mpi_plugin``
with tests/ on the path).

Under ``mpiexec -n P`` a test that fails on one rank while the others wait in a collective
would hang the job. This plugin aborts the whole job as soon as a test fails on any rank with
P > 1; pytest-timeout (thread method) and the launcher's timeout are the other two guards.
"""

from __future__ import annotations

import sys

import pytest

from spdnn.comm.mpi import abort_world, world_size


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


@pytest.hookimpl(trylast=True)
def pytest_configure(config):  # noqa: ANN001, ANN201
    """Replace pytest-mpi's plugin by one without its end-of-run "MPI Information" banner,
    which every rank prints (P copies of the MPI build details between the test results)."""
    for plugin in list(config.pluginmanager.get_plugins()):
        if type(plugin).__name__ == "MPIPlugin":
            quiet = type("QuietMPIPlugin", (type(plugin),),
                         {"pytest_terminal_summary": lambda self: None})
            config.pluginmanager.unregister(plugin)
            config.pluginmanager.register(quiet())
