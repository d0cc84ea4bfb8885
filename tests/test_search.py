"""The hypergraph method's search: time limit, worker processes, shortcuts (partition/search.py)."""

import functools
import os
import signal
import time

import numpy as np
import pytest

import partition.methods as methods
from partition.hypergraph import balanced, build_hypergraph, km1, layer_limits
from partition.methods import BASELINES, baseline_owners, partition_network
from partition.time_budget import Deadline
from spdnn.io.bundle import save_network
from spdnn.io.planfile import load_plan
from spdnn.model.generate import radixnet, random_network
from spdnn.model.plan import network_patterns
from tests.helpers import assert_one_line_error, run_spdnn

# The method these tests are about (the default is the sweep: tests/test_sweep.py).
hypergraph = functools.partial(partition_network, method="hypergraph")


class CountedDeadline(Deadline):
    """Passes after ``budget`` questions: cuts the search at every possible point in turn."""

    def __init__(self, budget: int) -> None:
        super().__init__(None)
        self.budget, self.asked = budget, 0

    def passed(self) -> bool:
        self.asked += 1
        return self.asked > self.budget

    def left(self) -> float | None:
        return 0.0 if self.asked > self.budget else None


def _best_balanced_baseline(patterns, nparts, epsilon=0.03):
    hg = build_hypergraph(patterns)
    limits = layer_limits(hg, nparts, epsilon)
    costs = [km1(hg, p) for b in BASELINES
             if balanced(hg, p := np.concatenate(baseline_owners(b, patterns, parts=nparts)),
                         nparts, limits)]
    return hg, limits, min(costs)


@pytest.mark.parametrize("net,nparts", [(radixnet(1024, 5, seed=2), 4),
                                        (random_network([40, 60, 60, 8], 5, seed=1), 3)])
@pytest.mark.long
def test_a_time_limit_anywhere_gives_a_balanced_plan_no_worse_than_the_baselines(
        monkeypatch, net, nparts):
    patterns = network_patterns(net)
    hg, limits, best_baseline = _best_balanced_baseline(patterns, nparts)
    full = hypergraph(patterns, nparts, seed=0)
    assert full.meta["unfinished"] == []
    cut_points = 0
    for budget in (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 10**6):
        monkeypatch.setattr(methods, "Deadline", lambda _seconds, b=budget: CountedDeadline(b))
        plan = hypergraph(patterns, nparts, seed=0, time_limit=1.0)
        parts = np.concatenate(plan.owners)
        assert balanced(hg, parts, nparts, limits), budget
        assert km1(hg, parts) == plan.meta["stats"]["volume"] <= best_baseline, budget
        if plan.meta["unfinished"]:
            cut_points += 1
            assert all(":" in line for line in plan.meta["unfinished"])
        else:  # not cut: the plan of the unlimited search
            for a, b in zip(plan.owners, full.owners):
                np.testing.assert_array_equal(a, b)
    assert cut_points >= 5  # the budgets did cut the search, at several points


def test_a_real_time_limit_is_kept(tmp_path):
    """RadiX-Net 4096 x 12 at P = 16 takes ~50 s without a limit."""
    save_network(radixnet(4096, 12, seed=0), tmp_path / "net.npz")
    t0 = time.monotonic()
    proc = run_spdnn(tmp_path / "net.npz", "-P", "16", "-o", tmp_path / "plan.npz",
                     "--method", "hypergraph", "--time-limit", "3", module="partition")
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    assert "time limit 3 s reached; not finished:" in proc.stdout
    assert elapsed < 3 + 12, elapsed  # process start, loading, writing the plan
    plan = load_plan(tmp_path / "plan.npz")
    assert plan.meta["time_limit"] is not None and plan.meta["unfinished"]
    assert "every layer within its balance limit" in proc.stdout


@pytest.mark.parametrize("net,nparts", [(radixnet(1024, 5, seed=2), 4),
                                        (random_network([40, 60, 60, 8], 5, seed=1), 3)])
def test_jobs_do_not_change_the_plan(net, nparts):
    patterns = network_patterns(net)
    one = hypergraph(patterns, nparts, seed=5, jobs=1)
    two = hypergraph(patterns, nparts, seed=5, jobs=2)
    for a, b in zip(one.owners, two.owners):
        np.testing.assert_array_equal(a, b)
    assert one.meta["candidates"] == two.meta["candidates"]


