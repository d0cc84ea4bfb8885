"""Each rank's memory: the job reports its measured peak, what it held by kind and the
prediction for its shapes; the prediction counts exactly the arrays a rank holds, and the
offline prediction (from the network's patterns and the plan, no job) sees the same shapes as
the job, under any communicator size."""

from __future__ import annotations

import numpy as np
import pytest

import spdnn
from partition import partition
from spdnn.cost.workload import workload
from spdnn.model.memory import shapes_of
from spdnn.model.plan import network_patterns
from tests.helpers import small_network

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_a_job_reports_each_ranks_peak_and_the_prediction_counts_what_it_held(comm, dtype):
    net = small_network((64, 40, 30, 10), fan_in=7, seed=4)
    plan = partition(net, parts=comm.size, method="cyclic")
    run = spdnn.RunOptions(plan=plan, dtype=dtype)
    result = spdnn.train(net, data="digits", run=run, comm=comm,
                         options=spdnn.TrainOptions(epochs=1, batch_size=32, lr=0.05,
                                                    momentum=0.9, max_steps=5))
    mem = result.memory
    assert [len(mem[k]) for k in ("peak_bytes", "predicted_bytes", "held_bytes")] == \
        [comm.size] * 3
    for peak, pred, held in zip(mem["peak_bytes"], mem["predicted_bytes"], mem["held_bytes"]):
        # The weights and the training state (transpose, gradients, momentum) are counted
        # to the byte; the buffers are bounded by the prediction; the peak holds all of it.
        assert pred["weights"] == held["weights"] > 0
        assert pred["training"] == held["training"] > 0
        assert 0 < held["buffers"] <= pred["buffers"]
        assert pred["data"] == held["data"] > 0
        assert peak >= sum(held.values()) and peak > 50e6
    inferred = spdnn.infer(net, inputs="digits", run=run, comm=comm)
    for pred, held in zip(inferred.memory["predicted_bytes"], inferred.memory["held_bytes"]):
        assert pred["training"] == held["training"] == 0
        assert pred["weights"] == held["weights"]


@pytest.mark.parametrize("sizes, lsh", [((256, 40, 128), "2:3:6"),
                                        ((256, 48, 40, 128), "2:3:6:simhash"),
                                        ((256, 48, 40, 128), "1:3:6:simhash")])
def test_the_prediction_counts_the_lsh_tables(comm, sizes, lsh):
    from pathlib import Path

    sample = Path(__file__).resolve().parents[1] / "data" / "xc-sample"
    net = small_network(sizes, fan_in=24, seed=5, bias_scale=0.1)
    plan = partition(net, parts=comm.size, method="block")
    result = spdnn.train(net, data=f"xc:{sample}", run=spdnn.RunOptions(plan=plan), comm=comm,
                         options=spdnn.TrainOptions(epochs=1, batch_size=64, lr=0.1,
                                                    max_steps=3, lsh=lsh))
    layer = int(lsh.split(":")[0])
    last = net.layers[layer - 1].weight.tocsr()
    for rank, (pred, held) in enumerate(zip(result.memory["predicted_bytes"],
                                            result.memory["held_bytes"])):
        assert pred["weights"] == held["weights"]  # 6 tables of int32 keys and rows included
        # The sampled layer has no transpose and no full gradient: the prediction counts its
        # compact gradient at its bound (every row active), nothing more.
        rows = plan.rows_of(rank, layer)
        bound = (last[rows].nnz + len(rows)) * 8
        assert held["training"] <= pred["training"] <= held["training"] + bound, (pred, held)


