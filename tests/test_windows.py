"""Plans for networks larger than memory (partition/windows.py): windows of consecutive layers
that fit the limit, each partitioned with its inputs fixed to the window before; the plan's
statistics, gathered window by window, equal the whole network's; its volume stays near the
whole-hypergraph plan's and never above the block plan's; the limits are checked in one line."""

from __future__ import annotations

import math

import numpy as np
import pytest

from partition.hypergraph import build_hypergraph, km1
from partition.layerwise import layer_by_layer
from partition.methods import partition_network
from partition.refine import Refiner
from partition.windows import (
    PROCESS_BYTES,
    PatternList,
    choose_windows,
    partition_windows,
    plan_bytes,
    search_bytes,
)
from spdnn.errors import SpdnnError
from spdnn.io.bundle import NetworkBundle, save_network
from spdnn.io.planfile import load_plan
from spdnn.model.generate import radixnet, random_network
from spdnn.model.plan import network_patterns, plan_statistics
from tests.helpers import assert_one_line_error, run_cli


def _source(net):
    return PatternList(network_patterns(net))


def test_windows_cover_the_layers_in_order_within_the_limit():
    net = random_network([40, 60, 50, 60, 40, 10], 6, seed=1)
    source = _source(net)
    pins = [len(p[1]) + p[2][1] for p in network_patterns(net)]
    nets = [p[2][1] for p in network_patterns(net)]
    room_for_two = search_bytes(pins[0] + pins[1], nets[0] + nets[1], 4, 1)
    limit = PROCESS_BYTES + plan_bytes(source.shapes) + room_for_two
    windows = choose_windows(source, 4, limit=limit)
    assert windows[0].first == 1 and windows[-1].last == 5
    assert all(b.first in (a.last, a.last + 1) for a, b in zip(windows, windows[1:]))
    assert (windows[0].first, windows[0].last) == (1, 2)  # exactly two layers fit
    assert windows[1].first == 2
    assert all(w.predicted <= room_for_two for w in windows)
    # Windows overlap by a layer, whose neurons the later window places again.
    assert [(w.first, w.last) for w in choose_windows(source, 4, limit=2**40, max_layers=2)] \
        == [(1, 2), (2, 3), (3, 4), (4, 5)]
    assert [(w.first, w.last) for w in choose_windows(source, 4, limit=2**40, max_layers=1)] \
        == [(k, k) for k in range(1, 6)]
    assert len(choose_windows(source, 4, limit=2**40)) == 1


