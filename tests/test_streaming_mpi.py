"""Layer-streamed inference, under any communicator size: a network read in blocks of layers
gives every sample the same outputs, bit for bit, as the network held in memory, the same
accuracy, and the same Graph Challenge categories, with replicas as well; the weights are read
once; a limit that leaves no block fitting is refused on every rank."""

from __future__ import annotations

import numpy as np
import pytest

import spdnn
from partition import partition
from spdnn.comm.mpi import AgreedError
from spdnn.io.bundle import save_network
from spdnn.model.batching import columns
from spdnn.model.generate import radixnet
from spdnn.model.memory import LayerShape
from spdnn.runtime.grid import Grid
from spdnn.runtime.inference import challenge_infer
from spdnn.runtime.layer_stream import BLOCK_SHARE, choose_blocks
from spdnn.runtime.memory_budget import Budget
from spdnn.runtime.session import open_network
from spdnn.runtime.streamed_inference import stream_challenge
from tests.helpers import small_network
from tests.test_runtime_mpi import _images

pytestmark = pytest.mark.mpi


def _saved(comm, mpi_tmp_path, net, name):
    path = mpi_tmp_path / name
    if comm.rank == 0:
        save_network(net, path)
    comm.barrier()
    return str(path)


def _stream(comm, path, plan, layers, dtype="float64", replicas=1):
    budget = Budget(limit=0, batch=1, training=False, can_stream=True, stream_layers=layers)
    opened = open_network(comm, path, plan, dtype, replicas, budget=budget)
    assert opened.dnet is None and opened.stream is not None
    return opened.stream


@pytest.mark.parametrize("layers", [1, 2, 3])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_streamed_outputs_equal_the_in_memory_outputs_bit_for_bit(comm, mpi_tmp_path, layers,
                                                                  dtype):
    net = small_network((48, 40, 36, 30, 24, 10), fan_in=6, seed=3, cap=4.0)
    path = _saved(comm, mpi_tmp_path, net, "net.npz")
    plan = partition(net, parts=comm.size, method="random", seed=5)
    x = np.random.default_rng(1).random((70, 48))
    whole = open_network(comm, path, plan, dtype).dnet
    stream = _stream(comm, path, plan, layers, dtype)
    assert [b[1] - b[0] + 1 for b in stream.stream.blocks][0] == layers
    x_local = np.ascontiguousarray(x[:, whole.input_rows], dtype=dtype)
    got = {}

    def finish(c, ids, dnet, fwd):
        assert np.array_equal(ids, np.arange(fwd.z_last.shape[1]))
        got[c] = dnet.output(fwd.z_last)

    stream.run(3, lambda c: columns(x_local, slice(25 * c, 25 * c + 25)), finish)
    for c in range(3):
        fwd = whole.forward(columns(x_local, slice(25 * c, 25 * c + 25)), keep=False)
        assert np.array_equal(got[c], whole.output(fwd.z_last))
    assert stream.fingerprint == whole.fingerprint
    # the blocks' schedules and traffic are those of the whole network
    assert stream.ghost_rows == [lay.exchange.n_ghost for lay in whole.layers]
    assert stream.traffic.forward_rows.tolist() == whole.traffic.forward_rows.tolist()


def test_streamed_accuracy_equals_the_in_memory_accuracy_with_replicas(comm, mpi_tmp_path):
    net = small_network((64, 40, 30, 20, 10), fan_in=7, seed=4)
    path = _saved(comm, mpi_tmp_path, net, "net.npz")
    for parts in sorted({1, comm.size} | ({comm.size // 2} if comm.size % 2 == 0 else set())):
        plan = partition(net, parts=parts, method="cyclic")
        replicas = comm.size // parts
        base = spdnn.RunOptions(plan=plan, replicas=replicas, dtype="float64")
        whole = spdnn.infer(path, inputs="digits", run=base, comm=comm)
        for layers in (1, 3):
            run = spdnn.RunOptions(plan=plan, replicas=replicas, dtype="float64",
                                   stream_layers=layers)
            streamed = spdnn.infer(path, inputs="digits", run=run, comm=comm)
            assert streamed.accuracy == whole.accuracy
            assert streamed.memory["stream"]["blocks"][0] == [1, layers]


@pytest.mark.parametrize("layers", [1, 5, 7])
def test_streamed_graph_challenge_categories_equal_the_in_memory_ones(comm, mpi_tmp_path,
                                                                      layers):
    net = radixnet(1024, 12, seed=0, dtype="float32")
    path = _saved(comm, mpi_tmp_path, net, "rx.npz")
    images = _images(150)
    for replicas in sorted({1, comm.size}):
        plan = partition(net, parts=comm.size // replicas, method="block")
        whole = open_network(comm, path, plan, "float32", replicas)
        expected = challenge_infer(comm, whole.dnet, images, whole.nnz, chunk=40)
        stream = _stream(comm, path, plan, layers, "float32", replicas)
        got = stream_challenge(comm, stream, images, whole.nnz)
        np.testing.assert_array_equal(got.categories, expected.categories)
        assert 0 < len(expected.categories) < 150  # some live, some die: both paths exercised


def test_a_limit_that_leaves_no_block_fitting_is_refused_on_every_rank(comm, mpi_tmp_path):
    net = small_network((64, 40, 30, 10), fan_in=7, seed=4)
    path = _saved(comm, mpi_tmp_path, net, "net.npz")
    plan = partition(net, parts=comm.size, method="cyclic")
    # layer 1 alone: 160 MB of weights on every rank, more than a block may take of a limit
    # 300 MB above this process's baseline (the baseline and a share of those 300 MB)
    from spdnn.model.memory import format_bytes
    from spdnn.runtime import memory_report

    limit = memory_report.baseline() + 300_000_000
    room = (limit - (1 - BLOCK_SHARE) * 300_000_000) / 1e6
    shapes = [LayerShape(nnz=20_000_000, rows=1000, prev_rows=64, ghosts=0, sent=0),
              LayerShape(nnz=1000, rows=10, prev_rows=1000, ghosts=0, sent=0)]
    with pytest.raises(AgreedError, match=rf"--memory-limit {format_bytes(limit)}: layer 1 "
                                          rf"alone needs "
                                          rf"[0-9.]+ MB on rank \d+, more than a block may "
                                          rf"take \({room:.2f} MB\); no block of layers fits"):
        choose_blocks(Grid.make(comm, comm.size), shapes, limit=limit, itemsize=4,
                      max_layers=None, reason="a test")
    with pytest.raises(AgreedError, match="stream_layers .* is for inference"):
        spdnn.train(path, data="digits", comm=comm,
                    run=spdnn.RunOptions(plan=plan, stream_layers=1),
                    options=spdnn.TrainOptions(epochs=1, max_steps=1))
