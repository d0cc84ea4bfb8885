import itertools

import numpy as np
import pytest

from partition.exact import (
    MAX_VARIABLES,
    inputs_with_a_user,
    layer_milp,
    sweep_exact,
    window_milp,
)
from partition.hypergraph import build_hypergraph, km1
from partition.methods import partition_network
from partition.refine import Refiner
from spdnn.errors import SpdnnError
from spdnn.io.bundle import save_network
from spdnn.io.planfile import load_plan
from spdnn.model.generate import radixnet
from spdnn.model.plan import balance_limit, network_patterns, plan_statistics
from tests.helpers import assert_one_line_error, run_spdnn, small_network


def _balanced(hg, owners, nparts, first, last, limits):
    """Every layer first..last of ``owners`` (their ranks, from layer first on) within limits."""
    lo = hg.offsets[first]
    for k, limit in zip(range(first, last + 1), limits):
        a, b = hg.offsets[k] - lo, hg.offsets[k + 1] - lo
        loads = np.bincount(owners[a:b], weights=hg.vertex_weights[a + lo:b + lo],
                            minlength=nparts)
        if loads.max() > limit + 1e-9:
            return False
    return True


def _with(hg, parts, first, owners):
    trial = parts.copy()
    trial[hg.offsets[first]:hg.offsets[first] + len(owners)] = owners
    return inputs_with_a_user(hg, trial) if first == 1 else trial


def _brute_force(hg, parts, nparts, first, limits, last=None):
    """Least km1 over every balanced assignment of layers first..last, the others fixed."""
    last = first if last is None else last
    n = int(hg.offsets[last + 1] - hg.offsets[first])
    return min(km1(hg, _with(hg, parts, first, np.array(owners)))
               for owners in itertools.product(range(nparts), repeat=n)
               if _balanced(hg, np.array(owners), nparts, first, last, limits))


@pytest.mark.parametrize("objective", ["train", "infer"])
@pytest.mark.parametrize("nparts", [2, 3])
def test_layer_milp_finds_the_brute_force_optimum(objective, nparts):
    net = small_network((7, 6, 5, 6, 3), fan_in=3, seed=5)
    hg = build_hypergraph(network_patterns(net), objective=objective)
    rng = np.random.default_rng(nparts)
    parts = rng.integers(0, nparts, hg.n_vertices)
    limits = Refiner(hg, parts, nparts, 0.03).limits
    for k in range(1, hg.n_layers + 1):
        owners = layer_milp(hg, parts, nparts, k, float(limits[k]))
        assert _balanced(hg, owners, nparts, k, k, [limits[k]]), f"layer {k}"
        assert km1(hg, _with(hg, parts, k, owners)) == \
            _brute_force(hg, parts, nparts, k, [limits[k]]), f"layer {k}"


@pytest.mark.parametrize("objective", ["train", "infer"])
@pytest.mark.parametrize("nparts", [2, 3])
def test_window_milp_finds_the_brute_force_optimum_of_two_layers(objective, nparts):
    net = small_network((4, 3, 3, 3, 2), fan_in=2, seed=7)
    hg = build_hypergraph(network_patterns(net), objective=objective)
    parts = np.random.default_rng(nparts).integers(0, nparts, hg.n_vertices)
    limits = Refiner(hg, parts, nparts, 0.03).limits
    for k in range(1, hg.n_layers):
        owners, status = window_milp(hg, parts, nparts, k, k + 1, limits[k:k + 2])
        assert status == 0, f"layers {k}-{k + 1}"
        assert _balanced(hg, owners, nparts, k, k + 1, limits[k:k + 2]), f"layers {k}-{k + 1}"
        assert km1(hg, _with(hg, parts, k, owners)) == \
            _brute_force(hg, parts, nparts, k, limits[k:k + 2], last=k + 1), f"layers {k}-{k + 1}"


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


@pytest.mark.long
def test_exact_sweeps_improve_a_radixnet_plan():
    # Measured: 1,136 -> 928 forward rows (5 layers, P = 4; 7 layers: 2,060 -> 1,845 in 3x
    # the time).
    patterns = network_patterns(radixnet(1024, 5, seed=3))
    plain = partition_network(patterns, 4, seed=0, objective="infer")
    plan = partition_network(patterns, 4, seed=0, objective="infer", exact_sweeps=1)
    assert plan.meta["exact_sweeps"] == 1 and "exact" in plan.meta["candidates"]
    forward = plan_statistics(patterns, plan.owners, parts=4).forward_total
    assert forward == plan.meta["stats"]["forward_total"]
    assert forward < plain.meta["stats"]["forward_total"]
    for k, (indptr, _, _) in enumerate(patterns, start=1):
        loads = np.bincount(plan.owners[k], weights=np.diff(indptr), minlength=4)
        assert loads.max() <= balance_limit(indptr, 4, 0.03) + 1e-9, f"layer {k}"


def test_exact_sweeps_argument(tmp_path):
    patterns = network_patterns(small_network())
    with pytest.raises(SpdnnError, match="exact_sweeps must be an integer >= 0, not -1"):
        partition_network(patterns, 2, exact_sweeps=-1)
    with pytest.raises(SpdnnError, match="not 'cyclic'"):
        partition_network(patterns, 2, method="cyclic", exact_sweeps=1)
    save_network(small_network((12, 10, 8)), tmp_path / "net.npz")
    proc = run_spdnn(tmp_path / "net.npz", "-P", "2", "-o", tmp_path / "p.npz",
                     "--exact-sweeps", "-1", module="partition")
    assert_one_line_error(proc, "--exact-sweeps: must be an integer >= 0, not -1")
    proc = run_spdnn(tmp_path / "net.npz", "-P", "2", "-o", tmp_path / "p.npz",
                     "--exact-sweeps", "1", "--verbose", module="partition")
    assert proc.returncode == 0, proc.stderr
    assert "exact sweep 1, layer 2/2" in proc.stderr
    assert load_plan(tmp_path / "p.npz").meta["exact_sweeps"] == 1
