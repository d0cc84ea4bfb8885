"""The sweep method (partition/sweep.py, partition/multilevel.py, partition/groups.py):
every plan balanced under the per-layer limit at any P, its volume the runtime's count (the
neurons' hypergraph's connectivity - 1, computed apart), deterministic, never worse than the
baselines; the groups' hypergraph built from one row a group equal to the neurons' hypergraph
contracted; the refinement's running volume equal to a recount."""

from __future__ import annotations

import numpy as np
import pytest

import partition.groups as groups
from partition import multilevel, sweep
from partition.hypergraph import build_hypergraph, contract, km1, layer_limits
from partition.methods import BASELINES, baseline_owners, partition_network
from partition.time_budget import Deadline
from partition.windows import PatternList, choose_windows, partition_windows
from spdnn.model.generate import radixnet, random_network
from spdnn.model.network import Layer, Network
from spdnn.model.plan import balance_limit, network_patterns, plan_statistics
from tests.helpers import small_network


def _banded(n=96, layers=3, width=3):
    """Each neuron reads its neighbours in the layer below: the block plan is near optimal."""
    import scipy.sparse as sp

    out = []
    for _ in range(layers):
        w = sp.diags([np.ones(n - abs(d)) for d in range(-width, width + 1)],
                     list(range(-width, width + 1)), format="csr")
        w.sort_indices()
        out.append(Layer(w, np.zeros(n)))
    return Network(layers=tuple(out))


NETWORKS = {
    "random": lambda: random_network([40, 48, 48, 10], 6, seed=3),
    "uneven": lambda: small_network((30, 41, 23, 7), fan_in=9, seed=4),
    "radixnet": lambda: radixnet(1024, 8, seed=1),
    "head": lambda: random_network([64, 128, 128], 8, seed=2, head=10),
    "banded": _banded,
}


def _assert_balanced(patterns, owners, nparts, epsilon=0.03):
    for k, (indptr, _, shape) in enumerate(patterns, start=1):
        assert owners[k].dtype == np.int32 and len(owners[k]) == shape[0]
        assert owners[k].min(initial=0) >= 0 and owners[k].max(initial=0) < nparts
        loads = np.bincount(owners[k], weights=np.diff(indptr), minlength=nparts)
        assert loads.max() <= balance_limit(indptr, nparts, epsilon) + 1e-9, (k, loads.max())


@pytest.mark.parametrize("name", sorted(NETWORKS))
@pytest.mark.parametrize("nparts", [1, 2, 3, 7, 64, 513, 4096])
def test_balanced_at_any_p_and_never_worse_than_a_baseline(name, nparts):
    net = NETWORKS[name]()
    patterns = network_patterns(net)
    plan = partition_network(patterns, nparts, seed=1, fingerprint=net.fingerprint())
    assert plan.meta["method"] == "sweep" and plan.sizes == net.sizes
    _assert_balanced(patterns, plan.owners, nparts)
    volume = plan_statistics(patterns, plan.owners, parts=nparts).volume
    assert plan.meta["stats"]["volume"] == volume
    # The runtime's count is the neurons' hypergraph's connectivity - 1, computed apart.
    assert km1(build_hypergraph(patterns), np.concatenate(plan.owners)) == volume
    for b in BASELINES:
        base = baseline_owners(b, patterns, parts=nparts, seed=1)
        assert volume <= plan_statistics(patterns, base, parts=nparts).volume, b


def test_much_better_than_the_baselines_where_structure_allows():
    """RadiX-Net past its base layers (rows and columns permuted): every baseline sends
    nearly every row; the sweep finds the groups' structure (measured: 9x below cyclic)."""
    patterns = network_patterns(radixnet(1024, 16, seed=0))
    plan = partition_network(patterns, 16, seed=0)
    assert plan.meta["chosen_start"] == "sweep"
    cyclic = plan_statistics(patterns, baseline_owners("cyclic", patterns, parts=16),
                             parts=16).volume
    assert plan.meta["stats"]["volume"] * 6 < cyclic


def test_a_baseline_that_wins_is_refined_in_turn():
    patterns = network_patterns(_banded(n=256, layers=4, width=2))
    plan = partition_network(patterns, 4, seed=0)
    block = plan_statistics(patterns, baseline_owners("block", patterns, parts=4),
                            parts=4).volume
    assert plan.meta["stats"]["volume"] <= block
    assert plan.meta["chosen_start"] in ("sweep", "block", "block+sweep")


@pytest.mark.parametrize("objective", ["train", "infer"])
def test_the_objective_is_the_volume_minimised(objective):
    net = radixnet(1024, 6, seed=2)
    patterns = network_patterns(net)
    plan = partition_network(patterns, 8, seed=0, objective=objective)
    stats = plan_statistics(patterns, plan.owners, parts=8)
    hg = build_hypergraph(patterns, objective=objective)
    assert km1(hg, np.concatenate(plan.owners)) == \
        (stats.forward_total if objective == "infer" else stats.volume)


