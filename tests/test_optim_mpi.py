"""Every optimizer on P ranks against the serial reference (which tests/test_optim.py holds
against torch.optim): under hypergraph and block plans, on every grid of the communicator
(2 x 2 at P = 4), across a checkpoint resumed on another grid, and with compressed and 2-bit
gradient sums. Run under mpiexec -n 1, 2, 3 and 4."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from spdnn.errors import InputError
from spdnn.lossy.compress import parse_compress
from spdnn.model.schedule import Schedule
from spdnn.optim import AdagradConfig, AdamConfig, AdamWConfig, RMSpropConfig, SGDConfig
from spdnn.reference import train as reference_train
from spdnn.runtime.checkpoint import load_checkpoint
from spdnn.runtime.session import gather_network
from spdnn.runtime.training import TrainConfig, train
from tests.helpers import small_network
from tests.test_replicas_mpi import (
    _assert_close,
    _data,
    _digest,
    _open,
    grids,
    trains_as_the_reference,
)

pytestmark = pytest.mark.mpi

OPTIMIZERS = {
    "nesterov": SGDConfig(0.05, 0.9, 0.01, nesterov=True),
    "adam": AdamConfig(lr=0.01, weight_decay=0.02),
    "adamw": AdamWConfig(lr=0.01, betas=(0.8, 0.99), weight_decay=0.1),
    "rmsprop": RMSpropConfig(lr=0.005, alpha=0.9, weight_decay=0.02, momentum=0.5,
                             centered=True),
    "adagrad": AdagradConfig(lr=0.05, lr_decay=0.05, weight_decay=0.01,
                             initial_accumulator_value=0.1),
}


@pytest.mark.parametrize("method", ["block", "hypergraph"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_optimizer_on_every_grid_equals_the_serial_reference(comm, mpi_tmp_path, method,
                                                                     name):
    net = small_network((20, 24, 18, 6), fan_in=5, seed=1, bias_scale=0.3)
    data = _data(net)
    opt = OPTIMIZERS[name]
    cfg = TrainConfig(epochs=2, batch_size=16, optimizer=opt, seed=7)
    expected, ref = reference_train(net, data, 2, 16, opt, seed=7)
    trains_as_the_reference(comm, mpi_tmp_path, net, data, cfg, expected, ref, method=method,
                            same=("steps", "train_accuracy", "test_accuracy"))


@pytest.mark.parametrize("name", sorted(set(OPTIMIZERS) - {"nesterov", "adamw"}))
def test_an_optimizer_resumes_on_another_grid_as_the_uninterrupted_run(comm, mpi_tmp_path,
                                                                       name):
    """An optimizer's state and step count are checkpointed by name: the first part on the
    grid with the most replicas, the rest on every grid of this P, equal to one serial run; a
    resume with another rate is refused unless changes are allowed."""
    from spdnn.optim import OPTIMIZERS as CLASSES

    net = small_network((20, 24, 18, 6), fan_in=5, seed=5)
    data = _data(net)
    opt = OPTIMIZERS[name]
    full = TrainConfig(epochs=3, batch_size=16, optimizer=opt, seed=1)
    expected, _ = reference_train(net, data, 3, 16, opt, seed=1)
    ckpt = str(mpi_tmp_path / "ckpt")
    run = _open(comm, mpi_tmp_path, net, *grids(comm.size)[-1], name="first")
    train(comm, run.dnet, data, replace(full, max_steps=5, checkpoint_dir=ckpt,
                                        checkpoint_every=5))
    run.dnet.grid.free()
    for parts, replicas in grids(comm.size):
        resumed = _open(comm, mpi_tmp_path, net, parts, replicas, name="second").dnet
        position, state = load_checkpoint(resumed, ckpt, full.settings())
        assert position.step == 5 and state.name == name and state.steps == 5
        kept = CLASSES[name].kept_state(full.settings())
        assert kept and all(set(s) == kept for s in state.state)
        train(comm, resumed, data, full, position, state)
        got = gather_network(resumed)
        if got is not None:  # rank 0 of every replica
            _assert_close(got, expected)
        resumed.grid.free()
    resumed = _open(comm, mpi_tmp_path, net, comm.size, 1, name="third").dnet
    other = replace(full, optimizer=replace(opt, lr=0.02))
    with pytest.raises(InputError, match=f"written with lr {opt.lr:g}, this run has 0.02"):
        load_checkpoint(resumed, ckpt, other.settings())
    sgd = replace(full, optimizer=SGDConfig())
    with pytest.raises(InputError, match=f"written with optimizer {name}, this run has sgd"):
        load_checkpoint(resumed, ckpt, sgd.settings())
    position, state = load_checkpoint(resumed, ckpt, sgd.settings(), allow_changes=True)
    assert position.step == 5 and state is None  # another optimizer starts afresh
    resumed.grid.free()


@pytest.mark.parametrize("kind", ["topk:0.05", "hylo"])
def test_compressed_sums_under_adam_keep_replicas_identical(comm, mpi_tmp_path, kind):
    """Compressed and 2-bit gradient sums feed Adam as they feed SGD: every replica applies
    the same update (bit-identical weights), lossy against the exact sums, and it trains."""
    if comm.size == 1:
        pytest.skip("one replica: nothing is summed")
    net = small_network((20, 40, 30, 6), fan_in=8, seed=3, bias_scale=0.3)
    data = _data(net)
    exact = TrainConfig(epochs=2, batch_size=16, optimizer=OPTIMIZERS["adam"], seed=2)
    cfg = replace(exact, compress=parse_compress(kind))
    parts, replicas = [g for g in grids(comm.size) if g[1] > 1][0]
    dense = _open(comm, mpi_tmp_path, net, parts, replicas).dnet
    train(comm, dense, data, exact)
    run = _open(comm, mpi_tmp_path, net, parts, replicas).dnet
    reports = train(comm, run, data, cfg)
    assert len(set(run.grid.data.allgather(_digest(run)))) == 1, (parts, replicas, kind)
    assert _digest(run) != _digest(dense)  # it is lossy
    assert reports[-1].compression_ratio is not None
    assert reports[-1].loss < reports[0].loss + 0.5
    run.grid.free()
    dense.grid.free()


@pytest.mark.parametrize("name", ["nesterov", "adamw"])
def test_a_schedule_and_clipping_on_every_grid_and_across_a_resume(comm, mpi_tmp_path, name):
    """Cosine with warm-up and clipping at 0.3: every grid equals the serial reference (the
    norm is one scalar over the model axis), and a job stopped by max_steps and resumed on
    another grid ends as one that ran through (the schedule's T is the planned steps)."""
    net = small_network((20, 24, 18, 6), fan_in=5, seed=2, bias_scale=0.3)
    data = _data(net)
    opt = OPTIMIZERS[name]
    schedule = Schedule(kind="cosine", warmup_steps=3, min_lr=opt.lr / 10)
    cfg = TrainConfig(epochs=3, batch_size=16, optimizer=opt, seed=4, schedule=schedule,
                      clip_grad_norm=0.3)
    expected, ref = reference_train(net, data, 3, 16, opt, seed=4, schedule=schedule,
                                    clip_grad_norm=0.3)
    assert sum(r.clipped_steps for r in ref) > 0
    ckpt = str(mpi_tmp_path / "ckpt")
    for i, (parts, replicas) in enumerate(grids(comm.size)):
        run = _open(comm, mpi_tmp_path, net, parts, replicas, name=f"g{i}")
        reports = train(comm, run.dnet, data, cfg)
        assert [r.clipped_steps for r in reports] == [r.clipped_steps for r in ref]
        np.testing.assert_allclose([r.gradient_norm for r in reports],
                                   [r.gradient_norm for r in ref], rtol=1e-10)
        got = gather_network(run.dnet)
        if got is not None:  # rank 0 of every replica
            _assert_close(got, expected)
        run.dnet.grid.free()
    first = _open(comm, mpi_tmp_path, net, *grids(comm.size)[-1], name="first").dnet
    train(comm, first, data, replace(cfg, max_steps=7, checkpoint_dir=ckpt))
    first.grid.free()
    resumed = _open(comm, mpi_tmp_path, net, comm.size, 1, name="second").dnet
    position, state = load_checkpoint(resumed, ckpt, cfg.planned(len(data.y_train)).settings())
    assert position.step == 7
    train(comm, resumed, data, cfg, position, state)
    got = gather_network(resumed)
    if got is not None:  # rank 0 of every replica
        _assert_close(got, expected)
    longer = replace(cfg, epochs=4).planned(len(data.y_train))
    with pytest.raises(InputError, match="planned_steps 12, this run has 16"):
        load_checkpoint(resumed, ckpt, longer.settings())
    resumed.grid.free()


@pytest.mark.parametrize("method", ["block", "hypergraph"])
def test_dropout_on_every_grid_equals_the_serial_reference(comm, mpi_tmp_path, method):
    """Dropout's masks are drawn by (seed, step, layer, neuron, sample): every grid, plan and
    a resume on another grid give the serial weights, on a capped network too; the dropped
    zeros are not sent by the sparse exchange."""
    from spdnn.model.counters import Dropout

    net = small_network((20, 24, 18, 6), fan_in=5, seed=3, bias_scale=0.3, cap=1.5)
    data = _data(net)
    opt = OPTIMIZERS["adamw"]
    drop = Dropout((0.5, 0.25), seed=9)
    cfg = TrainConfig(epochs=2, batch_size=16, optimizer=opt, seed=9, dropout=drop)
    expected, ref = reference_train(net, data, 2, 16, opt, seed=9, dropout=drop)
    trains_as_the_reference(comm, mpi_tmp_path, net, data, cfg, expected, ref, method=method,
                            name="d")
    ckpt = str(mpi_tmp_path / "ckpt")
    first = _open(comm, mpi_tmp_path, net, *grids(comm.size)[-1], method, name="a").dnet
    train(comm, first, data, replace(cfg, max_steps=5, checkpoint_dir=ckpt))
    first.grid.free()
    resumed = _open(comm, mpi_tmp_path, net, comm.size, 1, method, name="b").dnet
    position, state = load_checkpoint(resumed, ckpt, cfg.planned(len(data.y_train)).settings())
    train(comm, resumed, data, cfg, position, state)
    got = gather_network(resumed)
    if got is not None:  # rank 0 of every replica
        _assert_close(got, expected)
    resumed.grid.free()
    if comm.size > 1:  # rows cross ranks: fewer bytes sent with the dropped zeros
        sent = []
        for d in (None, Dropout((0.5, 0.5), seed=9)):
            run = _open(comm, mpi_tmp_path, net, comm.size, 1, method, name="s").dnet
            run.set_exchange("sparse")
            train(comm, run, data, replace(cfg, epochs=1, dropout=d))
            sent.append(comm.allreduce_scalar(float(run.traffic.bytes_sent)))
            run.grid.free()
        assert sent[1] < sent[0]


def test_validation_and_early_stopping_on_every_grid_equal_the_serial_reference(
        comm, mpi_tmp_path):
    """The last quarter of the training samples held out: each epoch's validation loss and
    accuracy equal the reference's on every grid, the best epoch is reported to on_best, and
    early stopping ends the job where the reference's losses say it should."""
    from spdnn.io.dataset import split_validation

    net = small_network((20, 24, 18, 6), fan_in=5, seed=4, bias_scale=0.3)
    data = split_validation(_data(net, n=60), 0.25)
    assert len(data.y_train) == 45 and len(data.y_validation) == 15
    opt = AdamConfig(lr=0.05)
    expected, ref = reference_train(net, data, 8, 16, opt, seed=3)
    losses = [r.validation_loss for r in ref]
    best, since, stop = float("inf"), 0, len(ref)
    for e, v in enumerate(losses):
        best, since = (v, 0) if v < best else (best, since + 1)
        if since >= 1:
            stop = e + 1
            break
    cfg = TrainConfig(epochs=8, batch_size=16, optimizer=opt, seed=3, early_stopping=1)
    for parts, replicas in grids(comm.size):
        run = _open(comm, mpi_tmp_path, net, parts, replicas)
        bests: list = []
        reports = train(comm, run.dnet, data, cfg, on_best=bests.append)
        assert len(reports) == stop
        np.testing.assert_allclose([r.validation_loss for r in reports], losses[:stop],
                                   rtol=1e-10)
        assert [r.validation_accuracy for r in reports] == \
            [r.validation_accuracy for r in ref[:stop]]
        assert all(r.test_accuracy is None for r in reports)
        assert bests[-1].validation_loss == min(r.validation_loss for r in reports)
        run.dnet.grid.free()


def _stop_epoch(losses, patience, min_delta):
    """The epochs scikit-learn's MLP runs under its no-improvement rule (``tol``)."""
    best, since = float("inf"), 0
    for e, v in enumerate(losses):
        since = 0 if v < best - min_delta else since + 1
        best = min(best, v)
        if since >= patience:
            return e + 1
    return len(losses)


def test_early_stopping_on_the_training_loss_with_min_delta_equals_the_reference(
        comm, mpi_tmp_path):
    """Without a validation split, early stopping watches each epoch's training loss and
    counts an epoch lower only when it beats the lowest by more than min_delta
    (scikit-learn's tol): the job ends where that rule, applied to the serial reference's
    losses, says, on every grid."""
    net = small_network((20, 24, 18, 6), fan_in=5, seed=4, bias_scale=0.3)
    data = _data(net, n=60)
    opt = SGDConfig(0.05, 0.9)
    _, ref = reference_train(net, data, 12, 16, opt, seed=3)
    losses = [r.loss for r in ref]
    gains = sorted(a - b for a, b in zip(losses, losses[1:]) if a > b)
    # a min_delta that stops the run part of the way (the oracle's rule decides where)
    min_delta, stop = next((g, s) for g in gains[len(gains) // 2:]
                           if 2 < (s := _stop_epoch(losses, 2, g)) < len(losses))
    cfg = TrainConfig(epochs=12, batch_size=16, optimizer=opt, seed=3, early_stopping=2,
                      min_delta=min_delta)
    for parts, replicas in grids(comm.size):
        run = _open(comm, mpi_tmp_path, net, parts, replicas)
        reports = train(comm, run.dnet, data, cfg)
        assert len(reports) == stop
        np.testing.assert_allclose([r.loss for r in reports], losses[:stop], rtol=1e-10)
        run.dnet.grid.free()
