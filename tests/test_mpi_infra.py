"""The MPI test infrastructure itself: ranks agree, and a failure on one rank ends the job."""

import os
import sys
import textwrap
import time

import pytest

from spdnn.comm.mpi import Communicator
from spdnn.io.bundle import NetworkBundle, save_network
from tests.helpers import MPIEXEC, NO_MPIEXEC, ROOT, launch, small_network


@pytest.mark.mpi
def test_ranks_read_the_same_bundle(mpi_tmp_path):
    with Communicator() as comm:
        path = mpi_tmp_path / "net.npz"
        if comm.rank == 0:
            save_network(small_network(), path)
        comm.barrier()
        with NetworkBundle(path) as bundle:
            fingerprints = comm.gather(bundle.fingerprint())
    if comm.rank == 0:
        assert fingerprints == [small_network().fingerprint()] * comm.size


def test_the_launcher_is_found_the_way_a_user_would(monkeypatch, tmp_path):
    from tests import helpers

    monkeypatch.setenv("SPDNN_MPIEXEC", "/opt/site/bin/mpiexec")
    assert helpers.find_mpiexec() == "/opt/site/bin/mpiexec"
    monkeypatch.delenv("SPDNN_MPIEXEC")
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    monkeypatch.setattr(sys, "executable", str(venv / "python"))
    onpath = tmp_path / "system"
    onpath.mkdir()
    (onpath / "mpiexec").write_text("#!/bin/sh\n")
    (onpath / "mpiexec").chmod(0o755)
    monkeypatch.setenv("PATH", str(onpath))
    assert helpers.find_mpiexec() == str(onpath / "mpiexec")  # a system MPI on PATH
    (venv / "mpiexec").write_text("")
    assert helpers.find_mpiexec() == str(venv / "mpiexec")  # the venv's comes first
    (venv / "mpiexec").unlink()
    monkeypatch.setenv("PATH", str(tmp_path))
    assert helpers.find_mpiexec() is None


@pytest.mark.skipif(MPIEXEC is None, reason=NO_MPIEXEC)
def test_a_failure_on_one_rank_aborts_the_whole_job(tmp_path):
    (tmp_path / "test_hang.py").write_text(textwrap.dedent("""
        import pytest
        from mpi4py import MPI

        @pytest.mark.mpi
        def test_fails_on_rank_1_before_a_collective():
            comm = MPI.COMM_WORLD
            assert comm.rank != 1, "deliberate failure on rank 1"
            comm.Barrier()  # rank 0 would wait here forever without the abort hook
    """))
    t0 = time.monotonic()
    proc = launch(2, "-p", "mpi_plugin", "-p", "no:cacheprovider", "--with-mpi", "--color=no",
                  "-q", "test_hang.py", module="pytest", cwd=tmp_path, timeout=120,
                  env={"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])})
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0
    assert "aborting all ranks" in proc.stderr + proc.stdout
    assert elapsed < 60