def test_a_model_part_holds_only_its_features_of_the_images(comm, mpi_tmp_path):
    """Graph Challenge inference under a plan: each rank reads its first layer's features of
    the images and holds them once (the data counted is that selection, not every feature),
    and the memory check before loading counts them."""
    from spdnn.comm.mpi import AgreedError
    from spdnn.io.images import read_image_share, write_image_npz
    from spdnn.model.generate import radixnet
    from spdnn.reference import challenge_infer
    from spdnn.runtime.memory_report import data_nbytes
    from tests.test_runtime_mpi import _images

    net = radixnet(1024, 6, seed=0, dtype="float32")
    images = _images(50)
    path = mpi_tmp_path / "images.npz"
    if comm.rank == 0:
        write_image_npz(path, images)
    comm.barrier()
    plan = partition(net, parts=comm.size, method="block")
    result = spdnn.infer(net, inputs=str(path), run=spdnn.RunOptions(plan=plan), comm=comm)
    np.testing.assert_array_equal(result.categories, challenge_infer(net, images).categories)
    for rank, held in enumerate(result.memory["held_bytes"]):
        mine = read_image_share(path, 1024, features=plan.rows_of(rank, 0), dtype="float32")
        assert held["data"] == data_nbytes([mine.matrix])
        assert comm.size == 1 or held["data"] < data_nbytes([images.astype("float32")])
    # The check before loading counts the images too: a limit that every rank's prediction
    # without them fits, and that the images put over, is refused on every rank (streaming
    # the layers is tried first: no block fits beside the images either).
    pred = result.memory["predicted_bytes"]
    limit = max(p["total"] - p["data"] for p in pred) + 1
    assert any(p["total"] > limit for p in pred)
    with pytest.raises(AgreedError, match="is over the allowed|no block of layers fits"):
        spdnn.infer(net, inputs=str(path), comm=comm,
                    run=spdnn.RunOptions(plan=plan, memory_limit=limit))
    # (the baseline is measured again by each job: this process may have grown a little since)
    assert spdnn.infer(net, inputs=str(path), comm=comm, run=spdnn.RunOptions(
        plan=plan, memory_limit=max(p["total"] for p in pred) + 20_000_000)).categories \
        is not None


def test_the_offline_prediction_sees_the_shapes_of_the_job(comm):
    from spdnn.runtime.memory_report import shapes
    from spdnn.runtime.session import open_network

    net = small_network((50, 36, 28, 10), fan_in=5, seed=9)
    plan = partition(net, parts=comm.size, method="random", seed=1)
    opened = open_network(comm, net, plan)
    offline = shapes_of(workload(network_patterns(net), plan), comm.rank)
    assert shapes(opened.dnet) == offline
    assert np.all([s.nnz for s in offline])


def test_the_shapes_counted_before_loading_are_those_of_the_loaded_network(comm, mpi_tmp_path):
    from spdnn.io.bundle import NetworkBundle, save_network
    from spdnn.runtime.grid import Grid
    from spdnn.runtime.memory_budget import planned_shapes
    from spdnn.runtime.memory_report import shapes
    from spdnn.runtime.session import open_network

    net = small_network((50, 36, 28, 10), fan_in=5, seed=11)
    path = mpi_tmp_path / "net.npz"
    if comm.rank == 0:
        save_network(net, path)
    comm.barrier()
    plan = partition(net, parts=comm.size, method="random", seed=2)
    with NetworkBundle(path) as bundle:
        before = planned_shapes(Grid.make(comm, plan.parts), bundle, plan)
    opened = open_network(comm, str(path), plan)
    assert before == shapes(opened.dnet)


def test_a_job_over_its_limit_is_refused_on_every_rank_and_a_dry_run_reports(comm):
    from spdnn.comm.mpi import AgreedError
    from spdnn.runtime.memory_budget import DryRun

    net = small_network((64, 2000, 30, 10), fan_in=64, seed=4)  # 1.5 MB of layer 1
    plan = partition(net, parts=comm.size, method="cyclic")
    options = spdnn.TrainOptions(epochs=1, batch_size=32, max_steps=2)
    dry = spdnn.RunOptions(plan=plan, memory_limit=0, dry_run=True)
    with pytest.raises(DryRun) as done:
        spdnn.train(net, data="digits", run=dry, options=options, comm=comm)
    from spdnn.runtime import memory_report

    # 0.3 MB above every rank's baseline (measured by the dry run), below what each holds
    limit = max(comm.allgather(memory_report.baseline())) + 300_000
    tight = spdnn.RunOptions(plan=plan, memory_limit=limit)
    with pytest.raises(AgreedError, match=rf"rank \d+: predicted peak [0-9.]+ MB is over the "
                                          rf"allowed {limit / 1e6:.2f} MB \(--memory-limit\); "
                                          r"about \d+ ranks would fit"):
        spdnn.train(net, data="digits", run=tight, options=options, comm=comm)
    if comm.rank == 0:
        table = str(done.value).splitlines()
        assert len(table) == 2 + comm.size and table[-1].split()[-1] == "none"
