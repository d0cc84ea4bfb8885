"""The cost model: calibration and cluster files, the replay's arithmetic, the
``spdnn-partition model`` and ``spdnn calibrate`` commands, and the exact counts at 8 ranks."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import numpy as np
import pytest

from partition.methods import partition_network
from spdnn.cost.cluster import Machine, allreduce_seconds, load_cluster
from spdnn.cost.costmodel import LOSS_COLLECTIVES, predict, single_part, working_set
from spdnn.cost.machine import (
    SCALE_KEYS,
    Calibration,
    DenseTable,
    KernelTable,
    Network,
    Scales,
    Structure,
    load_calibration,
)
from spdnn.cost.workload import locality, workload
from spdnn.errors import InputError
from spdnn.io.bundle import save_network
from spdnn.io.planfile import save_plan
from spdnn.model.generate import add_head, radixnet, random_network
from spdnn.model.plan import network_patterns
from tests.helpers import (
    MPIEXEC,
    NO_MPIEXEC,
    ROOT,
    assert_one_line_error,
    dry_run_baseline,
    launch,
    run_spdnn,
    small_network,
)

RUNTIME = {"layer_forward_s": 3e-5, "layer_backward_s": 5e-5, "step_s": 2e-5, "message_s": 1e-6,
           "exchange_layer_s": 4e-5, "pack_ns_per_byte": 0.1, "update_ns_per_value": 0.8,
           "elementwise_ns_per_value": 0.2, "collective_s": 2e-6, "compute_scale_alone": 1.0,
           "compute_scale_all": 1.0, "compute_scale_cold_alone": 1.0,
           "compute_scale_cold_all": 1.0, "cache_bytes": 0.0, "compute_scale_spread": 0.1,
           "gather_ns_per_value": 0.3, "round_ns_per_value": 0.0}


def calibration(ns: float = 0.5, network: bool = True, structure: Structure | None = None
                ) -> Calibration:
    """A calibration with flat kernel tables (``ns`` per nonzero x sample)."""
    table = KernelTable(batches=(8, 512), inputs=(256, 65536), reuses=(1, 128),
                        ns={k + warm: np.full((2, 2, 2), ns * f) for k, f in
                         (("forward", 1.0), ("backward", 2.0), ("gradient", 1.0))
                         for warm in ("", "_warm")})
    net = Network(latency_s=2e-6, bandwidth_Bps=5e9, allreduce_latency_s=5e-6,
                  allreduce_bandwidth_Bps=3e9, pingpong_bytes=(), pingpong_s=(),
        allreduce_bytes=(8.0, 2**20), allreduce_s=(5e-6, 5e-6 + 2**20 / 3e9)) \
        if network else None
    return Calibration(host="test", ranks=2, backend="numba", kernels={"float32": table,
                                                                       "float64": table},
        runtime=dict(RUNTIME),
                       network=net, structure=structure)


# Per batch: alone 2.0 at 32 and 1.0 at 256, every rank at once 3.0 and 1.5 (cache_bytes is 0:
# every step runs on the cold scales, set to the same).
SCALES = Scales((32, 256), {"alone": (2.0, 1.0), "all": (3.0, 1.5), "cold_alone": (2.0, 1.0),
                            "cold_all": (3.0, 1.5)})

CLUSTER = {"format": "spdnn-cluster/1", "name": "test", "ranks_per_node": 4,
           "intra_node": {"latency_us": 0.5, "bandwidth_GBps": 10},
           "inter_node": {"latency_us": 2.0, "bandwidth_GBps": 20}}


def test_one_rank_prediction_is_the_sum_of_its_terms():
    net = small_network((20, 30, 10), fan_in=5, seed=1)
    cal = calibration()
    w = workload(network_patterns(net), single_part(net.sizes))
    b, ew = 16, RUNTIME["elementwise_ns_per_value"] * 1e-9
    nnz = [lay.nnz for lay in net.layers]
    rows = [lay.n_out for lay in net.layers]
    forward = sum(RUNTIME["layer_forward_s"] + 0.5e-9 * n * b for n in nnz)
    loss = LOSS_COLLECTIVES * RUNTIME["collective_s"] + rows[-1] * b * 4 * ew
    backward = (RUNTIME["layer_backward_s"] + 0.5e-9 * nnz[0] * b + rows[0] * b * ew) + \
        (RUNTIME["layer_backward_s"] + 1e-9 * nnz[1] * b + rows[1] * b * ew + 30 * b * ew)
    # The update alone: the products read the weights in place (an old calibration's
    # gather_ns_per_value, above, is ignored).
    update = (sum(nnz) + sum(rows)) * RUNTIME["update_ns_per_value"] * 1e-9 + RUNTIME["step_s"]
    p = predict(w, Machine(cal), b, 1)
    assert p.seconds == pytest.approx(forward + loss + backward + update, rel=1e-12)
    assert p.exchange == pytest.approx(LOSS_COLLECTIVES * RUNTIME["collective_s"])
    inference = predict(w, Machine(cal), b, 1, training=False)
    assert inference.seconds == pytest.approx(forward + loss, rel=1e-12)


def test_a_bfloat16_step_reads_its_own_tables_and_rounds_the_weights_copy(tmp_path):
    """Under bfloat16 the kernels are timed from the bfloat16 tables and the update adds the
    rounded copy of the weights at its calibrated ns per weight; a file without them times
    the kernels as float32's and the copy as an element-wise pass. The file keeps both."""
    net = small_network((20, 30, 10), fan_in=5, seed=1)
    w = workload(network_patterns(net), single_part(net.sizes))
    b, nnz = 16, sum(lay.nnz for lay in net.layers)
    old = calibration()
    float32 = predict(w, Machine(old), b, 1).seconds
    # the flat tables' kernel seconds: forward, the first layer's gradient, the backward pass
    kernel_s = 0.5e-9 * nnz * b + 0.5e-9 * net.layers[0].nnz * b + 1e-9 * net.layers[1].nnz * b
    ew = RUNTIME["elementwise_ns_per_value"] * 1e-9
    assert predict(w, Machine(old), b, 1, dtype="bfloat16").seconds == \
        pytest.approx(float32 + nnz * ew, rel=1e-12)
    half = calibration(ns=0.3)
    new = replace(old, kernels={**old.kernels, "bfloat16": half.kernels["float32"]},
                  runtime={**old.runtime, "round_ns_per_value": 0.7})
    assert predict(w, Machine(new), b, 1).seconds == float32
    assert predict(w, Machine(new), b, 1, dtype="bfloat16").seconds == \
        pytest.approx(float32 - kernel_s * (1 - 0.3 / 0.5) + nnz * 0.7e-9, rel=1e-12)
    path = tmp_path / "m.json"
    path.write_text(json.dumps(new.to_json()))
    loaded = load_calibration(path)
    assert set(loaded.kernels) == {"float32", "float64", "bfloat16"}
    assert loaded.round_ns() == 0.7 and load_calibration_of(old, tmp_path).round_ns() == \
        RUNTIME["elementwise_ns_per_value"]


