"""Multi-label training and P@k on every grid equal the serial reference (the shipped
extreme-classification sample). Run under mpiexec -n 1, 2, 3 and 4."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from spdnn.io.dataset import Dataset
from spdnn.io.loaders import load_dataset
from spdnn.io.xc_synthetic import XCTask, synthetic_xc
from spdnn.kernels import sparse_inputs
from spdnn.reference import precisions as reference_precisions
from spdnn.reference import train as reference_train
from spdnn.runtime.inference import local_inputs, precisions
from spdnn.runtime.session import gather_network
from spdnn.runtime.training import TrainConfig, train
from tests.helpers import small_network
from tests.test_replicas_mpi import SGD, _assert_close, _open, grids

pytestmark = pytest.mark.mpi
SAMPLE = Path(__file__).resolve().parents[1] / "data" / "xc-sample"


@pytest.mark.parametrize("method", ["block", "hypergraph"])
def test_multi_label_training_on_every_grid_equals_the_serial_reference(
        comm, mpi_tmp_path, method):
    data = load_dataset(f"xc:{SAMPLE}", "float64")
    net = small_network((256, 40, 128), fan_in=24, seed=5, bias_scale=0.1)
    cfg = TrainConfig(epochs=2, batch_size=64, optimizer=SGD, seed=3, max_steps=14)
    expected, ref_reports = reference_train(net, data, 2, 64, SGD, seed=3, max_steps=14)
    assert ref_reports[-1].precision_at_5 is not None
    for parts, replicas in grids(comm.size):
        run = _open(comm, mpi_tmp_path, net, parts, replicas, method, name="xc")
        reports = train(comm, run.dnet, data, cfg)
        np.testing.assert_allclose([r.loss for r in reports], [r.loss for r in ref_reports],
                                   rtol=1e-12)
        for field in ("train_accuracy", "test_accuracy", "precision_at_1", "precision_at_5"):
            assert [getattr(r, field) for r in reports] == \
                [getattr(r, field) for r in ref_reports], field
        got = gather_network(run.dnet)
        if got is not None:  # rank 0 of every replica
            _assert_close(got, expected)
        p1, p5 = precisions(run.dnet, local_inputs(run.dnet, data.x_test, "x"), data.y_test,
                            batch_size=37)
        assert (p1, p5) == reference_precisions(expected, data.x_test, data.y_test)
        run.dnet.grid.free()


def test_sparse_inputs_skipped_rows_train_to_the_serial_reference(comm, mpi_tmp_path,
                                                                 monkeypatch):
    """Inputs of 3,000 features, about 8 a sample: in a batch of 32 most input rows are zero,
    and the first layer skips them where a rank holds its replica's rows."""
    task = XCTask(train_samples=200, test_samples=40, features=3_000, labels=150,
                  features_per_sample=8.0)
    x, y, xt, yt = synthetic_xc(task, seed=4)
    data = Dataset(name="xc-sparse", x_train=x.astype(np.float64), y_train=y,
                   x_test=xt.astype(np.float64), y_test=yt)
    net = small_network((3_000, 24, 150), fan_in=200, seed=6, bias_scale=0.1)
    cfg = TrainConfig(epochs=1, batch_size=32, optimizer=SGD, seed=3, max_steps=6)
    expected, ref_reports = reference_train(net, data, 1, 32, SGD, seed=3, max_steps=6)
    calls = []
    spmm_act = sparse_inputs.spmm_act
    monkeypatch.setattr(sparse_inputs, "spmm_act", lambda *a: calls.append(1) or spmm_act(*a))
    for parts, replicas in grids(comm.size):
        calls.clear()
        run = _open(comm, mpi_tmp_path, net, parts, replicas, "block", name="xc-sparse")
        reports = train(comm, run.dnet, data, cfg)
        np.testing.assert_allclose([r.loss for r in reports], [r.loss for r in ref_reports],
                                   rtol=1e-12)
        got = gather_network(run.dnet)
        if got is not None:  # rank 0 of every replica
            _assert_close(got, expected)
        if parts == 1 and sparse_inputs.live_rows(np.zeros((2, 1))) is not None:
            assert calls  # the numba backend took the skipping kernels
        run.dnet.grid.free()


def test_infer_on_label_sets_names_p_at_1_and_p_at_5(comm, mpi_tmp_path):
    import spdnn
    from partition import partition

    data = load_dataset(f"xc:{SAMPLE}", "float64")
    net = small_network((data.n_features, 24, data.n_classes), fan_in=6, seed=3)
    run = spdnn.RunOptions(plan=partition(net, parts=comm.size, method="cyclic"),
                           dtype="float64")
    got = spdnn.infer(net, inputs=f"xc:{SAMPLE}", run=run, comm=comm)
    want = reference_precisions(net, data.x_test, data.y_test)
    assert (got.precision_at_1, got.precision_at_5) == pytest.approx(want, abs=1e-12)
    assert got.accuracy == got.precision_at_1
