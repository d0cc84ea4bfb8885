"""Training samples held by shares (spdnn.runtime.sample_shares): each replica keeps only its share
of the samples and fetches the rest as the batches need them, and trains exactly what the
serial reference trains. Run under mpiexec -n 1, 2, 3 and 4: every grid that fits."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from spdnn.io.loaders import Dataset, keep_share, load_dataset
from spdnn.model import batching
from spdnn.reference import train as reference_train
from spdnn.runtime.checkpoint import load_checkpoint
from spdnn.runtime.session import gather_network
from spdnn.runtime.training import TrainConfig, train
from tests.helpers import small_network
from tests.test_replicas_mpi import SGD, _assert_close, _data, _open, grids

pytestmark = pytest.mark.mpi


def _shared(data, grid):
    return keep_share(data, (grid.replica, grid.replicas)) if grid.replicas > 1 else data


@pytest.mark.parametrize("sparse, segment_bytes", [(False, 1), (False, batching.SEGMENT_BYTES),
                                                   (True, 1)])
def test_shares_train_what_the_serial_reference_trains(comm, mpi_tmp_path, monkeypatch, sparse,
                                                       segment_bytes):
    """One batch a segment (1 byte) and the whole epoch in one (dense); CSR samples, whose
    rows travel as counts, indices and values; the test split's accuracy from the replicas'
    shares."""
    monkeypatch.setattr(batching, "SEGMENT_BYTES", segment_bytes)
    net = small_network((20, 24, 18, 6), fan_in=5, seed=1, bias_scale=0.3)
    data = _data(net)
    if sparse:
        x = data.x_train * (np.abs(data.x_train) > 0.8)
        data = Dataset(name=data.name, x_train=sp.csr_matrix(x), y_train=data.y_train,
                       x_test=sp.csr_matrix(data.x_test), y_test=data.y_test)
    cfg = TrainConfig(epochs=2, batch_size=16, optimizer=SGD, seed=7)
    expected, ref_reports = reference_train(net, data, 2, 16, SGD, seed=7)
    for parts, replicas in grids(comm.size):
        run = _open(comm, mpi_tmp_path, net, parts, replicas, "block")
        held = _shared(data, run.dnet.grid)
        if replicas > 1:
            assert held.x_train.shape[0] < data.x_train.shape[0]
        reports = train(comm, run.dnet, held, cfg)
        np.testing.assert_allclose([r.loss for r in reports], [r.loss for r in ref_reports],
                                   rtol=1e-12)
        assert [r.test_accuracy for r in reports] == [r.test_accuracy for r in ref_reports]
        got = gather_network(run.dnet)
        if got is not None:  # rank 0 of every replica
            _assert_close(got, expected)
        run.dnet.grid.free()


def test_a_resume_mid_epoch_fetches_from_the_batch_it_starts_at(comm, mpi_tmp_path,
                                                                 monkeypatch):
    monkeypatch.setattr(batching, "SEGMENT_BYTES", 2 * 16 * 20 * 8)  # two batches a segment
    net = small_network((20, 24, 18, 6), fan_in=5, seed=5)
    data = _data(net)
    full = TrainConfig(epochs=3, batch_size=16, optimizer=SGD, seed=1)
    expected, _ = reference_train(net, data, 3, 16, SGD, seed=1)
    parts, replicas = grids(comm.size)[-1]  # the most replicas
    ckpt = str(mpi_tmp_path / "ckpt")
    run = _open(comm, mpi_tmp_path, net, parts, replicas, "block", name="first")
    held = _shared(data, run.dnet.grid)
    train(comm, run.dnet, held, TrainConfig(epochs=3, batch_size=16, optimizer=SGD, seed=1,
                                            max_steps=5, checkpoint_dir=ckpt,
                                            checkpoint_every=5))
    position, momentum = load_checkpoint(run.dnet, ckpt, full.settings())
    assert (position.epoch, position.batch) == (1, 1)
    run.dnet.grid.free()
    resumed = _open(comm, mpi_tmp_path, net, parts, replicas, "block", name="second").dnet
    position, momentum = load_checkpoint(resumed, ckpt, full.settings())
    train(comm, resumed, held, full, position, momentum)
    got = gather_network(resumed)
    if got is not None:  # rank 0 of every replica
        _assert_close(got, expected)
    resumed.grid.free()


def _files(comm, tmp, *, seed, n):
    """A network and an npz data set of ``n`` training samples, written by rank 0."""
    from spdnn.io.bundle import save_network

    net = small_network((20, 24, 18, 6), fan_in=5, seed=seed)
    data = _data(net, n=n)
    path, npz = tmp / "net.npz", tmp / "data.npz"
    if comm.rank == 0:
        save_network(net, path)
        np.savez(npz, x_train=data.x_train, y_train=data.y_train, x_test=data.x_test,
                 y_test=data.y_test)
    comm.barrier()
    return net, data, path, npz


def test_the_job_reads_only_its_share_and_trains_as_one_rank(comm, mpi_tmp_path):
    """``spdnn.train`` on an npz file with every rank a replica: each holds its share of the
    samples (its memory report's data), and the weights equal a one-rank run's."""
    import spdnn
    from spdnn.io.bundle import load_network

    _, _, path, npz = _files(comm, mpi_tmp_path, seed=3, n=200)
    options = spdnn.TrainOptions(epochs=2, batch_size=16, lr=0.05, momentum=0.9)
    result = spdnn.train(str(path), data=f"npz:{npz}", options=options,
                         run=spdnn.RunOptions(replicas=comm.size, dtype="float64"),
                         save=str(mpi_tmp_path / "shared.npz"), comm=comm)
    whole = load_dataset(f"npz:{npz}", "float64")
    mine = load_dataset(f"npz:{npz}", "float64", share=(comm.rank, comm.size))
    held = whole.x_train.nbytes + whole.x_test.nbytes if comm.size == 1 else \
        mine.x_train.nbytes + mine.x_test.nbytes
    # beside the share, the largest segment fetched (and its send and receive copies)
    fetched = result.memory["held_bytes"][comm.rank]["data"] - held
    assert (fetched == 0) if comm.size == 1 else (0 < fetched <= 3 * batching.SEGMENT_BYTES)
    if comm.rank == 0:
        with comm.split(0) as alone:
            spdnn.train(str(path), data=f"npz:{npz}", options=options,
                        run=spdnn.RunOptions(dtype="float64"),
                        save=str(mpi_tmp_path / "one.npz"), comm=alone)
        _assert_close(load_network(mpi_tmp_path / "shared.npz"),
                      load_network(mpi_tmp_path / "one.npz"))
    else:
        comm.split(1).free()
    comm.barrier()


def test_inference_replicas_read_only_their_share(comm, mpi_tmp_path):
    """``spdnn.infer`` on an npz file with every rank a replica: each holds its share of the
    split it evaluates (and nothing of the other), and the accuracy is the one-rank one."""
    import spdnn

    net, data, path, npz = _files(comm, mpi_tmp_path, seed=4, n=90)
    run = spdnn.RunOptions(replicas=comm.size, dtype="float64")
    result = spdnn.infer(str(path), inputs=f"npz:{npz}", run=run, comm=comm)
    from spdnn.reference import accuracy

    assert result.accuracy == accuracy(net, data.x_test, data.y_test)
    # its share of the test split, and nothing of the training split it does not evaluate
    share = batching.share_of(len(data.y_test), comm.rank, comm.size)
    assert result.memory["held_bytes"][comm.rank]["data"] == \
        data.x_test[share].nbytes


@pytest.mark.parametrize("width", [0, 3])
def test_the_feed_gives_every_step_its_samples_in_order(comm, monkeypatch, width):
    """The blocks equal the rows of the serial batch slices, for a rank that reads no input
    feature (width 0: a model part whose first layer uses none) and one that reads some."""
    from spdnn.model.batching import batch_order, columns
    from spdnn.runtime.grid import Grid
    from spdnn.runtime.sample_shares import SampleFeed

    monkeypatch.setattr(batching, "SEGMENT_BYTES", 3 * 8 * 5 * 8)  # three batches a segment
    n, batch = 29, 8
    x = np.arange(n * width, dtype=np.float64).reshape(n, width)
    grid = Grid.make(comm, 1)  # every rank a replica
    rows = batching.share_of(n, grid.replica, grid.replicas)
    feed = SampleFeed(x[rows].copy(), rows if grid.replicas > 1 else None, n, grid,
                      n_features=5)
    order = batch_order(n, 0, 3, True)
    seen = []
    for b, _idx, mine, block in feed.steps(order, batch, 1):
        np.testing.assert_array_equal(block, columns(x, mine))
        seen.append(b)
    assert seen == [1, 2, 3]
    grid.free()


def test_critical_sets_and_compressed_sums_train_alike_from_shares(comm, mpi_tmp_path,
                                                                  monkeypatch):
    """The critical set's batches (drawn from the samples' losses) and compressed gradient
    sums read the same samples from shares as from the whole data set: the same weights, bit
    for bit, on every grid (the whole-data runs are checked against the serial reference in
    test_lossy_mpi)."""
    from spdnn.lossy.compress import parse_compress

    monkeypatch.setattr(batching, "SEGMENT_BYTES", 2 * 16 * 20 * 8)  # two batches a segment
    net = small_network((20, 24, 18, 6), fan_in=5, seed=6)
    data = _data(net, n=80)
    cfg = TrainConfig(epochs=4, batch_size=16, optimizer=SGD, seed=2, critical_set=0.5, refresh=2,
                      compress=parse_compress("sidco:0.2"))
    for parts, replicas in grids(comm.size):
        weights = []
        for held in (data, None):
            run = _open(comm, mpi_tmp_path, net, parts, replicas, "block")
            train(comm, run.dnet, held if held is not None else _shared(data, run.dnet.grid),
                  cfg)
            weights.append([la.weight.data.copy() for la in run.dnet.layers])
            run.dnet.grid.free()
        for a, b in zip(*weights):
            np.testing.assert_array_equal(a, b)