def load_calibration_of(cal: Calibration, tmp_path) -> Calibration:
    path = tmp_path / "old.json"
    path.write_text(json.dumps(cal.to_json()))
    return load_calibration(path)


def test_each_optimizers_update_is_timed_at_its_own_calibrated_cost(tmp_path):
    """A step's update costs the optimizer's own ns per stored value (spdnn calibrate
    measures every optimizer's); a calibration that measured only SGD's times every
    optimizer at SGD's. The file keeps the figures (updates_ns_per_value)."""
    from spdnn.optim import AdamConfig, RMSpropConfig, SGDConfig

    net = small_network((20, 30, 10), fan_in=5, seed=1)
    w = workload(network_patterns(net), single_part(net.sizes))
    values = sum(lay.nnz + lay.n_out for lay in net.layers)
    old = calibration()
    new = replace(old, updates={"sgd": RUNTIME["update_ns_per_value"], "adam": 7.0,
                                "rmsprop": 3.0})
    sgd = predict(w, Machine(new), 16, 1).seconds
    assert predict(w, Machine(new), 16, 1, optimizer=SGDConfig()).seconds == sgd
    for config, ns in ((AdamConfig(), 7.0), (RMSpropConfig(), 3.0)):
        got = predict(w, Machine(new), 16, 1, optimizer=config).seconds
        assert got - sgd == pytest.approx(values * (ns - RUNTIME["update_ns_per_value"])
                                          * 1e-9, rel=1e-9)
        assert predict(w, Machine(old), 16, 1, optimizer=config).seconds == sgd
    path = tmp_path / "m.json"
    path.write_text(json.dumps(new.to_json()))
    assert load_calibration(path).updates == new.updates
    path.write_text(json.dumps(old.to_json()))
    assert load_calibration(path).updates == {}


def test_the_working_set_counts_the_optimizers_state():
    from spdnn.cost.costmodel import working_set

    net = small_network((20, 30, 10), fan_in=5, seed=1)
    w = workload(network_patterns(net), single_part(net.sizes))
    nnz = sum(lay.nnz for lay in net.layers)
    assert working_set(w, 8, 4, 2)[0] - working_set(w, 8, 4, 1)[0] == nnz * 4
    assert working_set(w, 8, 8, 0)[0] - working_set(w, 8, 8, 1)[0] == -nnz * 8
    # bfloat16: a 16-bit copy of each weight beside the master, 16-bit X buffers and outputs
    rows = sum(lay.n_out for lay in net.layers)
    buffers = sum(lay.n_in for lay in net.layers)  # one part: every input row is read
    assert working_set(w, 8, 4, 1)[0] - working_set(w, 8, 4, 1, 2)[0] == \
        -nnz * 2 + 8 * (buffers + rows) * 2


def test_kernel_table_interpolates_in_log2_of_reuse_and_clamps():
    ns = np.empty((2, 2, 2))
    ns[0], ns[1] = 2.0, 0.5  # reuse 1: 2 ns per nonzero x sample; reuse 128: 0.5
    table = KernelTable(batches=(8, 512), inputs=(256, 65536), reuses=(1, 128), ns={"forward": ns})
    nnz, b = np.array([1e6, 1e6, 1e6, 1e6]), 64
    t = table.seconds("forward", nnz, b, np.array([1024] * 4), np.array([0.25, 1, 2**3.5, 1e4]))
    assert t == pytest.approx(nnz * b * 1e-9 * np.array([2.0, 2.0, 1.25, 0.5]), rel=1e-12)
    # Without an explicit reuse, nonzeros per buffer row.
    default = table.seconds("forward", np.array([128 * 1024.0]), b, np.array([1024]))
    assert default == pytest.approx(128 * 1024 * b * 0.5e-9, rel=1e-12)


def test_measured_pingpong_curve_replaces_the_bandwidth():
    net = Network(latency_s=1e-6, bandwidth_Bps=1e9, allreduce_latency_s=1e-6,
                  allreduce_bandwidth_Bps=1e9, pingpong_bytes=(8.0, 1024.0, 2048.0),
        pingpong_s=(1e-6, 2e-6, 4e-6))
    got = net.transfer(np.array([8, 1024, 1536, 3072]))
    assert got == pytest.approx([0.0, 1e-6, 2e-6, 5e-6], rel=1e-12)  # past the end: 2 us/KiB
    assert Network(latency_s=1e-6, bandwidth_Bps=1e9, allreduce_latency_s=1e-6,
                   allreduce_bandwidth_Bps=1e9).transfer(np.array([1e9])) == pytest.approx([1.0])


def test_dense_blocks_are_timed_from_the_dense_table():
    """A dense layer goes to BLAS in the runtime: its blocks (a whole head on one part, its
    owned and ghost column blocks on two) take the dense table's time, sparse layers the
    sparse one's."""
    dense_ns = {"forward": np.full((2, 2), 0.05), "backward": np.full((2, 2), 0.1),
                "gradient": np.full((2, 2), 0.05)}
    flat = calibration()
    with_dense = replace(flat, kernels={d: replace(t, dense=DenseTable((1024, 2**20), (8, 512),
                                                                        dense_ns))
                                        for d, t in flat.kernels.items()})
    net = add_head(random_network([256, 512], 16, seed=4, dtype="float32"), 10, seed=0)
    pats = network_patterns(net)
    b = 32
    head = 10 * 512 * b * 1e-9  # the head's nonzeros x samples, in ns -> s
    for plan in (single_part(net.sizes), partition_network(pats, 2, method="block", seed=0)):
        w = workload(pats, plan)
        sparse, dense = predict(w, Machine(flat), b, 1), predict(w, Machine(with_dense), b, 1)
        # Forward 0.5 -> 0.05 ns, backward 1.0 -> 0.1 ns per nonzero x sample: the head only.
        saved = head * (0.45 + 0.9) / plan.parts
        assert sparse.compute_kernels - dense.compute_kernels == pytest.approx(saved, rel=1e-9)
        assert dense.layers[0] == pytest.approx(sparse.layers[0], rel=1e-12)


def test_measured_allreduce_curve_replaces_the_straight_line():
    net = Network(latency_s=1e-6, bandwidth_Bps=1e9, allreduce_latency_s=1e-6,
                  allreduce_bandwidth_Bps=1e9, pingpong_bytes=(), pingpong_s=(),
        allreduce_bytes=(8.0, 1024.0, 2048.0), allreduce_s=(3e-6, 5e-6, 9e-6))
    assert net.allreduce(512) == pytest.approx(3e-6 + 2e-6 * 504 / 1016)
    assert net.allreduce(4) == pytest.approx(3e-6)  # below the curve: its first point
    assert net.allreduce(3072) == pytest.approx(13e-6)  # past the end: its last rate
    assert Network(latency_s=1e-6, bandwidth_Bps=1e9, allreduce_latency_s=1e-6,
                   allreduce_bandwidth_Bps=1e9).allreduce(512) is None
    # Over the ranks it was measured on, as measured; over 8, three doubling steps for one.
    assert allreduce_seconds(1024, 2, net, 0.0, measured_ranks=2) == pytest.approx(5e-6)
    assert allreduce_seconds(1024, 8, net, 0.0, measured_ranks=2) == pytest.approx(15e-6)
    assert allreduce_seconds(1024, 2, net, 0.0) == pytest.approx(1e-6 + 1024 / 1e9)  # no curve