def test_bad_time_limit_and_jobs(tmp_path):
    save_network(random_network([20, 24, 4], 4, seed=0), tmp_path / "net.npz")
    for args, fragment in ((("--time-limit", "0"), "--time-limit: must be a positive"),
                           (("--time-limit", "nan"), "--time-limit: must be a positive"),
                           (("--time-limit", "-5"), "--time-limit: must be a positive"),
                           (("--jobs", "0"), "--jobs: must be a positive integer, not 0")):
        proc = run_spdnn(tmp_path / "net.npz", "-P", "2", "-o", tmp_path / "p.npz", *args,
                         module="partition")
        assert_one_line_error(proc, fragment)
        assert not (tmp_path / "p.npz").exists()


def _layer1_gain(patterns, nparts):
    """What the shortcut looks at, computed here on its own: layer 1's volume under the
    layer-by-layer run's first layer against the best baseline's."""
    from partition.layerwise import layer_by_layer
    from partition.search import layer1_volume

    hg = build_hypergraph(patterns)
    base = min(layer1_volume(hg, np.concatenate(baseline_owners(b, patterns, parts=nparts)), nparts)
               for b in BASELINES)
    return 1 - layer1_volume(hg, layer_by_layer(hg, nparts, 0.03, 0, "kahypar"), nparts) / base


@pytest.mark.parametrize("sizes,fan_in,nparts,taken", [
    ([512, 2048, 2048], 32, 2, True),  # dense random layers, 2 parts: every net is cut anyway
    ([1024] * 4, 64, 2, True),
    ([256] * 3, 4, 2, False),  # sparse random layers: much to gain
    ([1024] * 3, 32, 4, False),
])
@pytest.mark.long
def test_the_unstructured_shortcut_is_taken_exactly_where_layer_1_gains_little(
        sizes, fan_in, nparts, taken):
    from partition.search import PROBE_GAIN

    patterns = network_patterns(random_network(sizes, fan_in, seed=0))
    assert (_layer1_gain(patterns, nparts) < PROBE_GAIN) == taken
    fast = hypergraph(patterns, nparts, seed=0, backend="kahypar")
    full = hypergraph(patterns, nparts, seed=0, backend="kahypar", shortcuts=False)
    assert full.meta["shortcuts"] == []
    if taken:
        assert len(fast.meta["shortcuts"]) == 1 and "layer 1 gains" in fast.meta["shortcuts"][0]
        assert "kahypar" not in fast.meta["candidates"]
        # What the skipped run would have found: at most 1% less volume.
        assert fast.meta["stats"]["volume"] <= 1.01 * full.meta["stats"]["volume"]
    else:
        assert fast.meta["shortcuts"] == []
        for a, b in zip(fast.owners, full.owners):
            np.testing.assert_array_equal(a, b)


def test_no_shortcut_on_networks_with_groups_of_identical_rows():
    plan = hypergraph(network_patterns(radixnet(1024, 4, seed=0)), 2, seed=0)
    assert plan.meta["shortcuts"] == [] and "kahypar" in plan.meta["candidates"]


def test_auto_backend_kahypar_on_grouped_layers_mtkahypar_on_the_others():
    pytest.importorskip("mtkahypar", reason="mtkahypar is not installed (pip install mtkahypar)")
    from spdnn.model.network import Network

    grouped = radixnet(1024, 2, seed=0)
    mixed = Network(layers=[*grouped.layers, *random_network([1024, 1024], 8, seed=0).layers])
    for net, fine in ((grouped, "kahypar"), (random_network([64, 96, 96], 6, seed=0),
                                             "mtkahypar"), (mixed, "kahypar+mtkahypar")):
        plan = hypergraph(network_patterns(net), 3, seed=0)
        assert plan.meta["backend"] == "auto" and fine in plan.meta["candidates"], fine
        assert not any(k.startswith("mtkahypar-groups-") for k in plan.meta["candidates"])


def test_pin_passes_agree_with_scipy():
    # Internal: the numba passes are checked against a plain loop.
    from partition._kernels import block_counts, vertex_nets

    hg = build_hypergraph(network_patterns(random_network([30, 40, 40, 6], 5, seed=4)))
    indptr, nets = vertex_nets(hg.net_indptr, hg.net_pins, hg.n_vertices)
    inc = hg.incidence()
    np.testing.assert_array_equal(indptr, inc.indptr)
    np.testing.assert_array_equal(nets, inc.indices)
    parts = np.random.default_rng(0).integers(0, 3, hg.n_vertices)
    phi = np.zeros((hg.n_nets, 3), dtype=np.uint8)
    block_counts(hg.net_indptr, hg.net_pins, parts, phi)
    expected = (inc.T.tocsr() @ np.eye(3)[parts]).astype(np.uint8)
    np.testing.assert_array_equal(phi, expected)


