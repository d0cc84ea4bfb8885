"""bfloat16 runs on P ranks against the serial reference's bfloat16 passes
(spdnn.reference.bfloat16), under every grid of the communicator (2 x 2 at P = 4) and across a
checkpoint resumed on another grid. Run under mpiexec -n 1, 2, 3 and 4.

Tolerance: the rounding to bfloat16 happens at the same points whatever P (the weights after
each update, X_0, every activation, every error block), so P changes only the order of the
float32 sums. A sum whose last bit differs rounds to another bfloat16 value only when it lies
within a float32 step of a halfway point (about 2^-16 of sums); such a flip moves one value by a
bfloat16 step (2^-8 relative), which the next sums carry on at that scale. The weights and
losses are therefore compared at 1e-5 (float32 rounding over a few steps, 500 x below a
bfloat16 step), and the test's data are chosen small enough that no flip occurs: a flip, or a
rounding point moved, fails it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from spdnn.kernels import dense
from spdnn.kernels.encoding import HEADER
from spdnn.model.generate import random_network
from spdnn.optim import AdamConfig, SGDConfig
from spdnn.reference import train as reference_train
from spdnn.runtime.checkpoint import load_checkpoint
from spdnn.runtime.session import gather_network
from spdnn.runtime.training import TrainConfig, train
from tests.helpers import small_network
from tests.test_replicas_mpi import _data, _digest, _open, grids

pytestmark = pytest.mark.mpi
TOL = 1e-5


@pytest.mark.parametrize("method", ["block", "hypergraph"])
@pytest.mark.parametrize("opt", [SGDConfig(0.05, 0.9, 0.01), AdamConfig(lr=0.01)],
                         ids=["sgd", "adam"])
@pytest.mark.parametrize("cap", [None, 0.7, "head", "tanh, sigmoid"])
def test_bfloat16_training_on_every_grid_equals_the_serial_reference(comm, mpi_tmp_path,
                                                                      method, opt, cap,
                                                                      monkeypatch):
    """ReLU, and ReLU capped at 0.7 (not a bfloat16: the slope compares the rounded outputs
    with the cap rounded, 0.69921875), under block and hypergraph plans; a dense head of
    6 rows (its own forward kernel), whose columns are owned and ghost at P > 1; and tanh and
    sigmoid hidden layers (their slopes read the rounded outputs, their partial sums fold
    unmasked)."""
    if cap == "head":  # its kernel at this test's batch width too
        monkeypatch.setattr(dense, "DENSE_ROWS_MIN_BATCH", 1)
        net = random_network([20, 24, 18], 5, seed=1, head=6, dtype="float32")
    elif cap == "tanh, sigmoid":
        net = small_network((20, 24, 18, 6), fan_in=5, seed=1, bias_scale=0.3,
                            dtype="float32", activations=("tanh", "sigmoid"))
    else:
        net = small_network((20, 24, 18, 6), fan_in=5, seed=1, bias_scale=0.3,
                            dtype="float32", cap=cap)
    data = _data(net)
    cfg = TrainConfig(epochs=2, batch_size=16, optimizer=opt, seed=7)
    expected, ref = reference_train(net, data, 2, 16, opt, seed=7, bfloat16=True)
    for parts, replicas in grids(comm.size):
        run = _open(comm, mpi_tmp_path, net, parts, replicas, method, dtype="bfloat16")
        assert run.dnet.bfloat16
        reports = train(comm, run.dnet, data, cfg)
        np.testing.assert_allclose([r.loss for r in reports], [r.loss for r in ref],
                                   rtol=TOL)
        assert [r.test_accuracy for r in reports] == [r.test_accuracy for r in ref]
        got = gather_network(run.dnet)
        if got is not None:
            for la, lb in zip(got.layers, expected.layers):
                assert la.weight.dtype == np.float32  # the master weights
                np.testing.assert_allclose(la.weight.data, lb.weight.data, rtol=0, atol=TOL)
                np.testing.assert_allclose(la.bias, lb.bias, rtol=0, atol=TOL)
        digests = run.dnet.grid.data.allgather(_digest(run.dnet))
        assert len(set(digests)) == 1, (parts, replicas)
        for ws in run.dnet.workspaces():  # a Z is spent once its outputs are rounded:
            blocks = {id(z if z.base is None else z.base) for z in ws.zs}
            assert len(blocks) == 1  # every layer's Z shares one block
        run.dnet.grid.free()


def test_a_bfloat16_run_resumes_on_another_grid_as_the_uninterrupted_run(comm, mpi_tmp_path):
    """A checkpoint holds the float32 master weights and state: resumed on every grid of this P
    (the first part ran on the grid with the most replicas), the run ends as one serial run
    at bfloat16's rounding points does."""
    net = small_network((20, 24, 18, 6), fan_in=5, seed=5, dtype="float32")
    data = _data(net)
    opt = AdamConfig(lr=0.01)
    full = TrainConfig(epochs=3, batch_size=16, optimizer=opt, seed=1)
    expected, _ = reference_train(net, data, 3, 16, opt, seed=1, bfloat16=True)
    ckpt = str(mpi_tmp_path / "ckpt")
    first = _open(comm, mpi_tmp_path, net, *grids(comm.size)[-1], name="first",
                  dtype="bfloat16").dnet
    train(comm, first, data, replace(full, max_steps=5, checkpoint_dir=ckpt,
                                     checkpoint_every=5))
    first.grid.free()
    for parts, replicas in grids(comm.size):
        resumed = _open(comm, mpi_tmp_path, net, parts, replicas, name="second",
                        dtype="bfloat16").dnet
        position, state = load_checkpoint(resumed, ckpt, full.settings())
        assert position.step == 5
        train(comm, resumed, data, full, position, state)
        got = gather_network(resumed)
        if got is not None:
            for la, lb in zip(got.layers, expected.layers):
                np.testing.assert_allclose(la.weight.data, lb.weight.data, rtol=0, atol=TOL)
                np.testing.assert_allclose(la.bias, lb.bias, rtol=0, atol=TOL)
        resumed.grid.free()


