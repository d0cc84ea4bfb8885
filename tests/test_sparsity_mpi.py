"""Topology updates (SET and RigL) on P ranks against the serial reference: every update, and
so the whole run, the same topology and weights within 1e-10, under hypergraph and block
plans, on every grid of the communicator (2 x 2 at P = 4), and across a checkpoint resumed on
another grid. Run under mpiexec -n 1, 2, 3 and 4."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from spdnn.model.counters import Dropout
from spdnn.model.plan import network_patterns, plan_statistics
from spdnn.model.sparsity import SparseUpdate
from spdnn.optim import AdamConfig, SGDConfig
from spdnn.reference import train as reference_train
from spdnn.runtime.checkpoint import adopt_topology, load_checkpoint
from spdnn.runtime.session import gather_network
from spdnn.runtime.training import TrainConfig, train
from tests.helpers import small_network
from tests.test_replicas_mpi import _assert_close, _data, _open, grids

pytestmark = pytest.mark.mpi

# (optimizer, dropout): SGD with momentum and weight decay; Adam's two moments under dropout
RECIPES = {"set": (SGDConfig(0.05, 0.9, 0.01), None),
           "rigl": (AdamConfig(lr=0.01, weight_decay=0.02), (0.2, 0.1))}


def _setup(mode: str, scope: str = "row", **changes):  # noqa: ANN202
    net = small_network((20, 24, 18, 6), fan_in=5, seed=1, bias_scale=0.3)
    data = _data(net)
    opt, rates = RECIPES[mode]
    update = SparseUpdate(mode=mode, every=3, drop_fraction=0.4, until=0.9, seed=7,
                          scope=scope)
    dropout = Dropout(rates, seed=7) if rates else None
    cfg = TrainConfig(epochs=3, batch_size=16, optimizer=opt, seed=7, dropout=dropout,
                      sparse_update=update, **changes)
    return net, data, cfg


def _reference(net, data, cfg, owners=None):  # noqa: ANN001, ANN202
    updates: list = []
    expected, ref = reference_train(net, data, cfg.epochs, cfg.batch_size, cfg.optimizer,
                                    seed=cfg.seed, dropout=cfg.dropout,
                                    sparse_update=cfg.sparse_update, owners=owners,
                                    on_update=lambda step, counts: updates.append(
                                        (step, sum(c["dropped"] for c in counts),
                                         sum(c["grown"] for c in counts))))
    return expected, ref, updates


def _volume(net, plan) -> int:  # noqa: ANN001
    """Rows a step moves under ``plan`` for ``net``'s topology (expand and fold)."""
    stats = plan_statistics(network_patterns(net), plan.owners, parts=plan.parts)
    return stats.forward_total + stats.backward_total


@pytest.mark.parametrize("method", ["block", "hypergraph"])
@pytest.mark.parametrize("scope", ["row", "layer"])
@pytest.mark.parametrize("mode", ["set", "rigl"])
def test_updates_on_every_grid_equal_the_serial_reference(comm, mpi_tmp_path, method, scope,
                                                          mode):
    net, data, cfg = _setup(mode, scope)
    expected, ref, updates = _reference(net, data, cfg)
    assert len(updates) >= 3 and all(d == g and d > 0 for _, d, g in updates[:2])
    assert any(not np.array_equal(a.weight.indices, b.weight.indices)
               for a, b in zip(expected.layers, net.layers))  # the topology moved
    for parts, replicas in grids(comm.size):
        run = _open(comm, mpi_tmp_path, net, parts, replicas, method)
        records: list = []
        reports = train(comm, run.dnet, data, cfg, on_update=records.append)
        np.testing.assert_allclose([r.loss for r in reports], [r.loss for r in ref],
                                   rtol=1e-10)
        assert [(r.step, r.dropped, r.grown) for r in records] == updates, (parts, replicas)
        # the rows a step moves: the plan's volume on the first and on the final topology
        assert records[0].rows_before == _volume(net, run.dnet.plan), (parts, replicas)
        assert records[-1].rows_per_step == _volume(expected, run.dnet.plan), (parts, replicas)
        assert all(a.rows_per_step == b.rows_before for a, b in zip(records, records[1:]))
        got = gather_network(run.dnet)
        if got is not None:  # rank 0 of every replica
            _assert_close(got, expected)
        run.dnet.grid.free()


@pytest.mark.parametrize("mode", ["set", "rigl"])
def test_a_resume_on_another_grid_continues_the_topology(comm, mpi_tmp_path, mode):
    """Stopped after two updates on the grid with the most replicas and resumed on every grid
    of this P (the checkpoint carries the topology): the same end as one serial run."""
    net, data, full = _setup(mode)
    expected, _, _ = _reference(net, data, full)
    ckpt = str(mpi_tmp_path / "ckpt")
    first = _open(comm, mpi_tmp_path, net, *grids(comm.size)[-1], name="first")
    train(comm, first.dnet, data, replace(full, max_steps=7, checkpoint_dir=ckpt,
                                          checkpoint_every=7))
    first.dnet.grid.free()
    for parts, replicas in grids(comm.size):
        resumed = _open(comm, mpi_tmp_path, net, parts, replicas, name="second").dnet
        adopt_topology(resumed, ckpt)
        planned = full.planned(len(data.y_train))  # the step updates end at, as a job has it
        position, state = load_checkpoint(resumed, ckpt, planned.settings())
        assert position.step == 7
        train(comm, resumed, data, full, position, state)
        got = gather_network(resumed)
        if got is not None:  # rank 0 of every replica
            _assert_close(got, expected)
        resumed.grid.free()


