"""The distributed runtime against the serial reference, under any communicator size.

Run by the test command under mpiexec -n 1, 2, 3 and 4 (pytest-mpi, marker ``mpi``).
"""

from __future__ import annotations

import numpy as np
import pytest

from partition.methods import partition_network
from spdnn.bundle import NetworkBundle, save_network
from spdnn.comm import AgreedError, Communicator
from spdnn.datasets import Dataset
from spdnn.plan import network_patterns, save_plan
from spdnn.reference import SGDConfig
from spdnn.reference import train as reference_train
from spdnn.runtime import (
    TrainConfig,
    accounting,
    challenge_infer,
    gather_network,
    load_checkpoint,
    open_network,
    train,
)
from tests.helpers import small_network

pytestmark = pytest.mark.mpi


def _comm():
    from mpi4py import MPI

    return Communicator(MPI.COMM_WORLD)


def _data(net, n=50, seed=4):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, net.sizes[0]))
    y = rng.integers(0, net.sizes[-1], n)
    xt = rng.standard_normal((13, net.sizes[0]))
    yt = rng.integers(0, net.sizes[-1], 13)
    return Dataset("synthetic", x, y, xt, yt)


def _setup(tmp, net, method, comm, name="net"):
    """Rank 0 writes the bundle and a plan for this communicator; every rank opens them."""
    path, plan_path = tmp / f"{name}.npz", tmp / f"{name}-{method}-{comm.size}.npz"
    if comm.rank == 0:
        save_network(net, path)
        plan = partition_network(network_patterns(net), comm.size, method, seed=3,
                                 fingerprint=net.fingerprint())
        save_plan(plan, plan_path)
    comm.barrier()
    return open_network(comm, str(path), str(plan_path))


def _assert_equal_networks(a, b, tol):
    for la, lb in zip(a.layers, b.layers):
        np.testing.assert_array_equal(la.weight.indices, lb.weight.indices)
        np.testing.assert_allclose(la.weight.data, lb.weight.data, rtol=0, atol=tol)
        np.testing.assert_allclose(la.bias, lb.bias, rtol=0, atol=tol)


@pytest.mark.parametrize("method", ["block", "random", "hypergraph"])
@pytest.mark.parametrize("loss, cap, out", [("cross_entropy", None, "linear"),
                                            ("mse", 2.0, "relu")])
def test_sgd_equals_the_serial_reference(mpi_tmp_path, method, loss, cap, out):
    comm = _comm()
    net = small_network((20, 24, 18, 6), fan_in=5, seed=1, cap=cap, output_activation=out,
                        bias_scale=0.3)
    data = _data(net)
    sgd = SGDConfig(lr=0.05, momentum=0.9, weight_decay=0.01)
    bundle, _, dnet = _setup(mpi_tmp_path, net, method, comm)
    cfg = TrainConfig(epochs=2, batch_size=16, sgd=sgd, seed=7, loss=loss)
    reports = train(comm, dnet, data, cfg)
    expected, ref_reports = reference_train(net, data, 2, 16, sgd, seed=7, loss=loss)
    assert reports[-1].steps == 8  # 4 steps per epoch, the last batch smaller
    np.testing.assert_allclose([r.loss for r in reports], [r.loss for r in ref_reports],
                               rtol=1e-12)
    assert [r.test_accuracy for r in reports] == [r.test_accuracy for r in ref_reports]
    got = gather_network(comm, dnet)
    if comm.rank == 0:
        _assert_equal_networks(got, expected, 1e-10)


@pytest.mark.parametrize("method", ["cyclic", "hypergraph"])
def test_counted_traffic_equals_the_plan_volume(mpi_tmp_path, method):
    comm = _comm()
    net = small_network((30, 40, 40, 8), fan_in=6, seed=2)
    bundle, plan, dnet = _setup(mpi_tmp_path, net, method, comm)
    train(comm, dnet, _data(net, n=37), TrainConfig(1, 10, SGDConfig(0.01)))
    acc = accounting(comm, dnet, bundle)
    assert acc["equal"], acc
    counted, predicted = acc["counted"], acc["predicted"]
    assert counted == predicted
    item = np.dtype(np.float64).itemsize
    volume = plan.meta["stats"]["forward"]
    # 4 training batches (10, 10, 10, 7) and one evaluation batch of 13 test samples.
    assert counted["forward_bytes"] == [v * (37 + 13) * item for v in volume]
    assert counted["backward_bytes"][0] == 0
    if comm.size == 1:
        assert sum(counted["forward_rows"]) == 0