def test_a_limit_that_no_layer_fits_is_refused_with_the_smallest_that_would():
    net = random_network([40, 60, 50, 10], 6, seed=1)
    source = _source(net)
    base = PROCESS_BYTES + plan_bytes(source.shapes)
    with pytest.raises(SpdnnError, match="below what .* plan alone needs"):
        choose_windows(source, 2, limit=base // 2)
    need = search_bytes(len(network_patterns(net)[0][1]) + 40, 40, 2, 1)
    smallest = math.ceil((need + base) / 2**20)
    with pytest.raises(SpdnnError, match=r"layer 1 of the network alone needs .* the smallest "
                                         rf"limit that fits is --memory-limit {smallest}M"):
        choose_windows(source, 2, limit=base + need - 1)
    assert choose_windows(source, 2, limit=base + need)[0].last == 1


def test_fixed_inputs_stay_where_the_window_before_put_them():
    patterns = network_patterns(random_network([30, 40, 40, 8], 5, seed=2))
    hg = build_hypergraph(patterns)
    fixed = (np.arange(30) * 7 % 3).astype(np.int64)
    parts = layer_by_layer(hg, 3, 0.03, 0, "kahypar", fixed_inputs=fixed)
    assert np.array_equal(parts[:30], fixed)
    start = parts.copy()
    start[30:] = np.random.default_rng(0).integers(0, 3, len(start) - 30)
    refiner = Refiner(hg, start, 3, 0.03, frozen_inputs=True)
    out = refiner.run()
    assert np.array_equal(out[:30], fixed)
    assert km1(hg, out) <= km1(hg, start)


@pytest.mark.parametrize("nparts, layers", [(2, 3), (4, 4)])
def test_the_windowed_plan_is_near_the_whole_plan_and_never_above_block(nparts, layers):
    patterns = network_patterns(radixnet(1024, 8, seed=0))
    whole = plan_statistics(patterns, partition_network(patterns, nparts, group_starts=1).owners,
                            parts=nparts)
    source = PatternList(patterns)
    if True:
        done = partition_windows(source, nparts, choose_windows(source, nparts, limit=2**40,
                                                                max_layers=layers),
                                 group_starts=1)
        assert done.stats == plan_statistics(patterns, done.plan.owners, parts=nparts)
        assert done.baselines["block"] == plan_statistics(
            patterns, partition_network(patterns, nparts, method="block").owners, parts=nparts)
        assert done.stats.volume <= 1.10 * whole.volume, (layers, done.stats.volume, whole)
        assert done.stats.volume < done.baselines["block"].volume / 3
        assert done.plan.meta["windows"][0] == [1, layers]
        for k, imbalance in enumerate(done.stats.imbalance):
            assert imbalance <= done.limits[k] + 1e-9


def test_baseline_methods_read_in_windows_equal_the_whole_network_ones():
    patterns = network_patterns(random_network([40, 60, 50, 60, 10], 6, seed=1))
    source = PatternList(patterns)
    windows = choose_windows(source, 3, limit=2**40, max_layers=2)
    for method in ("block", "cyclic"):
        done = partition_windows(source, 3, windows, method=method)
        want = partition_network(patterns, 3, method=method).owners
        assert all(np.array_equal(a, b) for a, b in zip(done.plan.owners, want))
    rnd = partition_windows(source, 3, windows, method="random")
    assert rnd.stats == plan_statistics(patterns, rnd.plan.owners, parts=3)


def test_cli_partitions_in_windows_under_a_memory_limit(tmp_path):
    net = random_network([40, 60, 50, 60, 10], 6, seed=1)
    save_network(net, tmp_path / "net.npz")
    proc = run_cli(tmp_path / "net.npz", "-P", "3", "-o", tmp_path / "plan.npz",
                   "--window-layers", "2", "--compare", "--verbose", module="partition")
    assert proc.returncode == 0, proc.stderr
    assert "in 3 windows" in proc.stdout and "within its balance limit" in proc.stdout
    assert "3 windows of at most 2 layers" in proc.stderr
    plan = load_plan(tmp_path / "plan.npz")
    plan.check_for(NetworkBundle(tmp_path / "net.npz").sizes, net.fingerprint(), "plan")
    assert plan.meta["windows"] == [[1, 2], [2, 3], [3, 4]]
    for args, fragments in (
            (("--memory-limit", "lots"), ("--memory-limit 'lots'", "not a number of bytes")),
            (("--memory-limit", "1M", "--window-layers", "1"), ("plan alone needs",)),
            (("--window-layers", "0"), ("--window-layers: must be a positive integer, not 0",)),
            (("--window-layers", "1", "--exact-sweeps", "1"), ("do not run in windows",))):
        proc = run_cli(tmp_path / "net.npz", "-P", "3", "-o", tmp_path / "bad.npz", *args,
                       module="partition")
        assert_one_line_error(proc, *fragments)
        assert not (tmp_path / "bad.npz").exists()


def test_the_python_api_partitions_in_windows(tmp_path):
    from partition import partition

    net = random_network([40, 60, 50, 60, 10], 6, seed=1)
    save_network(net, tmp_path / "net.npz")
    for network in (net, tmp_path / "net.npz"):
        plan = partition(network, parts=3, window_layers=2, seed=1)
        assert plan.meta["windows"] == [[1, 2], [2, 3], [3, 4]]
        assert plan.meta["fingerprint"] == net.fingerprint()
        assert plan.meta["stats"] == plan_statistics(network_patterns(net), plan.owners,
                                                     parts=3).summary()
    assert partition(net, parts=3, memory_limit="64G").meta["windows"] == [[1, 4]]
    for bad, fragment in (({"window_layers": 0}, "window_layers must be"),
                          ({"memory_limit": "lots"}, "not a number of bytes"),
                          ({"window_layers": 2, "epsilon": 2.0}, "epsilon must be")):
        with pytest.raises(SpdnnError, match=fragment):
            partition(net, parts=3, **bad)


def test_the_windows_fingerprint_the_network_as_they_read_it(tmp_path):
    net = random_network([40, 60, 50, 60, 10], 6, seed=1)
    save_network(net, tmp_path / "net.npz")
    with NetworkBundle(tmp_path / "net.npz") as bundle:
        for layers in (1, 2, 4):
            windows = choose_windows(bundle, 2, limit=2**40, max_layers=layers)
            done = partition_windows(bundle, 2, windows, method="block")
            assert done.plan.meta["fingerprint"] == net.fingerprint()