@pytest.mark.parametrize(("mode", "scope"), [("set", "row"), ("rigl", "row"), ("rigl", "layer")])
def test_growth_near_the_rank_equals_the_reference_given_the_plan(comm, mpi_tmp_path, mode,
                                                                   scope):
    """--grow-locality 4: growth favours the columns the row's rank holds, so the run depends
    on the plan (not on P otherwise): every grid equals the reference told that plan."""
    net, data, plain = _setup(mode, scope)
    cfg = replace(plain, sparse_update=replace(plain.sparse_update, locality=4.0))
    anywhere, _, _ = _reference(net, data, plain)
    for parts, replicas in grids(comm.size):
        run = _open(comm, mpi_tmp_path, net, parts, replicas)
        expected, ref, _ = _reference(net, data, cfg, run.dnet.plan.owners)
        if parts > 1:  # the plan changed where it grew
            assert any(not np.array_equal(a.weight.indices, b.weight.indices)
                       for a, b in zip(expected.layers, anywhere.layers))
        reports = train(comm, run.dnet, data, cfg)
        np.testing.assert_allclose([r.loss for r in reports], [r.loss for r in ref],
                                   rtol=1e-10)
        got = gather_network(run.dnet)
        if got is not None:  # rank 0 of every replica
            _assert_close(got, expected)
        run.dnet.grid.free()


@pytest.mark.parametrize("scope", ["row", "layer"])
def test_a_huge_grow_locality_in_float32_grows_as_the_reference(comm, mpi_tmp_path, scope):
    """--grow-locality 1e39 (finite, beyond float32's range) under RigL in float32: scores
    weighted in float64 and kept finite, so every row's columns stay distinct and every grid
    grows what the reference grows."""
    net, data, plain = _setup("rigl", scope)
    net = net.astype(np.float32)
    cfg = replace(plain, sparse_update=replace(plain.sparse_update, locality=1e39))
    for parts, replicas in grids(comm.size):
        run = _open(comm, mpi_tmp_path, net, parts, replicas)
        expected, _, _ = _reference(net, data, cfg, run.dnet.plan.owners)
        train(comm, run.dnet, data, cfg)
        got = gather_network(run.dnet)
        if got is not None:  # rank 0 of every replica
            for a, b in zip(got.layers, expected.layers):
                np.testing.assert_array_equal(a.weight.indptr, b.weight.indptr)
                np.testing.assert_array_equal(a.weight.indices, b.weight.indices)
                rows = np.repeat(np.arange(a.weight.shape[0]), np.diff(a.weight.indptr))
                assert len(np.unique(rows * a.weight.shape[1] + a.weight.indices)) == \
                    a.weight.nnz
        run.dnet.grid.free()


@pytest.mark.parametrize("replan", ["every:1", "auto"])
def test_replanning_moves_rows_and_changes_no_result(comm, mpi_tmp_path, replan):
    """--replan refines the plan for the topology after each update and moves the rows that
    change owner with their weights and state: the run still equals the serial reference, the
    rows a step are the final plan's volume for the final topology, and the traffic counted
    equals what the schedules in force predicted, topology by topology."""
    from partition.replan import refine_plan
    from spdnn.runtime.accounting import accounting

    net, data, cfg = _setup("rigl", "layer")
    cfg = replace(cfg, sparse_update=replace(cfg.sparse_update, replan=replan),
                  replanner=refine_plan)
    expected, ref, _ = _reference(net, data, cfg)
    for parts, replicas in grids(comm.size):
        run = _open(comm, mpi_tmp_path, net, parts, replicas, "block")
        first = run.dnet.plan
        records: list = []
        reports = train(comm, run.dnet, data, cfg, on_update=records.append)
        np.testing.assert_allclose([r.loss for r in reports], [r.loss for r in ref],
                                   rtol=1e-10)
        assert records[-1].rows_per_step == _volume(expected, run.dnet.plan)
        if replan == "every:1":
            assert all(r.replanned for r in records)
        assert all(0 < r.replan_seconds <= r.seconds for r in records)
        if parts > 1 and replan == "every:1":  # a block plan leaves room to refine
            assert sum(r.rows_moved for r in records) > 0
            assert _volume(expected, run.dnet.plan) < _volume(expected, first)
        report = accounting(run.dnet.grid.world, run.dnet.traffic, (
            np.zeros(run.dnet.n_layers, np.int64), np.zeros(run.dnet.n_layers, np.int64),
            "schedule"), run.dnet.dtype.itemsize, run.dnet.grid.data,
            run.dnet.updates.predicted())
        assert report.equal, (parts, replicas)
        got = gather_network(run.dnet)
        if got is not None:  # rank 0 of every replica
            _assert_close(got, expected)
        run.dnet.grid.free()