def test_same_seed_same_plan_and_jobs_change_nothing():
    patterns = network_patterns(radixnet(1024, 6, seed=3))
    a = partition_network(patterns, 8, seed=5)
    b = partition_network(patterns, 8, seed=5, jobs=2)
    for x, y in zip(a.owners, b.owners):
        np.testing.assert_array_equal(x, y)
    c = partition_network(patterns, 8, seed=6)
    assert any((x != y).any() for x, y in zip(a.owners, c.owners))


def test_groups_hypergraph_equals_the_neurons_hypergraph_contracted():
    """Built from one row a group, it has the same vertices, weights and connectivity - 1
    under any plan that keeps groups whole as the contraction of the neurons' hypergraph."""
    rng = np.random.default_rng(0)
    for net, nparts in ((radixnet(1024, 7, seed=0), 4), (radixnet(1024, 7, seed=0), 5),
                        (random_network([32, 64, 64], 4, seed=1), 2)):
        patterns = network_patterns(net)
        layer_groups = groups.layer_groups(patterns, nparts)
        for objective in ("train", "infer"):
            fine = build_hypergraph(patterns, objective=objective)
            contracted, of = contract(fine, groups.identical_row_clusters(patterns, nparts,
                                                                          layer_groups))
            built, built_of = groups.grouped_hypergraph(patterns, layer_groups,
                                                        objective=objective)
            np.testing.assert_array_equal(of, built_of)
            np.testing.assert_array_equal(contracted.offsets, built.offsets)
            np.testing.assert_array_equal(contracted.vertex_weights, built.vertex_weights)
            assert contracted.n_nets == built.n_nets
            for _ in range(5):
                parts = rng.integers(0, nparts, built.n_vertices)
                assert km1(built, parts) == km1(fine, parts[built_of]) == \
                    km1(contracted, parts)


def test_groups_are_rows_with_equal_columns_even_when_hashes_collide(monkeypatch):
    net = radixnet(1024, 3, seed=4)
    patterns = network_patterns(net)

    def exact(indptr, indices, n):
        keys = {}
        return np.array([keys.setdefault(tuple(indices[indptr[i]:indptr[i + 1]]), len(keys))
                         for i in range(n)])

    def same_partition(a, b):
        pairs = set(zip(a.tolist(), b.tolist()))
        return len(pairs) == len(set(a.tolist())) == len(set(b.tolist()))

    for collide in (False, True):
        if collide:  # every row hashes alike: only the exact comparison separates them
            monkeypatch.setattr(groups, "_row_hashes",
                                lambda indptr, indices, r1, r2, h1, h2: (h1.fill(0), h2.fill(0)))
        rng = np.random.default_rng(0)
        for indptr, indices, shape in patterns:
            # At P = 1 no group is cut into chunks: groups are exactly the distinct rows.
            got = groups.row_groups(indptr, indices, shape, 1, rng)
            assert same_partition(got, exact(indptr, indices, shape[0]))


def test_groups_too_coarse_to_balance_whole_are_cut_finer():
    """RadiX-Net's last base layer (stride n/32) pairs its groups into 32 identical rows: at
    P = 5 whole pairs cannot meet the limit, so they are cut to the limit's slack."""
    patterns = network_patterns(radixnet(1024, 6, seed=0))
    indptr, indices, shape = patterns[5]
    g = groups.row_groups(indptr, indices, shape, 5, np.random.default_rng(0))
    weights = np.bincount(g, weights=np.diff(indptr))
    slack = balance_limit(indptr, 5, 0.03) - np.diff(indptr).sum() / 5
    assert weights.max() <= slack
    plan = partition_network(patterns, 5, seed=1)
    assert plan.meta["chosen_start"] == "sweep"
    _assert_balanced(patterns, plan.owners, 5)


def test_the_running_volume_equals_a_recount():
    """Every move and swap applies its exact gain: the refinement's own tally of the volume
    equals connectivity - 1 recounted from scratch."""
    for net, nparts in ((random_network([64, 96, 96, 32], 6, seed=5), 6),
                        (radixnet(1024, 5, seed=1), 16)):
        patterns = network_patterns(net)
        hg = build_hypergraph(patterns)
        limits = layer_limits(hg, nparts, 0.03)
        start = np.concatenate(baseline_owners("random", patterns, parts=nparts, seed=2))
        swept = multilevel.refine(hg, start, nparts, limits, 0)
        assert swept.volume == km1(hg, swept.parts) < km1(hg, start)


