import itertools

import numpy as np
import pytest

from partition.exact import MAX_VARIABLES, inputs_with_a_user, layer_milp, sweep_exact
from partition.hypergraph import build_hypergraph, km1
from partition.methods import partition_network
from partition.refine import Refiner
from spdnn.bundle import save_network
from spdnn.errors import SpdnnError
from spdnn.generate import radixnet
from spdnn.plan import balance_limit, load_plan, network_patterns, plan_statistics
from tests.helpers import assert_one_line_error, run_spdnn, small_network


def _brute_force(hg, parts, nparts, layer, limit):
    """Least km1 over every balanced assignment of one layer, the others fixed."""
    lo, hi = int(hg.offsets[layer]), int(hg.offsets[layer + 1])
    w = hg.vertex_weights[lo:hi]
    best = None
    for owners in itertools.product(range(nparts), repeat=hi - lo):
        owners = np.array(owners)
        if np.bincount(owners, weights=w, minlength=nparts).max() > limit + 1e-9:
            continue
        trial = parts.copy()
        trial[lo:hi] = owners
        if layer == 1:
            trial = inputs_with_a_user(hg, trial)
        cost = km1(hg, trial)
        best = cost if best is None else min(best, cost)
    return best


@pytest.mark.parametrize("objective", ["train", "infer"])
@pytest.mark.parametrize("nparts", [2, 3])
def test_layer_milp_finds_the_brute_force_optimum(objective, nparts):
    net = small_network((7, 6, 5, 6, 3), fan_in=3, seed=5)
    hg = build_hypergraph(network_patterns(net), objective)
    rng = np.random.default_rng(nparts)
    parts = rng.integers(0, nparts, hg.n_vertices)
    limits = Refiner(hg, parts, nparts, 0.03).limits
    for k in range(1, hg.n_layers + 1):
        owners = layer_milp(hg, parts, nparts, k, float(limits[k]))
        lo, hi = int(hg.offsets[k]), int(hg.offsets[k + 1])
        trial = parts.copy()
        trial[lo:hi] = owners
        if k == 1:
            trial = inputs_with_a_user(hg, trial)
        loads = np.bincount(owners, weights=hg.vertex_weights[lo:hi], minlength=nparts)
        assert loads.max() <= limits[k] + 1e-9, f"layer {k}"
        assert km1(hg, trial) == _brute_force(hg, parts, nparts, k, limits[k]), f"layer {k}"


def test_sweeps_never_raise_the_volume_keep_every_layer_balanced_and_repeat():
    net = small_network((12, 10, 9, 11, 4), fan_in=4, seed=2)
    hg = build_hypergraph(network_patterns(net))
    logs = []
    for nparts in (2, 3):
        start = np.random.default_rng(0).integers(0, nparts, hg.n_vertices)
        refiner = Refiner(hg, start, nparts, 0.03)
        start = refiner.run()
        parts = sweep_exact(hg, start, nparts, refiner.limits, sweeps=3, log=logs.append)
        assert km1(hg, parts) <= km1(hg, start)
        for k in range(1, hg.n_layers + 1):
            lo, hi = hg.offsets[k], hg.offsets[k + 1]
            loads = np.bincount(parts[lo:hi], weights=hg.vertex_weights[lo:hi],
                                minlength=nparts)
            assert loads.max() <= refiner.limits[k] + 1e-9
        again = sweep_exact(hg, start, nparts, refiner.limits, sweeps=3)
        np.testing.assert_array_equal(parts, again)
    assert any("exact sweep 1, layer 4/4" in m for m in logs)


def test_layers_too_large_for_an_exact_milp_are_skipped():
    net = small_network((12, MAX_VARIABLES // 4 + 1, 8), fan_in=3, seed=1)
    hg = build_hypergraph(network_patterns(net))
    start = Refiner(hg, np.arange(hg.n_vertices) % 4, 4, 0.03)
    logs = []
    parts = sweep_exact(hg, start.run(), 4, start.limits, sweeps=1, log=logs.append)
    assert logs[0].startswith("exact sweeps skip 1 of 2 layers"), logs[0]
    lo, hi = hg.offsets[1], hg.offsets[2]
    np.testing.assert_array_equal(parts[lo:hi], start.parts[lo:hi])
    assert not any("layer 1/2" in m for m in logs) and any("layer 2/2" in m for m in logs)


def test_exact_sweeps_improve_a_radixnet_plan():
    # Measured: 2,060 -> 1,845 forward rows (7 layers, P = 4).
    patterns = network_patterns(radixnet(1024, 7, seed=3))
    plain = partition_network(patterns, 4, seed=0, objective="infer")
    plan = partition_network(patterns, 4, seed=0, objective="infer", exact_sweeps=1)
    assert plan.meta["exact_sweeps"] == 1 and "exact" in plan.meta["candidates"]
    forward = plan_statistics(patterns, plan.owners, 4).forward_total
    assert forward == plan.meta["stats"]["forward_total"]
    assert forward < plain.meta["stats"]["forward_total"]
    for k, (indptr, _, _) in enumerate(patterns, start=1):
        loads = np.bincount(plan.owners[k], weights=np.diff(indptr), minlength=4)
        assert loads.max() <= balance_limit(indptr, 4, 0.03) + 1e-9, f"layer {k}"


def test_exact_sweeps_argument(tmp_path):
    patterns = network_patterns(small_network())
    with pytest.raises(SpdnnError, match="exact sweeps"):
        partition_network(patterns, 2, exact_sweeps=-1)
    with pytest.raises(SpdnnError, match="not 'cyclic'"):
        partition_network(patterns, 2, "cyclic", exact_sweeps=1)
    save_network(small_network((12, 10, 8)), tmp_path / "net.npz")
    proc = run_spdnn(tmp_path / "net.npz", "-P", "2", "-o", tmp_path / "p.npz",
                     "--exact-sweeps", "-1", module="partition")
    assert_one_line_error(proc, "--exact-sweeps must be at least 0")
    proc = run_spdnn(tmp_path / "net.npz", "-P", "2", "-o", tmp_path / "p.npz",
                     "--exact-sweeps", "1", module="partition")
    assert proc.returncode == 0, proc.stderr
    assert "exact sweep 1, layer 2/2" in proc.stderr
    assert load_plan(tmp_path / "p.npz").meta["exact_sweeps"] == 1
