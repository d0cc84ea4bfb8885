"""Multi-label training and P@k on every grid equal the serial reference (the shipped
extreme-classification sample). Run under mpiexec -n 1, 2, 3 and 4."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from spdnn.io.datasets import load_dataset
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
    cfg = TrainConfig(epochs=2, batch_size=64, sgd=SGD, seed=3, max_steps=14)
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
        if comm.rank == 0:
            _assert_close(got, expected)
        p1, p5 = precisions(run.dnet, local_inputs(run.dnet, data.x_test, "x"), data.y_test,
                            batch_size=37)
        assert (p1, p5) == reference_precisions(expected, data.x_test, data.y_test)
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
