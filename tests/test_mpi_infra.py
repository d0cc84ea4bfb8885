"""The MPI test infrastructure itself: ranks agree, and a failure on one rank ends the job."""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from spdnn.bundle import NetworkBundle, save_network
from tests.helpers import ROOT, small_network

MPIEXEC = Path(sys.executable).parent / "mpiexec"


@pytest.mark.mpi
def test_ranks_read_the_same_bundle(mpi_tmp_path):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    path = mpi_tmp_path / "net.npz"
    if comm.rank == 0:
        save_network(small_network(), path)
    comm.Barrier()
    with NetworkBundle(path) as bundle:
        fingerprints = comm.allgather(bundle.fingerprint())
    assert fingerprints == [small_network().fingerprint()] * comm.size


@pytest.mark.skipif(not MPIEXEC.exists(), reason=f"no mpiexec beside {sys.executable}")
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
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    proc = subprocess.run(
        [str(MPIEXEC), "-n", "2", sys.executable, "-m", "pytest", "-p", "spdnn.testing",
         "-p", "no:cacheprovider", "--with-mpi", "--color=no", "-q", "test_hang.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env,
    )
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0
    assert "aborting all ranks" in proc.stderr + proc.stdout
    assert elapsed < 60