def test_interrupted_and_resumed_equals_uninterrupted(mpi_tmp_path):
    comm = _comm()
    net = small_network((20, 24, 18, 6), fan_in=5, seed=5)
    data = _data(net)
    sgd = SGDConfig(lr=0.05, momentum=0.9, weight_decay=0.001)
    full_cfg = TrainConfig(epochs=3, batch_size=16, sgd=sgd, seed=1)
    _, _, whole = _setup(mpi_tmp_path, net, "hypergraph", comm, "a")
    train(comm, whole, data, full_cfg)
    expected = gather_network(comm, whole)

    # The first part runs on a smaller communicator (another P) when there is more than one
    # rank, stopping mid-epoch; the resumed part runs on every rank with another plan.
    ckpt = str(mpi_tmp_path / "ckpt")
    first_size = max(1, comm.size - 1)
    sub = comm.comm.Split(0 if comm.rank < first_size else 1, comm.rank)
    if comm.rank < first_size:
        small = Communicator(sub)
        _, _, part = _setup(mpi_tmp_path, net, "block", small, "b")
        cfg = TrainConfig(3, 16, sgd, 1, max_steps=6, checkpoint_dir=ckpt, checkpoint_every=2)
        train(small, part, data, cfg)
    sub.Free()
    comm.barrier()
    _, _, resumed = _setup(mpi_tmp_path, net, "random", comm, "c")
    position, momentum = load_checkpoint(comm, resumed, ckpt)
    assert (position.step, position.epoch, position.batch) == (6, 1, 2)
    train(comm, resumed, data, full_cfg, position, momentum)
    got = gather_network(comm, resumed)
    if comm.rank == 0:
        _assert_equal_networks(got, expected, 1e-10)


def test_bad_inputs_fail_on_every_rank(mpi_tmp_path):
    comm = _comm()
    net = small_network()
    _setup(mpi_tmp_path, net, "cyclic", comm)
    other = small_network(seed=9)
    if comm.rank == 0:
        save_network(other, mpi_tmp_path / "other.npz")
        wrong_p = partition_network(network_patterns(net), comm.size + 1, "cyclic",
                                    fingerprint=net.fingerprint())
        save_plan(wrong_p, mpi_tmp_path / "wrong-p.npz")
    comm.barrier()
    plan = str(mpi_tmp_path / f"net-cyclic-{comm.size}.npz")
    with pytest.raises(AgreedError, match="plan was made for network"):
        open_network(comm, str(mpi_tmp_path / "other.npz"), plan)
    with pytest.raises(AgreedError, match=f"plan is for P={comm.size + 1} ranks"):
        open_network(comm, str(mpi_tmp_path / "net.npz"), str(mpi_tmp_path / "wrong-p.npz"))
    _, _, dnet = open_network(comm, str(mpi_tmp_path / "net.npz"), plan)
    with pytest.raises(AgreedError, match="no checkpoint manifest"):
        comm.check(lambda: load_checkpoint(comm, dnet, str(mpi_tmp_path / "none")))
    bad = Dataset("bad", np.zeros((4, 5)), np.zeros(4, dtype=np.int64))
    with pytest.raises(AgreedError, match="5 features"):
        comm.check(lambda: train(comm, dnet, bad, TrainConfig(1, 2, SGDConfig())))


def test_graph_challenge_subset_categories(mpi_tmp_path, graphchallenge_dir):
    from spdnn.formats import read_categories, read_graphchallenge, read_inputs

    comm = _comm()
    path = mpi_tmp_path / "gc.npz"
    if comm.rank == 0:
        net = read_graphchallenge(graphchallenge_dir / "neuron1024", -0.3, 32)
        save_network(net, path)
        plan = partition_network(network_patterns(net), comm.size, "cyclic",
                                 fingerprint=net.fingerprint())
        save_plan(plan, mpi_tmp_path / "gc-plan.npz")
    comm.barrier()
    bundle, _, dnet = open_network(comm, str(path), str(mpi_tmp_path / "gc-plan.npz"))
    images = read_inputs(graphchallenge_dir / "sparse-images-1024_subset.mtx", 1024)
    truth = read_categories(graphchallenge_dir / "neuron1024-l120-categories_subset.mtx")
    run = challenge_infer(comm, dnet, images, 120 * 1024 * 32)
    np.testing.assert_array_equal(run.categories, truth)
    assert run.rate > 0
    assert isinstance(bundle, NetworkBundle)