def test_gradient_sums_move_only_while_a_rank_calls_mpi():
    """Replicas without model parts never call MPI in the backward pass: every layer's sums
    (weights, then biases) run after it. A layer that folds calls MPI between its chunks: the
    sums started before it run meanwhile."""
    net = random_network([256, 512, 512, 512], 16, seed=2, dtype="float32")
    pats = network_patterns(net)
    cal = calibration()
    machine = Machine(cal)
    item, b = 4, 64
    one = workload(pats, single_part(net.sizes))
    p2 = predict(one, machine, b, 2)
    seconds = sum(cal.network.allreduce(v * item) for lay in net.layers
                  for v in (lay.nnz, lay.n_out))
    after = predict(one, machine, b // 2, 1).seconds
    assert p2.gradient == pytest.approx(seconds + RUNTIME["collective_s"], rel=1e-9)
    assert p2.seconds == pytest.approx(after + p2.gradient, rel=1e-9)  # on top of the step
    block = workload(pats, partition_network(pats, 2, method="block", seed=0))
    folding = predict(block, machine, b, 2)
    # Layers 3 and 2 fold (MPI calls): the last layer's sums run while layer 2 folds; those of
    # layers 2 and 1, started after the last fold, remain (each rank holds half the rows).
    left = sum(cal.network.allreduce(v * item) for lay in net.layers[:2]
               for v in (lay.nnz // 2, lay.n_out // 2))
    assert folding.gradient == pytest.approx(left + RUNTIME["collective_s"], rel=0.02)


def test_locality_is_zero_for_random_columns_and_large_for_shared_ones():
    rand = locality(network_patterns(random_network([1024, 1024, 1024], 32, seed=0)))
    assert rand.shape == (2, 2) and np.all(np.abs(rand) < 0.02), rand
    rx = locality(network_patterns(radixnet(1024, 2, seed=0)))
    assert np.all(rx > 0.15), rx
    # Rows in pairs reading the same 8 columns: a block of 16 rows reads 8 x 8 distinct rows
    # of 128 reads, where random columns out of 4096 would give ~126.
    rng = np.random.default_rng(0)
    cols = np.sort(np.repeat(rng.random((512, 4096)).argsort(axis=1)[:, :8], 2, axis=0), axis=1)
    pattern = (np.arange(0, 1024 * 8 + 1, 8), cols.ravel(), (1024, 4096))
    gap = locality([pattern])[0]
    assert gap[0] == pytest.approx((126.04 - 64) / 128, abs=0.01)


def test_structure_factor_scales_kernels_by_locality():
    st = Structure((8, 512), {"forward": (0.5, 0.5), "backward": (0.4, 0.6),
                              "gradient": (1.0, 1.0)}, (0.4, 0.2))
    assert st.factor("forward", 64, 0.0) == 1.0  # random columns: the tables as they are
    assert st.factor("forward", 64, 0.2) == pytest.approx(0.75)
    assert st.factor("forward", 64, 0.8) == pytest.approx(0.5)  # clamped at the reference
    assert st.factor("backward", 64, 0.2) == pytest.approx(0.5)  # halfway in log2 of batch
    net = radixnet(1024, 3, seed=0)
    work = workload(network_patterns(net), single_part(net.sizes))
    plain, structured = calibration(), calibration()
    structured = Calibration(**{**vars(plain), "structure": st})
    assert predict(work, Machine(structured), 64).seconds < \
        0.9 * predict(work, Machine(plain), 64).seconds
    rand = random_network([1024, 1024, 1024], 32, seed=0)
    rwork = workload(network_patterns(rand), single_part(rand.sizes))
    assert predict(rwork, Machine(structured), 64).seconds == pytest.approx(
        predict(rwork, Machine(plain), 64).seconds, rel=0.02)


def test_parts_replicas_and_networks_move_the_prediction_the_right_way():
    net = small_network((64, 256, 256, 10), fan_in=16, seed=2)
    pats = network_patterns(net)
    single = workload(pats, single_part(net.sizes))
    two = workload(pats, partition_network(pats, 2, method="block"))
    m = Machine(calibration())
    p1, p2 = predict(single, m, 256, 1), predict(two, m, 256, 1)
    assert p2.compute < p1.compute and p2.exchange > p1.exchange
    r2 = predict(single, m, 256, 2)
    assert r2.gradient > 0 and r2.compute < p1.compute
    # A slower network makes the exchange costlier, never the compute.
    slow = Machine(calibration(), load_cluster_dict(
        CLUSTER | {"ranks_per_node": 1,
                   "inter_node": {"latency_us": 50.0, "bandwidth_GBps": 0.5}}))
    p2s = predict(two, slow, 256, 1)
    assert p2s.exchange > p2.exchange and p2s.seconds > p2.seconds
    assert p2s.compute == pytest.approx(p2.compute, rel=0.01)  # perhaps another rank last


def load_cluster_dict(data: dict):
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/cluster.json"
        with open(path, "w") as f:
            json.dump(data, f)
        return load_cluster(path)


def test_ranks_copying_within_a_node_share_its_memory_bandwidth():
    # 8 ranks on one node, pairs at 10 GB/s: 8 ranks copying at once through 40 GB/s of
    # memory (a read and a write per byte) get 2.5 GB/s each.
    capped = load_cluster_dict(CLUSTER | {"ranks_per_node": 8, "node_memory_bandwidth_GBps": 40})
    assert capped.intra_bandwidth(8) == pytest.approx(2.5e9)
    assert capped.intra_bandwidth(1) == pytest.approx(10e9)  # the pair's own, at most
    free = load_cluster_dict(CLUSTER | {"ranks_per_node": 8})
    assert free.intra_bandwidth(8) == pytest.approx(10e9)
    net = small_network((64, 512, 512, 10), fan_in=16, seed=2)
    pats = network_patterns(net)
    eight = workload(pats, partition_network(pats, 8, method="cyclic"))
    single = workload(pats, single_part(net.sizes))
    m_free, m_capped = Machine(calibration(), free), Machine(calibration(), capped)
    assert predict(eight, m_capped, 256).exchange > predict(eight, m_free, 256).exchange
    lat = m_capped.allreduce_network(False, 8)
    assert lat.allreduce_bandwidth_Bps == pytest.approx(2.5e9)
    assert predict(single, m_capped, 256, 8).gradient > predict(single, m_free, 256, 8).gradient
    # Across nodes the port is the limit, as before.
    assert m_capped.allreduce_network(True, 8).allreduce_bandwidth_Bps == pytest.approx(20e9 / 8)


def test_the_gradient_sum_across_nodes_is_node_aware():
    cluster = load_cluster_dict(CLUSTER)  # 4 ranks per node
    m = Machine(calibration(), cluster)
    intra, inter = m.allreduce_network(False, 4), m.allreduce_network(True, 4)
    # 2 parts x 8 replicas: 2 members of each replica group per node, 4 nodes.
    assert m.gradient_sum_stages(2, 8, 4) == [(intra, 2, 1.0), (inter, 4, 0.5)]
    assert m.gradient_sum_stages(1, 4, 4) == [(intra, 4, 1.0)]  # one node
    assert m.gradient_sum_stages(8, 2, 4) == [(intra, 1, 1.0), (inter, 2, 1.0)]  # 1 per node
    assert Machine(calibration()).gradient_sum_stages(2, 8, 4)[0][1:] == (8, 1.0)  # no cluster
    # A node-aware sum sends a node's gradient once through its port, not once per rank:
    # 1 x 8 on 2 nodes, 100 MB: 15 ms within (10 GB/s) + 5 ms across, against 35 ms for
    # a flat sum whose 8 ranks share the ports (5 GB/s each).
    hier = sum(allreduce_seconds(1e8 * share, ranks, net, 0.0)
               for net, ranks, share in m.gradient_sum_stages(1, 8, 4))
    assert hier == pytest.approx(0.015 + 0.005, rel=0.01)
    assert allreduce_seconds(1e8, 8, inter, 0.0) == pytest.approx(0.035, rel=0.01)
    net = small_network((64, 256, 256, 10), fan_in=16, seed=2)
    single = workload(network_patterns(net), single_part(net.sizes))
    assert predict(single, m, 256, 8).gradient > predict(single, m, 256, 4).gradient


def test_a_rank_shares_the_last_level_cache_with_the_ranks_running_beside_it():
    net = random_network([4096, 4096, 4096], 32, seed=2, dtype="float32")
    pats = network_patterns(net)
    one = workload(pats, single_part(net.sizes))
    two = workload(pats, partition_network(pats, 2, method="block"))
    base = calibration()
    tables = {dt: KernelTable(batches=t.batches, inputs=t.inputs, reuses=t.reuses, ns={
        k: v * (0.5 if k.endswith("_warm") else 1.0) for k, v in t.ns.items()})
        for dt, t in base.kernels.items()}

    def machine(ranks: int, cache: float) -> Machine:
        return Machine(Calibration(host="t", ranks=ranks, backend="numba", kernels=tables,
                                   runtime={**RUNTIME, "cache_bytes": cache},
                                   network=base.network))

    cache = float(working_set(one, 64, 4)[0])  # one rank's step just fits
    alone = predict(one, machine(2, cache), 64).seconds
    # Alone on the node, a rank has the whole cache, however many ranks were calibrated...
    assert alone == predict(one, machine(1, cache), 64).seconds
    assert alone < predict(one, machine(1, cache / 2), 64).seconds
    # ...and beside another, half of it.
    assert predict(two, machine(2, cache), 64).seconds == predict(two, machine(3, cache), 64
                                                                   ).seconds


def test_compute_scales_follow_the_batch_size_of_a_rank():
    """Real steps run another fraction of their table time at batch 32 than at 256 (1.1x and
    0.55x beyond the cache on the 2-core VM): the scales are read at the replica's batch."""
    cal = replace(calibration(), scales=SCALES)
    assert cal.scales_at(32)["compute_scale_alone"] == 2.0
    assert cal.scales_at(8)["compute_scale_alone"] == 2.0  # clamped
    assert cal.scales_at(256)["compute_scale_all"] == 1.5
    assert cal.scales_at(64)["compute_scale_alone"] == pytest.approx(2.0 - 1.0 / 3)  # log2
    net = random_network([256, 512, 512], 8, seed=3, dtype="float32")
    one = workload(network_patterns(net), single_part(net.sizes))
    flat, scaled = Machine(calibration()), Machine(cal)  # flat: 1.0 everywhere

    def kernels(m: Machine, batch: int, replicas: int = 1) -> float:
        return predict(one, m, batch, replicas).compute_kernels

    assert kernels(scaled, 32) == pytest.approx(2.0 * kernels(flat, 32))  # alone, batch 32
    assert kernels(scaled, 256) == pytest.approx(1.0 * kernels(flat, 256))
    # Two replicas of 64 samples: 32 per rank, both ranks busy ("all").
    assert kernels(scaled, 64, 2) == pytest.approx(3.0 * kernels(flat, 64, 2))


def test_allreduce_model():
    net = Network(latency_s=1e-6, bandwidth_Bps=1e9, allreduce_latency_s=1e-6,
                  allreduce_bandwidth_Bps=1e9)
    assert allreduce_seconds(1e6, 1, net, 0.0) == 0.0
    # Large: Rabenseifner, 2 log2 R latencies + 2 (R-1)/R of the bytes.
    assert allreduce_seconds(1e8, 4, net, 0.0) == pytest.approx(4e-6 + 1.5 * 1e8 / 1e9)
    # Small: recursive doubling, log2 R steps of the whole message.
    assert allreduce_seconds(8, 4, net, 0.0) == pytest.approx(2 * (1e-6 + 8e-9))


def test_calibration_and_cluster_files_round_trip_and_refuse_bad_fields(tmp_path):
    cal = replace(calibration(structure=Structure((8, 64), {"forward": (0.6, 0.7), "backward": (
        0.4, 0.5), "gradient": (0.8, 0.9)}, (0.45, 0.44))), scales=SCALES)
    dense = DenseTable((1024, 2**20), (8, 512), {k: np.array([[0.1, 0.2], [0.3, 0.4]])
                                                 for k in ("forward", "backward", "gradient")})
    cal = replace(cal, kernels={d: replace(t, dense=dense) for d, t in cal.kernels.items()})
    path = tmp_path / "m.json"
    path.write_text(json.dumps(cal.to_json()))
    back = load_calibration(path)
    assert back.runtime == cal.runtime and back.network == cal.network
    assert back.structure == cal.structure and back.scales == cal.scales
    assert np.array_equal(back.table("float32").ns["backward"], cal.table("float32").ns["backward"])
    assert np.array_equal(back.table("float64").dense.ns["gradient"], dense.ns["gradient"])
    bad = {
        "missing network field": lambda d: d["network"].pop("bandwidth_Bps"),
        "negative bandwidth": lambda d: d["network"].update(bandwidth_Bps=-1.0),
        "NaN kernel time": lambda d: d["kernels"]["float32"]["forward"][0][0].__setitem__(
            0, "nan"),
        "ragged table": lambda d: d["kernels"]["float32"]["forward"].pop(),
        "ragged block": lambda d: d["kernels"]["float32"]["forward"][1][0].pop(),
        "missing reuse axis": lambda d: d["kernels"]["float32"].pop("reuses"),
        "older format": lambda d: d.update(format="spdnn-calibration/1"),
        "unsorted ping-pong": lambda d: d["network"].update(
            pingpong={"bytes": [1024, 8], "seconds": [1e-6, 2e-6]}),
        "ragged all-reduce": lambda d: d["network"]["allreduce"]["seconds"].pop(),
        "negative all-reduce time": lambda d: d["network"]["allreduce"].update(
            seconds=[-1e-6, 1e-6]),
        "negative gather cost": lambda d: d["runtime"].update(gather_ns_per_value=-0.1),
        "negative rounding cost": lambda d: d["runtime"].update(round_ns_per_value=-0.1),
        "unknown value type": lambda d: d["kernels"].update(float16=d["kernels"]["float32"]),
        "ragged dense table": lambda d: d["kernels"]["float32"]["dense"]["forward"].pop(),
        "zero dense time": lambda d: d["kernels"]["float32"]["dense"]["gradient"][0].__setitem__(
            0, 0.0),
        "unsorted dense sizes": lambda d: d["kernels"]["float32"]["dense"].update(
            nnz=[2**20, 1024]),
        "short structure": lambda d: d["structure"]["backward"].pop(),
        "negative structure gap": lambda d: d["structure"].update(gap_forward=-0.1),
        "negative spread": lambda d: d["runtime"].update(compute_scale_spread=-0.1),
        "short scales": lambda d: d["scales"]["cold_all"].pop(),
        "zero scale": lambda d: d["scales"]["alone"].__setitem__(0, 0.0),
        "unsorted scale batches": lambda d: d["scales"].update(batches=[256, 32]),
        "missing scale": lambda d: d["scales"].pop("all"),
        "ragged ping-pong": lambda d: d["network"].update(
            pingpong={"bytes": [8, 1024], "seconds": [1e-6]}),
        "unsorted batches": lambda d: d["kernels"]["float32"].update(batches=[512, 8]),
        "wrong format": lambda d: d.update(format="spdnn-cluster/1"),
    }
    data = cal.to_json()
    del data["runtime"]["compute_scale_spread"]  # optional: calibrations before it had none
    del data["runtime"]["gather_ns_per_value"]
    del data["network"]["allreduce"]
    for table in data["kernels"].values():
        del table["dense"]
    del data["scales"]  # likewise: then the single runtime values hold for every batch
    path.write_text(json.dumps(data))
    old = load_calibration(path)
    assert old.runtime["compute_scale_spread"] == 0.0 and old.scales is None
    assert old.runtime["gather_ns_per_value"] == 0.0 and old.network.allreduce(1024) is None
    assert old.table("float32").dense is None
    assert old.scales_at(32) == old.scales_at(256) == {
        f"compute_scale_{k}": RUNTIME[f"compute_scale_{k}"] for k in SCALE_KEYS}
    for change in bad.values():
        data = cal.to_json()
        change(data)
        path.write_text(json.dumps(data))
        with pytest.raises(InputError, match="m.json"):
            load_calibration(path)
    cluster_changes = [lambda d: d["inter_node"].pop("latency_us"),  # missing field
                       lambda d: d["intra_node"].update(bandwidth_GBps=-2),
                       lambda d: d.update(ranks_per_node=0),
                       lambda d: d["inter_node"].update(latency_us=True),  # a bool
                       lambda d: d.update(node_memory_bandwidth_GBps=-1),
                       lambda d: d.update(node_memory_bandwidth_GBps="fast"),
                       lambda d: d.update(node_memory_gb=64),  # misspelt: not ignored
                       lambda d: d["inter_node"].update(cpu_ns_per_bytes=0.5)]
    for change in cluster_changes:
        data = json.loads(json.dumps(CLUSTER))
        change(data)
        path.write_text(json.dumps(data))
        with pytest.raises(InputError, match="m.json"):
            load_cluster(path)
    data = {**CLUSTER, "node_memory_gb": 64}
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="m.json: unknown field 'node_memory_gb'"):
        load_cluster(path)
    data = json.loads(json.dumps(CLUSTER))
    data["inter_node"]["cpu_ns_per_bytes"] = 0.5
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="unknown field 'inter_node.cpu_ns_per_bytes'"):
        load_cluster(path)
    load_cluster(ROOT / "docs" / "cluster-hdr-infiniband.json")  # the shipped example


@pytest.fixture
def model_files(tmp_path):
    net = small_network((64, 256, 256, 10), fan_in=16, seed=3, dtype="float32")
    save_network(net, tmp_path / "net.npz")
    pats = network_patterns(net)
    for method, parts in (("hypergraph", 2), ("block", 2), ("cyclic", 4)):
        save_plan(partition_network(pats, parts, method=method, fingerprint=net.fingerprint()),
                  tmp_path / f"{method}{parts}.npz")
    (tmp_path / "m.json").write_text(json.dumps(calibration().to_json()))
    (tmp_path / "one-rank.json").write_text(json.dumps(calibration(network=False).to_json()))
    (tmp_path / "cluster.json").write_text(json.dumps(CLUSTER))
    return tmp_path


def test_model_command_prints_the_table_in_seconds(model_files):
    t = model_files
    start = time.perf_counter()
    proc = run_spdnn("model", t / "net.npz", "--plans", t / "hypergraph2.npz", t / "block2.npz",
                     t / "cyclic4.npz", "--batch-size", "64", "--calibration", t / "m.json",
                     "--replicas", "1,2,4", "--json", t / "model.json",
                     module="partition", cwd=t)
    assert proc.returncode == 0, proc.stderr
    assert time.perf_counter() - start < 30
    lines = proc.stdout.splitlines()
    table = [ln.split() for ln in lines if ln.strip()[:1].isdigit()]
    assert sorted({int(r[0]) for r in table}) == [2, 4, 8, 16]
    assert sum(ln.endswith("*") for ln in lines) == 4  # one fastest grid per P
    assert sum("no plan (data parallel)" in ln for ln in lines) == 2  # R = 2 and 4
    data = json.loads((t / "model.json").read_text())
    assert len(data["predictions"]) == 11 and data["one_rank"]["ranks"] == 1
    # With a cluster and a calibration of one rank (no network part), and for inference.
    proc = run_spdnn("model", t / "net.npz", "--plans", t / "cyclic4.npz", "--batch-size", "64",
                     "--calibration", t / "one-rank.json", "--cluster", t / "cluster.json",
                     "--replicas", "2", "--infer", "--dtype", "bfloat16", module="partition",
                     cwd=t)
    assert proc.returncode == 0, proc.stderr
    assert "inference batch" in proc.stdout and "cluster test" in proc.stdout
    assert "bfloat16" in proc.stdout


def test_model_command_bad_inputs(model_files, tmp_path_factory):
    t = model_files
    other = tmp_path_factory.mktemp("other")
    net2 = small_network((64, 200, 256, 10), fan_in=16, seed=3, dtype="float32")
    save_plan(partition_network(network_patterns(net2), 2, method="block",
                                fingerprint=net2.fingerprint()), other / "plan.npz")
    base = ["model", t / "net.npz", "--batch-size", "64", "--calibration", t / "m.json"]
    cases = [
        (["--plans", other / "plan.npz"], ("plan.npz", "layer sizes")),
        (["--plans", t / "block2.npz", "--cluster", t / "nope.json"], ("nope.json", "no such")),
        (["--plans", t / "block2.npz", "--replicas", "128"], ("--replicas 128",)),
        (["--plans", t / "block2.npz", "--replicas", "0"], ("--replicas",)),
    ]
    for bad_cluster in ({**CLUSTER, "inter_node": {"latency_us": 1.0}},
                        {**CLUSTER, "intra_node": {"latency_us": 1.0, "bandwidth_GBps": -3}}):
        (t / "bad.json").write_text(json.dumps(bad_cluster))
        cases.append((["--plans", t / "block2.npz", "--cluster", t / "bad.json"],
                       ("bad.json", "bandwidth_GBps")))
    for extra, fragments in cases:
        proc = run_spdnn(*base, *extra, module="partition", cwd=t)
        assert_one_line_error(proc, *fragments)
    proc = run_spdnn("model", t / "net.npz", "--plans", t / "block2.npz", "--batch-size", "64",
                     "--calibration", t / "one-rank.json", module="partition", cwd=t)
    assert_one_line_error(proc, "one-rank.json", "no network part")


def test_network_is_the_median_of_its_sweeps():
    """Measured several times over a calibration (this host's transfer speed flips between
    two states for minutes), the median per size is kept, for the ping-pong and the
    all-reduce alike."""
    from types import SimpleNamespace

    # Internal: the median of the sweeps has no public entry but spdnn calibrate itself.
    from spdnn.cost._calibrate_link import network_costs
    from spdnn.cost.calibrate import FULL

    SIZES = FULL.link_sizes

    fast = [1e-6 * (1 + i) for i in range(len(SIZES))]
    slow = [3 * t for t in fast]
    sweeps = [(fast, slow), (slow, fast), (fast, fast)]
    net = network_costs(SimpleNamespace(size=2), 0.0, sweeps)
    assert net.pingpong_s == pytest.approx(fast) and net.allreduce_s == pytest.approx(fast)
    assert net.allreduce(SIZES[2]) == pytest.approx(fast[2])
    assert network_costs(SimpleNamespace(size=1), 0.0, sweeps) is None


@pytest.mark.long
def test_counts_equal_the_runtime_on_8_ranks(tmp_path):
    if MPIEXEC is None:
        pytest.skip(NO_MPIEXEC)
    code = ("import sys; from pathlib import Path; "
            "from spdnn.comm.collective import run_collectively; "
            "from tests.test_costmodel_mpi import check_counts; "
            "sys.exit(run_collectively(lambda c: 0 if len(check_counts(c, Path(sys.argv[1]))) "
            "== 8 else 1))")
    proc = launch(8, "-c", code, tmp_path, module=None, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_replicas_auto_bad_inputs(model_files):
    t = model_files
    common = ["train", "--network", t / "net.npz", "--data", "digits", "--max-steps", "1"]
    cases = [
        (["--plan", t / "block2.npz", "--replicas", "auto", "--calibration", t / "m.json"],
         ("block2.npz", "no plan fits 1 ranks", "multiple")),
        (["--plan", t / "block2.npz", "--plan", t / "cyclic4.npz"], ("several --plan",)),
        (["--replicas", "auto"], ("--replicas auto needs --calibration",)),
        (["--replicas", "auto", "--calibration", t / "one-rank.json"],
         ("one-rank.json", "no network part")),
        (["--replicas", "auto", "--calibration", t / "m.json", "--cluster", t / "none.json"],
         ("none.json", "no such file")),
    ]
    for extra, fragments in cases:
        assert_one_line_error(run_spdnn(*common, *extra, cwd=t), *fragments)


@pytest.mark.parametrize("slow, dtype", [("messages", "float32"), ("gradient sums", "float32"),
                                         ("messages", "bfloat16")])
def test_replicas_auto_runs_the_grid_the_model_predicts_fastest(model_files, slow, dtype):
    """The grid the model predicts fastest runs, in float32 and in bfloat16 (whose step and
    memory the model predicts from its own tables and 16-bit blocks)."""
    if MPIEXEC is None:
        pytest.skip(NO_MPIEXEC)
    t = model_files
    cal = calibration().to_json()
    if slow == "messages":  # every point-to-point message costs a second: replicas win
        cal["network"]["latency_s"] = 1.0
        want = "1 part(s) x 2 replica(s)"
    else:  # the gradient sums crawl: the 2-part plan wins
        cal["network"]["allreduce_bandwidth_Bps"] = 1.0
        cal["network"]["allreduce"]["seconds"] = [1.0, 2.0]  # the measured curve wins
        want = "2 part(s) x 1 replica(s)"
    (t / "slow.json").write_text(json.dumps(cal))
    proc = launch(2, "train", "--network", t / "net.npz", "--plan", t / "block2.npz", "--plan",
                  t / "cyclic4.npz", "--replicas", "auto", "--calibration", t / "slow.json",
                  "--data", "digits", "--max-steps", "2", "--batch-size", "32", "--dtype", dtype,
                  cwd=t, timeout=300)
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith(f"--replicas auto: {want}"), proc.stdout
    assert "also predicted" in proc.stdout and "cyclic4" not in proc.stdout  # 4 parts: no fit
    grid = "(1 part(s) x 2 replicas)" if "replica(s) (no plan" in first else "plan block"
    assert grid in proc.stdout, proc.stdout


@pytest.mark.long
def test_replicas_auto_leaves_out_the_grids_that_do_not_fit(model_files):
    """Messages cost a second each, so two replicas would be fastest; but each would hold the
    whole network, and a limit between its predicted peak and the 2-part plan's leaves only
    the plan. A cluster's memory per node limits the same way."""
    if MPIEXEC is None:
        pytest.skip(NO_MPIEXEC)
    from spdnn.cost.autogrid import _peak
    from spdnn.cost.costmodel import single_part
    from spdnn.cost.workload import workload

    t = model_files
    cal = calibration().to_json()
    cal["network"]["latency_s"] = 1.0
    (t / "slow.json").write_text(json.dumps(cal))
    from spdnn.model.generate import random_network

    net = random_network([64, 4096, 4096, 10], [64, 1024, 64], seed=3)
    save_network(net, t / "wide.npz")  # 4.5M weights: the weights, not the buffers, differ
    pats = network_patterns(net)
    plan = partition_network(pats, 2, method="block", fingerprint=net.fingerprint())
    save_plan(plan, t / "wide-block2.npz")
    # above the baseline the job's ranks measure (a dry run of its fastest grid)
    common = ["train", "--network", t / "wide.npz", "--plan", t / "wide-block2.npz",
              "--replicas", "auto", "--calibration", t / "slow.json", "--data", "digits",
              "--max-steps", "2", "--batch-size", "32"]
    base = dry_run_baseline(*common, ranks=2, cwd=t)
    whole = _peak(workload(pats, single_part(net.sizes)), 2, 32, "float32", base)
    half = _peak(workload(pats, plan), 1, 32, "float32", base)
    assert half < whole
    limit = (half + whole) // 2
    cluster = {**CLUSTER, "ranks_per_node": 2, "node_memory_GB": 2 * limit / 1e9}
    (t / "small-nodes.json").write_text(json.dumps(cluster))
    for extra in (["--memory-limit", str(limit)], ["--cluster", t / "small-nodes.json"]):
        proc = launch(2, *common, *extra, cwd=t, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("--replicas auto: 2 part(s) x 1 replica(s)"), proc.stdout
        assert "left out: 2 replica(s) of no plan: predicted peak" in proc.stdout
    # (5 MB below: the baseline the job measures moves by a few MB from run to run)
    proc = launch(2, *common, "--memory-limit", str(half - 5_000_000), cwd=t, timeout=300)
    assert_one_line_error(proc, "--replicas auto: no grid of 2 ranks fits")


def test_the_stack_cpu_of_bytes_crossing_nodes_lengthens_the_work_it_overlapped():
    """TCP's CPU time per byte (``inter_node.cpu_ns_per_byte``) is charged at both ends of
    every message between nodes and in the gradient sums across nodes; never within a node,
    never without a cluster, and only where the transfer was hidden behind work (the sums:
    only the part of them that moves while there is work)."""
    net = small_network((64, 512, 512, 10), fan_in=16, seed=2)
    pats = network_patterns(net)
    two = workload(pats, partition_network(pats, 2, method="cyclic"))
    single = workload(pats, single_part(net.sizes))
    apart = CLUSTER | {"ranks_per_node": 1}
    rdma = Machine(calibration(), load_cluster_dict(apart))
    c = 2.0  # ns per byte, each end
    tcp = Machine(calibration(), load_cluster_dict(
        apart | {"inter_node": CLUSTER["inter_node"] | {"cpu_ns_per_byte": c}}))
    assert tcp.stack_s_per_byte == pytest.approx(2e-9) and rdma.stack_s_per_byte == 0.0
    batch = 64
    slow, fast = predict(two, tcp, batch), predict(two, rdma, batch)
    # Each rank sends and receives its cut rows, forward and backward: at both ends.
    crossing = sum(float(lw.count.sum()) for lw in two.layers) * batch * 4  # bytes, all ranks
    per_rank = 2 * crossing / 2 * 2e-9 * 2  # sent + received, forward and backward, one rank
    assert slow.exchange - fast.exchange == pytest.approx(per_rank, rel=0.35)
    assert slow.seconds > fast.seconds
    # Two ranks on one node: the copies are charged as such, the stack never.
    together = CLUSTER | {"inter_node": CLUSTER["inter_node"] | {"cpu_ns_per_byte": c}}
    assert predict(two, Machine(calibration(), load_cluster_dict(together)), batch).seconds \
        == pytest.approx(predict(two, Machine(calibration(), load_cluster_dict(CLUSTER)),
                                 batch).seconds)
    # Gradient sums across nodes: about 4 (r - 1) / r times the gradient's bytes, at c, for
    # the part of the sums that moves while there is work. Pure data parallelism calls MPI
    # only in the final wait, where the core is idle: nothing is charged.
    assert predict(single, tcp, batch, 2).gradient == \
        pytest.approx(predict(single, rdma, batch, 2).gradient)
    # 2 parts x 2 replicas: the exchange's waits advance the sums, some of them under work.
    grads = sum(float(lw.nnz.max() + lw.rows.max()) for lw in two.layers) * 4
    extra = predict(two, tcp, batch, 2).gradient - predict(two, rdma, batch, 2).gradient
    assert 0.05 * (4 * 0.5 * grads * 2e-9) < extra < 4 * 0.5 * grads * 2e-9
    # Without a cluster the calibration's own figure (measured within one node) is not used.
    bare = calibration()
    bare = replace(bare, network=replace(bare.network, cpu_ns_per_byte=c))
    assert predict(single, Machine(bare), batch, 2).seconds \
        == pytest.approx(predict(single, Machine(calibration()), batch, 2).seconds)


def test_the_stack_cpu_field_is_checked_and_old_files_load_without_it(tmp_path):
    bad = CLUSTER | {"inter_node": CLUSTER["inter_node"] | {"cpu_ns_per_byte": -1}}
    with pytest.raises(InputError, match="cpu_ns_per_byte"):
        load_cluster_dict(bad)
    assert load_cluster_dict(CLUSTER).inter.cpu_ns_per_byte == 0.0
    cal = calibration()
    cal = replace(cal, network=replace(cal.network, cpu_ns_per_byte=0.7))
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(cal.to_json()))
    assert load_calibration(path).network.cpu_ns_per_byte == 0.7
    data = cal.to_json()
    del data["network"]["cpu_ns_per_byte"]  # a calibration of 2026-11-26
    path.write_text(json.dumps(data))
    assert load_calibration(path).network.cpu_ns_per_byte == 0.0


def test_a_calibration_grid_must_time_every_reference_batch_in_both_classes():
    """A grid whose reference networks skip a reference batch would fail only at the end of a
    calibration (the scales are kept per batch and class): refused when it is built."""
    from spdnn.cost.calibrate import FULL, QUICK, CalibrationGrid

    assert FULL.reference_batches == QUICK.reference_batches == (32, 256)
    with pytest.raises(ValueError, match="cold_references must time every reference batch"):
        CalibrationGrid(cold_references=(((1024, 1024, 1024), (32,)),))
    with pytest.raises(ValueError, match="two link sizes"):
        CalibrationGrid(link_sizes=(8,))
    for bad in (-0.1, float("nan")):
        with pytest.raises(ValueError, match="reference_seconds must be 0 or more"):
            CalibrationGrid(reference_seconds=bad)
    with pytest.raises(ValueError, match="at least one round of each"):
        CalibrationGrid(cold_reps=0)
    with pytest.raises(ValueError, match="evict_bytes must be None or 8 or more"):
        CalibrationGrid(evict_bytes=0)


def _messages_by_definition(pattern, own_out, own_in):
    """Each (source, destination) rank pair's rows, from the definition: a row j of layer k-1
    goes once to every other rank that owns a row of W_k reading it."""
    indptr, indices, _ = pattern
    wanted = set()
    for i in range(len(indptr) - 1):
        for j in indices[indptr[i]:indptr[i + 1]]:
            if own_in[j] != own_out[i]:
                wanted.add((int(j), int(own_out[i])))
    pairs: dict[tuple[int, int], int] = {}
    for j, p in wanted:
        pairs[int(own_in[j]), p] = pairs.get((int(own_in[j]), p), 0) + 1
    return sorted(pairs.items())


@pytest.mark.parametrize("table", [True, False])
def test_a_layers_work_is_counted_as_defined(table, monkeypatch, backend):
    """The workload's per-rank counts and its messages (in the runtime's posting order) match
    a count from the definition, with the rank-pair table and without it, on either kernel
    backend (numba's one pass, numpy's sorted pairs); P beyond a layer's rows and an empty
    row included."""
    import spdnn.cost.workload as wl

    if not table:
        monkeypatch.setattr(wl, "PAIR_TABLE_PARTS", 0)
    rng = np.random.default_rng(5)
    net = random_network([40, 30, 20, 7], 6, seed=3)
    pats = network_patterns(net)
    indptr, indices, shape = pats[1]
    pats[1] = (np.concatenate([[0], indptr[1:] - indptr[1]]), indices[indptr[1]:], shape)
    for parts in (1, 2, 3, 4, 9):
        owners = [rng.integers(0, parts, n).astype(np.int32) for n in net.sizes]
        for k, pattern in enumerate(pats, start=1):
            lw = wl.layer_work(pattern, owners[k], owners[k - 1], parts)
            want = _messages_by_definition(pattern, owners[k], owners[k - 1])
            assert [((int(s), int(d)), int(c)) for s, d, c in
                    zip(lw.src, lw.dst, lw.count)] == want
            rank = np.repeat(owners[k], np.diff(pattern[0]))
            local = owners[k - 1][pattern[1]] == rank
            assert lw.nnz_owned.tolist() == np.bincount(rank[local], minlength=parts).tolist()
            assert lw.nnz_ghost.tolist() == np.bincount(rank[~local], minlength=parts).tolist()
            assert lw.rows.tolist() == np.bincount(owners[k], minlength=parts).tolist()
            assert lw.prev_rows.tolist() == np.bincount(owners[k - 1], minlength=parts).tolist()
            ghosts, sent = np.zeros(parts, int), np.zeros(parts, int)
            for (s, d), c in want:
                sent[s] += c
                ghosts[d] += c
            assert lw.ghosts.tolist() == ghosts.tolist() and lw.sent.tolist() == sent.tolist()


def test_a_streamed_workload_predicts_what_the_whole_one_does(tmp_path):
    """Read a layer at a time from the file, with the runs replayed side by side, the
    predictions are those of the whole workload, one run at a time."""
    from spdnn.cost.costmodel import predict_many
    from spdnn.cost.workload import StreamedWorkload, streamed_workloads
    from spdnn.io.bundle import NetworkBundle

    net = radixnet(1024, 8)
    save_network(net, tmp_path / "net.npz")
    pats = network_patterns(net)
    local = locality(pats)
    machine = Machine(calibration(), load_cluster_dict({**CLUSTER, "ranks_per_node": 2}))
    bundle = NetworkBundle(tmp_path / "net.npz")
    patterns = bundle.patterns()
    runs, want = [], []
    plans = [partition_network(pats, parts, method=method, seed=0)
             for method, parts in (("block", 4), ("sweep", 4), ("cyclic", 8))]
    for plan, streamed in zip(plans, streamed_workloads(patterns, plans, local)):
        assert isinstance(streamed, StreamedWorkload)
        assert not any(len(lw.src) for lw in streamed.layers)  # only the counts are kept
        whole = workload(pats, plan, local)
        assert streamed.plan is plan
        for replicas in (1, 2):
            runs.append((streamed, machine, 64, replicas))
            want.append(predict(whole, machine, 64, replicas))
    got = predict_many(runs)
    for g, w in zip(got, want):
        assert (g.parts, g.replicas, g.method) == (w.parts, w.replicas, w.method)
        assert g.to_json() == w.to_json()
    assert got[0].exchange > 0 and got[0].seconds != got[2].seconds


def test_a_senders_messages_leave_one_after_another_in_posting_order(backend):
    """Expand: each source posts by destination; fold: the same messages the other way, each
    (expand) destination posting by its destinations. Arrivals from a hand count: a sender's
    link passes one message after another, a receiver's takes the bytes of all."""
    from spdnn.cost._replay import StepReplay
    from spdnn.cost.workload import LayerWork, Workload

    z = np.zeros(4, dtype=np.int64)
    # Expand messages (source, destination, rows), sorted as the runtime posts them.
    src, dst, count = [0, 0, 1, 2], [1, 3, 3, 0], [3000, 5000, 7000, 11000]
    lw = LayerWork(rows=z + 1, prev_rows=z + 1, nnz_owned=z, nnz_ghost=z, ghosts=z, sent=z,
                   src=np.array(src), dst=np.array(dst), count=np.array(count))
    work = Workload(parts=4, sizes=(4, 4), method="test", layers=(lw,))
    machine = Machine(calibration(), None)
    step = StepReplay(work, machine, 8, 1, "float32")
    net = machine.calibration.network
    post = np.array([1.0, 2.0, 4.0, 8.0]) * 1e-5  # about one message's transfer

    def by_hand(messages, item=4):
        t = {c: float(net.transfer(c * 8 * item)) for c in count}
        ready, start, into, busy = np.full(4, -np.inf), np.full(4, np.inf), np.zeros(4), {}
        for s, d, c in messages:  # in posting order
            busy[s] = busy.get(s, 0.0) + t[c]
            ready[d] = max(ready[d], post[s] + net.latency_s + busy[s])
            start[d] = min(start[d], post[s] + net.latency_s)
            into[d] += t[c]
        return np.where(np.isfinite(start), np.maximum(ready, start + into), ready)

    forward = by_hand(zip(src, dst, count))
    backward = by_hand([(1, 0, 3000), (3, 0, 5000), (3, 1, 7000), (0, 2, 11000)])
    assert step.arrivals(lw, True, post) == pytest.approx(forward, rel=1e-12)
    assert step.arrivals(lw, False, post) == pytest.approx(backward, rel=1e-12)
    assert not np.allclose(forward[np.isfinite(forward)], backward[np.isfinite(forward)])
    # bfloat16: 16-bit rows forward, float32 partial sums folded back
    half = StepReplay(work, machine, 8, 1, "bfloat16")
    assert half.arrivals(lw, True, post) == pytest.approx(by_hand(zip(src, dst, count), 2),
                                                          rel=1e-12)
    assert half.arrivals(lw, False, post) == pytest.approx(backward, rel=1e-12)