def test_progress_estimates_the_time_left(monkeypatch):
    from partition import time_budget

    clock = iter([0.0, 10.0, 20.0, 40.0])
    monkeypatch.setattr(time_budget.time, "monotonic", lambda: next(clock))
    lines: list[str] = []
    progress = time_budget.Progress("kahypar start", 100, lines.append, every=5)
    progress.advance(25, "layer 1/4 done")  # 10 s for a quarter: 30 s left
    progress.advance(25, "layer 2/4 done")
    progress.advance(50, "layer 4/4 done")
    assert lines == ["kahypar start: layer 1/4 done (10 s, about 30 s left)",
                     "kahypar start: layer 2/4 done (20 s, about 20 s left)",
                     "kahypar start: layer 4/4 done (40 s)"]


def _dies(_r: int) -> None:
    os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's out-of-memory killer would


def test_a_dead_worker_process_is_a_one_line_error(monkeypatch):
    import partition.search as search
    from spdnn.errors import SpdnnError

    monkeypatch.setattr(search, "_group_run", _dies)
    with pytest.raises(SpdnnError, match="worker process of --jobs ended"):
        hypergraph(network_patterns(radixnet(1024, 3, seed=0)), 2, jobs=2)


class FixedLeft(Deadline):
    """Never passes, but always reports ``seconds`` left."""

    def __init__(self, seconds: float) -> None:
        super().__init__(None)
        self.seconds = seconds

    def left(self) -> float | None:
        return self.seconds

    def passed(self) -> bool:
        return False


def test_a_run_that_cannot_finish_in_time_gives_up_after_three_layers(monkeypatch):
    from partition.layerwise import layer_by_layer
    from partition.time_budget import OutOfTime, Progress

    hg = build_hypergraph(network_patterns(radixnet(1024, 6, seed=0)))
    unlimited = layer_by_layer(hg, 4, 0.03, 0, "kahypar")
    monkeypatch.setattr(Progress, "eta", lambda self: 1000.0)  # its pace: 1000 s more
    with pytest.raises(OutOfTime, match=r"after layer 3/6: about 16.7 min more needed, 8.3 min "):
        layer_by_layer(hg, 4, 0.03, 0, "kahypar", deadline=FixedLeft(499))
    parts = layer_by_layer(hg, 4, 0.03, 0, "kahypar", deadline=FixedLeft(500))
    np.testing.assert_array_equal(parts, unlimited)


@pytest.mark.parametrize("net,nparts", [(radixnet(1024, 5, seed=2), 8),
                                        (random_network([40, 60, 60, 8], 5, seed=1), 3)])
def test_starts_far_behind_are_not_refined_and_only_those(net, nparts):
    from partition.search import REFINE_RATIO

    patterns = network_patterns(net)
    hg = build_hypergraph(patterns)
    plan = hypergraph(patterns, nparts, seed=0)
    best_start = min(c["start"] for c in plan.meta["candidates"].values())
    for b in BASELINES:
        far = km1(hg, np.concatenate(baseline_owners(b, patterns, parts=nparts))) > \
            REFINE_RATIO * best_start
        skipped = any(line.startswith(f"{b} not refined") for line in plan.meta["shortcuts"])
        assert far == skipped == (b not in plan.meta["candidates"]), b
    full = hypergraph(patterns, nparts, seed=0, shortcuts=False)
    assert plan.meta["stats"]["volume"] == full.meta["stats"]["volume"]
    # RadiX-Net at P = 8: block and random are 20x behind; the random network: all close.
    assert bool(plan.meta["shortcuts"]) == (net.sizes[1] == 1024)


def test_a_lone_process_forks_and_the_fork_server_gives_the_same_plan(monkeypatch):
    """Alone (MPI, if started, a singleton) the partitioner forks; where it may not (inside an
    MPI job of several ranks: tests/test_api_mpi.py), KaHyPar's children come from a fork
    server and --jobs runs in this process, and the plan is the same."""
    import spdnn.comm.processes as processes

    patterns = network_patterns(random_network([30, 40, 40, 8], 5, seed=2))
    assert processes.fork_is_safe() and processes.child_context().get_start_method() == "fork"
    alone = hypergraph(patterns, 3, jobs=2)
    monkeypatch.setattr(processes, "fork_is_safe", lambda: False)
    import partition.search as search

    monkeypatch.setattr(search, "fork_is_safe", lambda: False)
    assert processes.child_context().get_start_method() == "forkserver"
    lines = []
    served = hypergraph(patterns, 3, jobs=2, log=lines.append)
    assert all(np.array_equal(a, b) for a, b in zip(alone.owners, served.owners))
    assert any("run in this process" in line for line in lines)
