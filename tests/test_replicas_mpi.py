"""Two axes: R replicas of a network partitioned into parts, P = parts x R, against the serial
reference. Run under mpiexec -n 1, 2, 3 and 4: every grid that fits the communicator."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from partition.methods import partition_network
from spdnn.comm.mpi import AgreedError
from spdnn.io.bundle import save_network
from spdnn.io.images import read_image_share, write_image_npz
from spdnn.io.loaders import Dataset
from spdnn.io.planfile import save_plan
from spdnn.model.generate import radixnet
from spdnn.model.plan import network_patterns
from spdnn.optim import SGDConfig
from spdnn.reference import accuracy
from spdnn.reference import challenge_infer as reference_challenge
from spdnn.reference import train as reference_train
from spdnn.runtime.checkpoint import load_checkpoint
from spdnn.runtime.inference import challenge_infer, evaluate, local_inputs, my_images
from spdnn.runtime.session import gather_network, open_network
from spdnn.runtime.training import TrainConfig, train
from tests.helpers import small_network
from tests.test_runtime_mpi import _images

pytestmark = pytest.mark.mpi
SGD = SGDConfig(lr=0.05, momentum=0.9, weight_decay=0.01)


def grids(size: int) -> list[tuple[int, int]]:
    """(parts, replicas) with parts x replicas = size."""
    return [(size // r, r) for r in range(1, size + 1) if size % r == 0]


def _data(net, n=49):
    """49 samples in batches of 16: the last batch (1 sample) is smaller than any R > 1."""
    rng = np.random.default_rng(4)
    return Dataset(name="synthetic", x_train=rng.standard_normal((n, net.sizes[0])),
                   y_train=rng.integers(0, net.sizes[-1], n), x_test=rng.standard_normal((13,
                                                                                          net.sizes[0])),
                   y_test=rng.integers(0, net.sizes[-1], 13))


def _open(comm, tmp, net, parts, replicas, method="hypergraph", name="net", dtype=None):
    path, plan = tmp / f"{name}.npz", tmp / f"{name}-{method}-{parts}.npz"
    if comm.rank == 0:
        save_network(net, path)
        save_plan(partition_network(network_patterns(net), parts, method=method, seed=3,
                                    fingerprint=net.fingerprint()), plan)
    comm.barrier()
    return open_network(comm, str(path), str(plan), dtype, replicas=replicas)


def _assert_close(got, expected, tol=1e-10):
    for la, lb in zip(got.layers, expected.layers):
        np.testing.assert_array_equal(la.weight.indices, lb.weight.indices)
        np.testing.assert_allclose(la.weight.data, lb.weight.data, rtol=0, atol=tol)
        np.testing.assert_allclose(la.bias, lb.bias, rtol=0, atol=tol)


def trains_as_the_reference(comm, tmp, net, data, cfg, expected, ref, *,  # noqa: ANN001
                            method: str = "hypergraph", name: str = "net",
                            same: tuple[str, ...] = ()) -> None:
    """Under every grid of ``comm``: losses within 1e-12 of the reference's reports and the
    fields ``same`` equal to theirs, weights within 1e-10 of ``expected``, and replicas holding
    bit-identical weights (the same digest on every rank of a part)."""
    for parts, replicas in grids(comm.size):
        run = _open(comm, tmp, net, parts, replicas, method, name=name)
        reports = train(comm, run.dnet, data, cfg)
        np.testing.assert_allclose([r.loss for r in reports], [r.loss for r in ref],
                                   rtol=1e-12)
        for field in same:
            assert [getattr(r, field) for r in reports] == [getattr(r, field) for r in ref], \
                (field, parts, replicas)
        got = gather_network(run.dnet)
        if got is not None:  # rank 0 of every replica
            _assert_close(got, expected)
        digests = run.dnet.grid.data.allgather(_digest(run.dnet))
        assert len(set(digests)) == 1, (parts, replicas)
        run.dnet.grid.free()


def _digest(dnet) -> str:
    h = hashlib.sha256()
    for layer in dnet.layers:
        h.update(layer.weight.data.tobytes())
        h.update(layer.bias.tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("method", ["block", "hypergraph"])
def test_every_grid_equals_the_serial_reference(comm, mpi_tmp_path, method):
    net = small_network((20, 24, 18, 6), fan_in=5, seed=1, bias_scale=0.3)
    data = _data(net)
    cfg = TrainConfig(epochs=2, batch_size=16, optimizer=SGD, seed=7)
    expected, ref_reports = reference_train(net, data, 2, 16, SGD, seed=7)
    assert ref_reports[-1].steps == 8
    trains_as_the_reference(comm, mpi_tmp_path, net, data, cfg, expected, ref_reports,
                            method=method, same=("steps", "train_accuracy", "test_accuracy"))


def test_evaluation_splits_the_inputs(comm, mpi_tmp_path):
    net = small_network((20, 24, 18, 6), fan_in=5, seed=2)
    data = _data(net, n=37)
    for parts, replicas in grids(comm.size):
        dnet = _open(comm, mpi_tmp_path, net, parts, replicas).dnet
        got = evaluate(dnet, local_inputs(dnet, data.x_train, "x"), data.y_train, batch_size=5)
        assert got == accuracy(net, data.x_train, data.y_train)
        dnet.grid.free()


def test_resume_on_another_grid_equals_the_uninterrupted_run(comm, mpi_tmp_path):
    """The first part runs on the grid with the most replicas (2 x 2 at P = 4); the rest on
    1 x 3 and 3 x 1 at P = 4, else on the other grids of this P."""
    net = small_network((20, 24, 18, 6), fan_in=5, seed=5)
    data = _data(net)
    full = TrainConfig(epochs=3, batch_size=16, optimizer=SGD, seed=1)
    expected, _ = reference_train(net, data, 3, 16, SGD, seed=1)
    first = (2, 2) if comm.size == 4 else grids(comm.size)[-1]
    ckpt = str(mpi_tmp_path / "ckpt")
    run = _open(comm, mpi_tmp_path, net, *first, name="first")
    train(comm, run.dnet, data, TrainConfig(epochs=3, batch_size=16, optimizer=SGD, seed=1,
                                            max_steps=6,
                                            checkpoint_dir=ckpt,
                                            checkpoint_every=3))
    run.dnet.grid.free()
    size = 3 if comm.size == 4 else comm.size
    with comm.split(0 if comm.rank < size else 1) as sub:
        if comm.rank < size:
            for parts, replicas in grids(size):
                resumed = _open(sub, mpi_tmp_path, net, parts, replicas, name="second").dnet
                position, momentum = load_checkpoint(resumed, ckpt, full.settings())
                assert (position.step, position.epoch, position.batch) == (6, 1, 2)
                train(sub, resumed, data, full, position, momentum)
                got = gather_network(resumed)
                if sub.rank == 0:
                    _assert_close(got, expected)
                resumed.grid.free()
    comm.barrier()


def test_graph_challenge_mode_on_every_grid(comm, mpi_tmp_path):
    net = radixnet(1024, 12, seed=0, dtype="float64")
    images = _images(121)  # replicas' shares differ by one: 61 + 60 is 4 chunks + 3 of 20
    expected = reference_challenge(net, images)
    path = mpi_tmp_path / "images.npz"
    if comm.rank == 0:
        write_image_npz(path, images)
    comm.barrier()
    for parts, replicas in grids(comm.size):
        run = _open(comm, mpi_tmp_path, net, parts, replicas, "cyclic", "rx")
        for chunk in (None, 20):
            got = challenge_infer(comm, run.dnet, images, run.nnz, chunk=chunk)
            np.testing.assert_array_equal(got.categories, expected.categories)
        # each rank reading only its replica's share of an image file (as `spdnn infer`)
        share = read_image_share(path, 1024, run.dnet.grid.share)
        assert share.matrix.shape[0] == len(range(121)[run.dnet.grid.share(121)])
        got = challenge_infer(comm, run.dnet, share, run.nnz)
        np.testing.assert_array_equal(got.categories, expected.categories)
        assert got.n_inputs == 121
        # ... and only its first layer's features, in its dtype: the share is then the only
        # copy of the images it holds (as `spdnn infer` under a plan reads them)
        dnet = run.dnet
        share = read_image_share(path, 1024, dnet.grid.share, features=dnet.input_rows,
                                 dtype=dnet.dtype)
        assert share.matrix.shape[1] == len(dnet.input_rows)
        assert np.shares_memory(my_images(dnet.grid, share, dnet.input_rows, dnet.dtype)[1].data,
                                share.matrix.data)
        got = challenge_infer(comm, dnet, share, run.nnz)
        np.testing.assert_array_equal(got.categories, expected.categories)
        run.dnet.grid.free()


def test_graph_challenge_subset_on_grids_with_replicas(comm, mpi_tmp_path, graphchallenge_dir,
                                                      neuron1024):
    from spdnn.io.formats import read_categories, read_inputs

    if comm.size not in (2, 4):
        pytest.skip("the 1 x 2 and 2 x 2 grids need 2 or 4 ranks")
    net = neuron1024()
    run = _open(comm, mpi_tmp_path, net, comm.size // 2, 2, "cyclic", "gc")
    images = read_inputs(graphchallenge_dir / "sparse-images-1024_subset.mtx", 1024)
    truth = read_categories(graphchallenge_dir / "neuron1024-l120-categories_subset.mtx")
    np.testing.assert_array_equal(challenge_infer(comm, run.dnet, images, run.nnz).categories,
                                  truth)


def test_replicas_that_do_not_fit_the_job(comm, mpi_tmp_path):
    net = small_network()
    _open(comm, mpi_tmp_path, net, comm.size, 1).dnet.grid.free()
    plan = str(mpi_tmp_path / f"net-hypergraph-{comm.size}.npz")
    with pytest.raises(AgreedError, match=f"need mpirun -n {2 * comm.size}, this job has"):
        open_network(comm, str(mpi_tmp_path / "net.npz"), plan, replicas=2)
    with pytest.raises(AgreedError, match="--replicas must be at least 1"):
        open_network(comm, str(mpi_tmp_path / "net.npz"), plan, replicas=0)


def test_counted_values_per_layer_and_axis_equal_the_prediction(comm, mpi_tmp_path):
    from spdnn.model.plan import plan_statistics, step_values
    from spdnn.runtime.accounting import accounting, plan_volume

    net = small_network((30, 40, 40, 8), fan_in=6, seed=2)
    rng = np.random.default_rng(0)
    data = Dataset(name="no test set", x_train=rng.standard_normal((48, 30)),
                   y_train=rng.integers(0, 8, 48))
    for parts, replicas in grids(comm.size):
        dnet = _open(comm, mpi_tmp_path, net, parts, replicas).dnet
        # 3 steps of 16
        train(comm, dnet, data, TrainConfig(epochs=1, batch_size=16, optimizer=SGD))
        volume = plan_volume(dnet.comm, dnet.plan, [lay.exchange.n_ghost for lay in dnet.layers])
        acc = accounting(comm, dnet.traffic, volume, 8, dnet.grid.data).as_dict()
        assert acc["equal"], acc
        stats = plan_statistics(network_patterns(net), dnet.plan.owners, parts=parts)
        predicted = step_values(stats, [lay.nnz for lay in net.layers], net.sizes[1:],
                                replicas, 16)
        counted = acc["counted"]
        assert [b // 8 for b in counted["forward_bytes"]] == [3 * v for v in predicted.expand]
        assert [b // 8 for b in counted["backward_bytes"]] == [3 * v for v in predicted.fold]
        assert acc["gradient_sum_values"] == [3 * v for v in predicted.gradient_in]
        dnet.grid.free()
