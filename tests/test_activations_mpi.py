"""Every activation on P ranks against the serial reference (which tests/test_activations.py
holds against torch.nn): under hypergraph and block plans, on every grid (2 x 2 at P = 4),
with the exchange dense and sparse (ReLU's masks in use, and off where other activations
have no exact zeros), under dropout, and across a checkpoint resumed on another grid. Run
under mpiexec -n 1, 2, 3 and 4."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from spdnn.model.counters import Dropout
from spdnn.optim import AdamWConfig, SGDConfig
from spdnn.reference import predict
from spdnn.reference import train as reference_train
from spdnn.runtime.checkpoint import load_checkpoint
from spdnn.runtime.inference import evaluate
from spdnn.runtime.session import gather_network
from spdnn.runtime.training import TrainConfig, train
from tests.helpers import small_network
from tests.test_replicas_mpi import _assert_close, _data, _open, grids, trains_as_the_reference

pytestmark = pytest.mark.mpi

MIXES = {
    "tanh-sigmoid": ("tanh", "sigmoid"),
    "leaky-gelu": ("leaky_relu:-0.3", "gelu"),
    "gelu_tanh-identity": ("gelu_tanh", "identity"),
    "relu-tanh": ("relu", "tanh"),
    "tanh-relu": ("tanh", "relu"),
}


@pytest.mark.parametrize("method", ["block", "hypergraph"])
@pytest.mark.parametrize("mix", sorted(MIXES))
def test_every_activation_on_every_grid_equals_the_serial_reference(comm, mpi_tmp_path,
                                                                      method, mix):
    net = small_network((20, 24, 18, 6), fan_in=5, seed=1, bias_scale=0.3, cap=1.5,
                        activations=MIXES[mix])
    data = _data(net)
    opt = SGDConfig(0.1, 0.9)
    cfg = TrainConfig(epochs=2, batch_size=16, optimizer=opt, seed=7)
    expected, ref = reference_train(net, data, 2, 16, opt, seed=7)
    trains_as_the_reference(comm, mpi_tmp_path, net, data, cfg, expected, ref, method=method,
                            name=mix, same=("steps", "train_accuracy", "test_accuracy"))


@pytest.mark.parametrize("mix", ["relu-tanh", "tanh-relu", "leaky-gelu"])
def test_dense_and_sparse_exchanges_train_alike(comm, mpi_tmp_path, mix):
    """The sparse exchange leaves out ReLU's zeros and, in the fold, the entries its slope
    zeroes; below another activation the fold goes dense. Both modes give the reference's
    weights, with dropout too, and predictions equal the reference's."""
    net = small_network((20, 30, 24, 6), fan_in=6, seed=4, bias_scale=0.3, cap=1.2,
                        activations=MIXES[mix])
    data = _data(net)
    opt = AdamWConfig(lr=0.02)
    for drop in (None, Dropout((0.3, 0.5), seed=2)):
        cfg = TrainConfig(epochs=2, batch_size=16, optimizer=opt, seed=3, dropout=drop)
        expected, _ = reference_train(net, data, 2, 16, opt, seed=3, dropout=drop)
        for mode in ("dense", "sparse"):
            run = _open(comm, mpi_tmp_path, net, comm.size, 1, name=f"{mix}-{mode}")
            run.dnet.set_exchange(mode)
            if drop is not None and run.dnet.cap is not None:
                for layer in run.dnet.layers:  # as training does under dropout
                    layer.exchange.cap = None
            train(comm, run.dnet, data, cfg)
            got = gather_network(run.dnet)
            if got is not None:  # rank 0 of every replica
                _assert_close(got, expected)
            acc = evaluate(run.dnet, data.x_test[:, run.dnet.input_rows], data.y_test)
            assert acc == pytest.approx(float(np.mean(
                np.argmax(predict(expected, data.x_test), axis=1) == data.y_test)), abs=1e-12)
            run.dnet.grid.free()


def test_a_tanh_network_resumes_on_another_grid(comm, mpi_tmp_path):
    net = small_network((20, 24, 18, 6), fan_in=5, seed=6, bias_scale=0.3,
                        activations=("tanh", "gelu"))
    data = _data(net)
    opt = AdamWConfig(lr=0.02)
    cfg = TrainConfig(epochs=3, batch_size=16, optimizer=opt, seed=1)
    expected, _ = reference_train(net, data, 3, 16, opt, seed=1)
    ckpt = str(mpi_tmp_path / "ckpt")
    first = _open(comm, mpi_tmp_path, net, *grids(comm.size)[-1], name="first").dnet
    train(comm, first, data, replace(cfg, max_steps=5, checkpoint_dir=ckpt))
    first.grid.free()
    resumed = _open(comm, mpi_tmp_path, net, comm.size, 1, name="second").dnet
    position, state = load_checkpoint(resumed, ckpt, cfg.planned(len(data.y_train)).settings())
    train(comm, resumed, data, cfg, position, state)
    got = gather_network(resumed)
    if got is not None:  # rank 0 of every replica
        _assert_close(got, expected)
        assert got.activations == ("tanh", "gelu")
    resumed.grid.free()


def test_dead_samples_are_dropped_only_where_relu_gives_exact_zeros(comm, mpi_tmp_path):
    """Inference that drops the samples whose activations died (Graph Challenge mode): a ReLU
    network with negative biases loses samples, the same weights under tanh lose none (tanh
    has no exact zeros to die into), and both give the reference's outputs."""
    from spdnn.reference import forward

    relu = small_network((20, 24, 18, 6), fan_in=5, seed=8, bias_scale=0.1)
    for layer in relu.layers:
        layer.bias[:] = -1.5
    rng = np.random.default_rng(3)
    x = rng.standard_normal((20, 40))
    for net, dies in ((relu, True), (replace(relu, activations=("tanh", "tanh")), False)):
        run = _open(comm, mpi_tmp_path, net, comm.size, 1, name="dead" + str(dies))
        dnet = run.dnet
        fwd = dnet.forward(np.ascontiguousarray(x[dnet.input_rows]), keep=False,
                           drop_dead=True)
        assert (len(fwd.ids) < 40) == dies
        want = forward(net, x)[0][-1][dnet.layers[-1].rows][:, fwd.ids]
        np.testing.assert_allclose(fwd.z_last, want, rtol=0, atol=1e-12)
        dnet.grid.free()
