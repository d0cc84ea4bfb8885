"""Shared fixtures: kernel backends, the real data, and the MPI fixtures (``comm``; pytest-mpi
gives ``mpi_tmp_path``). The MPI abort-on-failure hook lives in tests/mpi_plugin.py. Nothing
here imports MPI unless an MPI test asks for it: a serial test process never starts MPI."""

from __future__ import annotations

import copy
import functools
import gc
import os
from pathlib import Path

import pytest

import spdnn.cli.thread_pools  # noqa: F401 (one thread per rank, before numpy)
import spdnn.comm.threads

# Kernels still run on one thread by default; a pool of two lets the thread tests run 2.
spdnn.comm.threads.reserve_threads(2)

pytest_plugins = ["mpi_plugin"]

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("SPDNN_SHARED_DATA", ROOT.parent / "shared" / "data"))
GRAPHCHALLENGE = SHARED_DATA / "graphchallenge"
MNIST = SHARED_DATA / "mnist"


def pytest_collection_modifyitems(config, items):  # noqa: ANN001, ANN201
    """The tests marked long first, each group in file order: under pytest-xdist's worksteal
    scheduling a worker that runs out steals the short tests from the end of the other's queue,
    instead of both waiting at the end on one long test started last. ``long(0)``: before the
    other long tests (test_readme's 2-3 minutes)."""
    def order(item) -> tuple[bool, int]:  # noqa: ANN001
        mark = item.get_closest_marker("long")
        return mark is None, (mark.args[0] if mark and mark.args else 1)

    items.sort(key=order)


def pytest_collection_finish(session):  # noqa: ANN001, ANN201
    """What collection made live (test modules, spdnn, numba's dispatchers) lasts the session:
    frozen out of the collector's sight, so a full collection (streaming's one per block of
    layers, the automatic ones) scans only what a test allocates: 160 ms a call in an MPI test
    process before, a few ms after."""
    gc.collect()
    gc.freeze()


@pytest.fixture(params=["scipy", "numba"])
def backend(request):
    """Run a test once per kernel backend (the same tests, the same tolerances)."""
    from spdnn.kernels import products as kernels

    if request.param not in kernels.available_backends():
        pytest.skip(f"kernel backend {request.param} is not installed")
    before = kernels.backend()
    kernels.set_backend(request.param)
    yield request.param
    kernels.set_backend(before)


@pytest.fixture
def graphchallenge_dir() -> Path:
    if not (GRAPHCHALLENGE / "neuron1024" / "n1024-l1.tsv").is_file():
        pytest.skip(f"Graph Challenge data not found under {GRAPHCHALLENGE} (../shared absent)")
    return GRAPHCHALLENGE


@functools.lru_cache(maxsize=1)
def _read_neuron1024():  # noqa: ANN202
    from spdnn.io.graphchallenge import read_graphchallenge

    return read_graphchallenge(GRAPHCHALLENGE / "neuron1024", -0.3, 32)


@pytest.fixture
def neuron1024(graphchallenge_dir):  # noqa: ANN201
    """A loader of the official 1024 x 120 network (bias -0.3, cap 32): read from its 120 TSV
    files once per test process (seconds a read), on the ranks that call
    it; each call returns a copy of its own."""
    return lambda: copy.deepcopy(_read_neuron1024())


@pytest.fixture
def comm():
    """A private duplicate of COMM_WORLD for one MPI test, freed after it."""
    from spdnn.comm.mpi import Communicator

    with Communicator() as c:
        yield c