@pytest.mark.parametrize("mode", ["dense", "sparse", "auto"])
def test_bfloat16_rows_travel_in_every_exchange_mode_to_the_same_result(comm, mpi_tmp_path,
                                                                         mode):
    """16-bit rows forward, dense or packed (their zeros and the rounded cap left out), and
    float32 partial sums backward, packed under the slope of the rounded outputs: every mode
    trains as the reference does; the packed forms send fewer bytes than the dense."""
    net = small_network((20, 24, 18, 6), fan_in=5, seed=2, bias_scale=0.3, dtype="float32",
                        cap=0.7)
    data = _data(net)
    opt = SGDConfig(0.05, 0.9)
    cfg = TrainConfig(epochs=1, batch_size=16, optimizer=opt, seed=3)
    expected, ref = reference_train(net, data, 1, 16, opt, seed=3, bfloat16=True)
    run = _open(comm, mpi_tmp_path, net, comm.size, 1, dtype="bfloat16")
    run.dnet.set_exchange(mode)
    reports = train(comm, run.dnet, data, cfg)
    np.testing.assert_allclose([r.loss for r in reports], [r.loss for r in ref], rtol=TOL)
    got = gather_network(run.dnet)
    if got is not None:
        for la, lb in zip(got.layers, expected.layers):
            np.testing.assert_allclose(la.weight.data, lb.weight.data, rtol=0, atol=TOL)
    t = run.dnet.traffic.total(comm)
    if comm.size > 1:
        dense = (t.forward_bytes.sum(), t.backward_bytes.sum())  # the rows as dense blocks
        sent = (t.forward_sent.sum(), t.backward_sent.sum())
        if mode == "dense":
            assert sent == dense
        else:  # the folds leave out what the slope zeroes; auto's rows are never larger
            assert sent[1] < dense[1], (sent, dense)
            if mode == "auto":  # than dense but for a 16-byte header a message
                assert sent[0] <= dense[0] + HEADER * t.forward_messages.sum(), (sent, dense)
    run.dnet.grid.free()


@pytest.mark.parametrize("name", ["adamw", "adagrad", "nesterov", "rmsprop"])
def test_every_optimizer_keeps_float32_state_under_bfloat16(comm, mpi_tmp_path, name):
    """The other optimizers update the float32 master weights as the reference's do."""
    from tests.test_optim_mpi import OPTIMIZERS

    net = small_network((20, 24, 18, 6), fan_in=5, seed=4, bias_scale=0.3, dtype="float32")
    data = _data(net)
    opt = OPTIMIZERS[name]
    expected, ref = reference_train(net, data, 1, 16, opt, seed=2, bfloat16=True)
    parts, replicas = grids(comm.size)[-1]
    run = _open(comm, mpi_tmp_path, net, parts, replicas, dtype="bfloat16")
    reports = train(comm, run.dnet, data, TrainConfig(epochs=1, batch_size=16, optimizer=opt,
                                                      seed=2))
    np.testing.assert_allclose([r.loss for r in reports], [r.loss for r in ref], rtol=TOL)
    got = gather_network(run.dnet)
    if got is not None:
        for la, lb in zip(got.layers, expected.layers):
            np.testing.assert_allclose(la.weight.data, lb.weight.data, rtol=0, atol=TOL)
    run.dnet.grid.free()


@pytest.mark.parametrize("exchange", ["dense", "auto"])
def test_bfloat16_graph_challenge_subset_gives_the_official_categories(
        comm, mpi_tmp_path, graphchallenge_dir, neuron1024, exchange):
    """The official 1024 x 120 network on its 1,200-image subset, in bfloat16 at every P
    (the outputs rounded at every layer, the dead inputs dropped): the official categories."""
    from spdnn.io.formats import read_categories, read_inputs
    from spdnn.runtime.inference import challenge_infer

    net = neuron1024()
    run = _open(comm, mpi_tmp_path, net, comm.size, 1, method="cyclic", name="gc",
                dtype="bfloat16")
    run.dnet.set_exchange(exchange)
    images = read_inputs(graphchallenge_dir / "sparse-images-1024_subset.mtx", 1024)
    truth = read_categories(graphchallenge_dir / "neuron1024-l120-categories_subset.mtx")
    result = challenge_infer(comm, run.dnet, images, run.nnz)
    np.testing.assert_array_equal(result.categories, truth)
    run.dnet.grid.free()