def test_fixed_inputs_stay_fixed_and_a_deadline_leaves_a_balanced_plan():
    patterns = network_patterns(radixnet(1024, 4, seed=0))
    fixed = (np.arange(1024) * 7 % 4).astype(np.int32)
    found = sweep.search_sweep(patterns, 4, epsilon=0.03, seed=0, objective="train",
                               fixed_inputs=fixed, compare=False)
    np.testing.assert_array_equal(found.owners[0], fixed)
    _assert_balanced(patterns, found.owners, 4)
    # Past the deadline before any layer is placed: the best baseline is the plan.
    late = sweep.search_sweep(patterns, 4, epsilon=0.03, seed=0, objective="train",
                              deadline=Deadline(1e-9))
    assert late.unfinished == ["sweep: placement stopped in layer 1 (the time limit passed)"]
    assert late.chosen in BASELINES and "sweep" not in late.candidates
    _assert_balanced(patterns, late.owners, 4)
    assert late.volume == plan_statistics(patterns, late.owners, parts=4).volume == \
        min(late.candidates.values())


def test_a_deadline_during_refinement_leaves_a_balanced_plan_no_worse_than_placed(
        monkeypatch):
    """The refinement stops between two chunks of a layer's vertices when the deadline
    passes: here after its first chunk."""
    patterns = network_patterns(random_network([64, 9000, 64], 4, seed=1))
    hg = build_hypergraph(patterns)
    limits = layer_limits(hg, 4, 0.03)
    placed = multilevel.place(hg, 4, limits, 0)

    class AfterChecks(Deadline):
        def __init__(self, checks: int) -> None:
            super().__init__(None)
            self.checks = checks

        def passed(self) -> bool:
            self.checks -= 1
            return self.checks < 0

    full = multilevel.refine(hg, placed, 4, limits, 0)
    cut = multilevel.refine(hg, placed, 4, limits, 0, deadline=AfterChecks(3))
    assert km1(hg, placed) >= cut.volume == km1(hg, cut.parts) >= full.volume
    assert cut.volume > full.volume  # it did stop early
    _assert_balanced(patterns, hg.split(cut.parts), 4)


def test_windows_of_the_sweep_keep_the_plan_near_the_whole_one():
    net = radixnet(1024, 12, seed=0)
    patterns = network_patterns(net)
    source = PatternList(patterns)
    windows = choose_windows(source, 8, limit=2**40, max_layers=4, method="sweep",
                             grouped=True)
    assert [(w.first, w.last) for w in windows] == [(1, 4), (4, 7), (7, 10), (10, 12)]
    done = partition_windows(source, 8, windows, seed=0)
    assert done.plan.meta["method"] == "sweep"
    _assert_balanced(patterns, done.plan.owners, 8)
    assert done.stats == plan_statistics(patterns, done.plan.owners, parts=8)
    whole = partition_network(patterns, 8, seed=0).meta["stats"]["volume"]
    assert done.stats.volume <= 1.3 * whole
    assert done.stats.volume * 4 < done.baselines["block"].volume


def test_replanning_refines_the_plan_in_force_and_keeps_the_inputs():
    """partition.replan.refine_plan (spdnn train --replan): from an unbalanced plan in force,
    every layer is repaired and refined; layer 0 keeps its owners."""
    from partition.replan import refine_plan

    patterns = network_patterns(random_network([64, 128, 128, 32], 8, seed=7))
    owners = baseline_owners("cyclic", patterns, parts=4)
    owners[2] = np.zeros_like(owners[2])  # an update left layer 2 all on rank 0
    refined, rows = refine_plan(patterns, owners, 4)
    np.testing.assert_array_equal(refined[0], owners[0])
    _assert_balanced(patterns, list(refined), 4)
    stats = plan_statistics(patterns, list(refined), parts=4)
    assert rows == stats.forward_total + stats.backward_total
    balanced_start = baseline_owners("cyclic", patterns, parts=4)
    again, rows = refine_plan(patterns, balanced_start, 4)
    stats = plan_statistics(patterns, list(again), parts=4)
    assert rows == stats.forward_total + stats.backward_total
    assert stats.volume < plan_statistics(patterns, balanced_start, parts=4).volume


def test_the_command_partitions_in_windows_with_the_sweep(tmp_path):
    from spdnn.io.bundle import save_network
    from spdnn.io.planfile import load_plan
    from tests.helpers import run_spdnn

    net = radixnet(1024, 9, seed=2)
    save_network(net, tmp_path / "net.npz")
    proc = run_spdnn(tmp_path / "net.npz", "-P", "4", "-o", tmp_path / "plan.npz",
                     "--window-layers", "4", "--compare", module="partition")
    assert proc.returncode == 0, proc.stderr
    assert "method sweep in 3 windows" in proc.stdout and "messages" in proc.stdout
    plan = load_plan(tmp_path / "plan.npz")
    assert plan.meta["method"] == "sweep" and plan.meta["windows"] == [[1, 4], [4, 7], [7, 9]]
    patterns = network_patterns(net)
    _assert_balanced(patterns, plan.owners, 4)
    stats = plan_statistics(patterns, plan.owners, parts=4)
    assert plan.meta["stats"]["volume"] == stats.volume
    assert stats.volume * 3 < plan.meta["baseline_volumes"]["block"]
