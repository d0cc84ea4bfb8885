import os

import numpy as np
import pytest

from partition.hypergraph import build_hypergraph, km1, read_partition, write_hmetis
from partition.methods import BASELINES, baseline_owners, partition_network
from spdnn.errors import InputError, SpdnnError
from spdnn.io.bundle import save_network
from spdnn.io.planfile import load_plan
from spdnn.model.generate import radixnet, random_network
from spdnn.model.plan import balance_limit, network_patterns, plan_statistics
from tests.helpers import assert_one_line_error, run_cli, run_spdnn, small_network

NETWORKS = {
    "random": lambda: random_network([40, 48, 48, 10], 6, seed=3),
    "uneven": lambda: small_network((30, 41, 23, 7), fan_in=9, seed=4),
    "radixnet": lambda: radixnet(1024, 8, seed=1),
}


def _balanced(patterns, owners, nparts, epsilon):
    for k, (indptr, _, _) in enumerate(patterns, start=1):
        loads = np.bincount(owners[k], weights=np.diff(indptr), minlength=nparts)
        assert loads.max() <= balance_limit(indptr, nparts, epsilon) + 1e-9, f"layer {k}"


def test_km1_of_the_hypergraph_is_the_plan_volume():
    net = small_network((15, 11, 9, 6), fan_in=5)
    patterns = network_patterns(net)
    hg = build_hypergraph(patterns)
    assert hg.n_vertices == sum(net.sizes)
    assert hg.vertex_weights[:15].sum() == 0 and hg.vertex_weights.sum() == net.nnz
    rng = np.random.default_rng(0)
    for nparts in (2, 3, 5):
        parts = rng.integers(0, nparts, hg.n_vertices)
        stats = plan_statistics(patterns, hg.split(parts), parts=nparts)
        assert km1(hg, parts) == stats.volume
        assert km1(build_hypergraph(patterns, objective="infer"), parts) == stats.forward_total


@pytest.mark.parametrize("nparts", [2, 3, 5])
def test_infer_objective_minimises_forward_volume(nparts):
    net = NETWORKS["radixnet"]()
    patterns = network_patterns(net)
    plan = partition_network(patterns, nparts, seed=1, objective="infer")
    infer = plan_statistics(patterns, plan.owners, parts=nparts)
    assert plan.meta["objective"] == "infer"
    _balanced(patterns, plan.owners, nparts, 0.03)
    forward = {b: plan_statistics(patterns, baseline_owners(b, patterns, parts=nparts, seed=1),
                                  parts=nparts).forward_total for b in BASELINES}
    assert infer.forward_total <= min(forward.values()), forward
    assert infer.forward_total * 3 < forward["block"]


@pytest.mark.parametrize("name", sorted(NETWORKS))
@pytest.mark.parametrize("nparts", [2, 3, 5])
def test_every_method_is_balanced_in_range_and_searches_beat_baselines(name, nparts):
    net = NETWORKS[name]()
    patterns = network_patterns(net)
    volumes = {}
    for method in ("sweep", "hypergraph", *BASELINES):
        plan = partition_network(patterns, nparts, method=method, epsilon=0.03, seed=1,
                                 fingerprint=net.fingerprint())
        assert plan.sizes == net.sizes
        for o in plan.owners:
            assert o.dtype == np.int32 and o.min() >= 0 and o.max() < nparts
        _balanced(patterns, plan.owners, nparts, 0.03)
        volumes[method] = plan_statistics(patterns, plan.owners, parts=nparts).volume
        assert plan.meta["stats"]["volume"] == volumes[method]
    assert volumes["sweep"] <= min(volumes[b] for b in BASELINES), volumes
    # The sweep's plan is one of the hypergraph search's starts.
    assert volumes["hypergraph"] <= volumes["sweep"], volumes


def test_radixnet_hypergraph_plan_is_much_better_than_block():
    net = radixnet(1024, 8, seed=0)
    patterns = network_patterns(net)
    hyper = partition_network(patterns, 8, seed=0)
    block = plan_statistics(patterns, baseline_owners("block", patterns, parts=8), parts=8)
    assert hyper.meta["stats"]["volume"] * 5 < block.volume


def test_group_starts_only_where_identical_rows_shrink_the_hypergraph():
    """Group starts cost extra layer-by-layer runs: not worth it for a dense head's few groups."""
    def starts(net):
        return set(partition_network(network_patterns(net), 4, seed=0,
                                     method="hypergraph").meta["candidates"])

    assert any("groups" in s for s in starts(radixnet(1024, 4, seed=0)))
    unstructured = starts(random_network([64, 96, 96], 6, seed=0, head=16))
    # The baselines, the sweep and the layer-by-layer start (named by its backends), no group
    # starts.
    assert len(unstructured) == 5 and not any("groups" in s for s in unstructured), unstructured
    assert {"block", "cyclic", "random", "sweep"} < unstructured


def test_same_seed_same_plan():
    net = random_network([30, 40, 40, 5], 5, seed=2)
    patterns = network_patterns(net)
    a = partition_network(patterns, 3, seed=7)
    b = partition_network(patterns, 3, seed=7)
    for x, y in zip(a.owners, b.owners):
        np.testing.assert_array_equal(x, y)


def test_p_equal_one_and_more_ranks_than_neurons():
    net = random_network([6, 4, 3], 2, seed=0)
    patterns = network_patterns(net)
    one = partition_network(patterns, 1)
    assert all(not o.any() for o in one.owners) and one.meta["stats"]["volume"] == 0
    many = partition_network(patterns, 5, seed=0)  # layer 2 has 3 neurons: 2 ranks own none
    assert many.owners[2].max() < 5
    _balanced(patterns, many.owners, 5, 0.03)


def test_argument_validation():
    patterns = network_patterns(small_network())
    with pytest.raises(SpdnnError, match=r"parts must be an integer >= 1"):
        partition_network(patterns, 0)
    with pytest.raises(SpdnnError, match="epsilon"):
        partition_network(patterns, 2, epsilon=1.5)
    with pytest.raises(SpdnnError, match="seed"):
        partition_network(patterns, 2, seed=-1)
    with pytest.raises(SpdnnError, match="objective must be one of train, infer, not 'fast'"):
        partition_network(patterns, 2, objective="fast")
    with pytest.raises(SpdnnError, match="backend must be one of .*, not 'metis'"):
        partition_network(patterns, 2, backend="metis")
    with pytest.raises(SpdnnError, match="threads must be a positive integer, not 0"):
        partition_network(patterns, 2, method="hypergraph", backend="mtkahypar", threads=0)
    with pytest.raises(SpdnnError, match="KaHyPar runs on one thread"):
        partition_network(patterns, 2, method="hypergraph", backend="kahypar", threads=2)
    with pytest.raises(SpdnnError, match="backend chooses the hypergraph method's partitioner, "
                                         "not 'sweep's"):
        partition_network(patterns, 2, backend="kahypar")
    with pytest.raises(SpdnnError, match="method must be one of sweep, hypergraph"):
        partition_network(patterns, 2, method="metis")
    with pytest.raises(SpdnnError, match="time_limit must be a positive number of seconds"):
        partition_network(patterns, 2, time_limit=0)
    with pytest.raises(SpdnnError, match="jobs must be a positive integer, not 0"):
        partition_network(patterns, 2, jobs=0)
    with pytest.raises(SpdnnError, match="not 'block'"):
        partition_network(patterns, 2, method="block", threads=2)


def test_hmetis_export_and_partition_import(tmp_path):
    net = small_network((8, 6, 4), fan_in=3)
    hg = build_hypergraph(network_patterns(net))
    write_hmetis(hg, tmp_path / "g.hgr")
    lines = (tmp_path / "g.hgr").read_text().splitlines()
    assert lines[0] == f"{hg.n_nets} {hg.n_vertices} 11"
    first = [int(x) for x in lines[1].split()]
    assert first[0] == 1 and first[1] == 1  # net of input neuron 0: weight 1, pin 1 first
    assert len(lines) == 1 + hg.n_nets + hg.n_vertices
    parts = np.arange(hg.n_vertices) % 3
    (tmp_path / "g.part").write_text("".join(f"{p}\n" for p in parts))
    back = read_partition(tmp_path / "g.part", n_vertices=hg.n_vertices, parts=3)
    np.testing.assert_array_equal(back, parts)
    (tmp_path / "bad.part").write_text("0\n7\n")
    with pytest.raises(InputError, match=r"bad.part:2: block id 7 out of range \[0, 3\)"):
        read_partition(tmp_path / "bad.part", n_vertices=hg.n_vertices, parts=3)


@pytest.mark.long
def test_cli_partition_stats_compare(tmp_path):
    save_network(random_network([20, 24, 24, 4], 4, seed=0), tmp_path / "net.npz")
    proc = run_spdnn(tmp_path / "net.npz", "-P", "3", "-o", tmp_path / "plan.npz", "--compare",
                     module="partition")
    assert proc.returncode == 0, proc.stderr
    assert "sweep" in proc.stdout and "cyclic" in proc.stdout
    plan = load_plan(tmp_path / "plan.npz")
    assert plan.parts == 3 and plan.meta["method"] == "sweep"
    assert plan.meta["partition_seconds"] > 0 and "fingerprint" in plan.meta
    assert plan.meta["objective"] == "train"
    proc = run_spdnn(tmp_path / "net.npz", "-P", "3", "-o", tmp_path / "infer.npz",
                     "--objective", "infer", "--quiet", module="partition")
    # The summary leads with the volume that was optimised, and balance against each limit.
    assert proc.returncode == 0 and "forward volume" in proc.stdout and \
        "(the objective;" in proc.stdout, proc.stderr
    assert "within its balance limit" in proc.stdout
    assert load_plan(tmp_path / "infer.npz").meta["objective"] == "infer"
    proc = run_spdnn("stats", tmp_path / "net.npz", tmp_path / "plan.npz", module="partition")
    assert proc.returncode == 0 and "imbalance" in proc.stdout and "total" in proc.stdout
    assert "limit" in proc.stdout and "OVER" not in proc.stdout
    assert "volume" in proc.stdout and "per training step" in proc.stdout
    proc = run_spdnn("export", tmp_path / "net.npz", "-o", tmp_path / "g.hgr", module="partition")
    assert proc.returncode == 0, proc.stderr
    n = sum((20, 24, 24, 4))
    (tmp_path / "g.part").write_text("1\n" * n)
    proc = run_spdnn("import", tmp_path / "net.npz", tmp_path / "g.part", "-P", "2", "-o",
                     tmp_path / "imported.npz", module="partition")
    assert proc.returncode == 0, proc.stderr
    assert load_plan(tmp_path / "imported.npz").owners[1].tolist() == [1] * 24


def test_cli_bad_input(tmp_path):
    save_network(random_network([20, 24, 4], 4, seed=0), tmp_path / "net.npz")
    save_network(random_network([20, 24, 4], 4, seed=1), tmp_path / "other.npz")
    net = tmp_path / "net.npz"
    assert_one_line_error(run_spdnn(net, "-P", "0", "-o", tmp_path / "p.npz",
                                    module="partition"), "-P must be an integer >= 1, not 0")
    assert_one_line_error(run_spdnn(net, "-P", "2", "--epsilon", "1.2", "-o",
                                    tmp_path / "p.npz", module="partition"), "epsilon")
    assert not (tmp_path / "p.npz").exists()
    assert run_spdnn(net, "-P", "2", "-o", tmp_path / "p.npz", "--method", "cyclic",
                     module="partition").returncode == 0
    proc = run_spdnn("stats", tmp_path / "other.npz", tmp_path / "p.npz", module="partition")
    assert_one_line_error(proc, "p.npz", "plan was made for network")
    proc = run_spdnn(tmp_path / "missing.npz", "-P", "2", "-o", tmp_path / "q.npz",
                     module="partition")
    assert_one_line_error(proc, "missing.npz", "no such file")


def test_a_kahypar_crash_becomes_an_error(tmp_path, monkeypatch):
    from partition import backends

    # A minimal INI makes KaHyPar 1.3.7 end its process (measured; see partition/backends.py).
    (tmp_path / "minimal.ini").write_text("mode=direct\nobjective=km1\n")
    monkeypatch.setattr(backends, "KAHYPAR_INI", tmp_path / "minimal.ini")
    hg = build_hypergraph(network_patterns(small_network()))
    problem = backends.Problem(n_vertices=hg.n_vertices, net_indptr=hg.net_indptr,
                               net_pins=hg.net_pins,
                               vertex_weights=np.maximum(hg.vertex_weights, 1),
                                   net_weights=hg.net_weights, nparts=2, epsilon=0.03, seed=0)
    with pytest.raises(SpdnnError, match="KaHyPar failed .* k=2"):
        backends.solve(problem, "kahypar", timeout=60)


def test_backend_input_is_validated_before_c():
    from partition import backends

    bad = backends.Problem(n_vertices=3, net_indptr=np.array([0, 1]), net_pins=np.array([0]),
                           vertex_weights=np.ones(3, dtype=np.int64),
                           net_weights=np.ones(1, dtype=np.int64), nparts=2, epsilon=0.03, seed=0)
    with pytest.raises(SpdnnError, match="fewer than 2 pins"):
        backends.solve(bad)


def test_mtkahypar_backend():
    pytest.importorskip("mtkahypar", reason="mtkahypar is not installed (pip install mtkahypar)")
    net = NETWORKS["random"]()
    patterns = network_patterns(net)
    plan = partition_network(patterns, 3, method="hypergraph", backend="mtkahypar", seed=1)
    _balanced(patterns, plan.owners, 3, 0.03)
    baseline = min(plan_statistics(patterns, baseline_owners(b, patterns, parts=3, seed=1),
                                   parts=3).volume for b in BASELINES)
    assert plan.meta["stats"]["volume"] <= baseline and plan.meta["backend"] == "mtkahypar"


@pytest.mark.long
def test_mtkahypar_plan_does_not_depend_on_threads(tmp_path):
    pytest.importorskip("mtkahypar", reason="mtkahypar is not installed (pip install mtkahypar)")
    net = random_network([256, 512, 512], 16, seed=2)
    patterns = network_patterns(net)
    one = partition_network(patterns, 4, method="hypergraph", backend="mtkahypar", seed=3,
                            threads=1)
    two = partition_network(patterns, 4, method="hypergraph", backend="mtkahypar", seed=3,
                            threads=2)
    assert two.meta["threads"] == 2
    for a, b in zip(one.owners, two.owners):
        np.testing.assert_array_equal(a, b)
    save_network(net, tmp_path / "net.npz")
    proc = run_spdnn(tmp_path / "net.npz", "-P", "4", "-o", tmp_path / "p.npz", "--method",
                     "hypergraph", "--backend", "mtkahypar", "--threads", "2", "--seed", "3",
                     module="partition")
    assert proc.returncode == 0, proc.stderr
    for a, b in zip(one.owners, load_plan(tmp_path / "p.npz").owners):
        np.testing.assert_array_equal(a, b)
    for bad, why in ((["--threads", "0"], "--threads: must be a positive integer, not 0"),
                     (["--threads", "2", "--method", "hypergraph", "--backend", "kahypar"],
                      "KaHyPar runs on one thread")):
        proc = run_spdnn(tmp_path / "net.npz", "-P", "4", "-o", tmp_path / "q.npz", *bad,
                         module="partition")
        assert_one_line_error(proc, why)
        assert not (tmp_path / "q.npz").exists()


@pytest.mark.parametrize("backend", ["kahypar", "mtkahypar"])
def test_a_backend_that_runs_too_long_becomes_an_error(backend):
    from partition import backends

    if backend not in backends.available_backends():
        pytest.skip(f"{backend} is not installed")
    hg = build_hypergraph(network_patterns(random_network([256, 512, 512], 16, seed=2)))
    problem = backends.Problem(n_vertices=hg.n_vertices, net_indptr=hg.net_indptr,
                               net_pins=hg.net_pins,
                               vertex_weights=np.maximum(hg.vertex_weights, 1),
                                   net_weights=hg.net_weights, nparts=4, epsilon=0.03, seed=0)
    name = {"kahypar": "KaHyPar", "mtkahypar": "Mt-KaHyPar"}[backend]
    with pytest.raises(SpdnnError, match=f"^{name} failed .* k=4: timed out after 0.001 s"):
        backends.solve(problem, backend, timeout=0.001)
    assert backends.solve(problem, backend).max() == 3  # a fresh child (or worker) runs


def test_a_dead_mtkahypar_worker_is_an_error_then_replaced():
    import os

    from partition import backends

    pytest.importorskip("mtkahypar", reason="mtkahypar is not installed (pip install mtkahypar)")
    hg = build_hypergraph(network_patterns(small_network()))
    problem = backends.Problem(n_vertices=hg.n_vertices, net_indptr=hg.net_indptr,
                               net_pins=hg.net_pins,
                               vertex_weights=np.maximum(hg.vertex_weights, 1),
                                   net_weights=hg.net_weights, nparts=2, epsilon=0.03, seed=0)
    first = backends.solve(problem, "mtkahypar", threads=3)
    worker, _ = backends._WORKERS[(os.getpid(), 3)]
    worker.kill()
    worker.join()
    with pytest.raises(SpdnnError, match="^Mt-KaHyPar failed .* k=2: its process ended with "
                                         "exit code -9"):
        backends.solve(problem, "mtkahypar", threads=3)
    np.testing.assert_array_equal(backends.solve(problem, "mtkahypar", threads=3), first)


@pytest.mark.parametrize("args", [("net.npz", "-P", "2", "-o", "p.npz", "--bogus"),
                                  ("net.npz", "-P", "two", "-o", "p.npz"),
                                  ("stats", "net.npz"), ("export", "net.npz", "--bogus"),
                                  ("import", "net.npz"), ("model", "--bogus")])
def test_a_bad_option_is_one_line_for_every_form(tmp_path, args):
    proc = run_cli(*args, module="partition")
    assert_one_line_error(proc, "spdnn-partition", "--help")


def test_the_api_offers_the_commands_options_checked_in_one_place(tmp_path):
    """``partition.partition`` takes exact_sweeps, shortcuts and the reserve; a bad value is
    the same check as on the command line, named by its field here and by its flag there."""
    from partition import PartitionOptions, partition

    net = small_network((24, 20, 16, 8), fan_in=4, seed=2)
    plan = partition(net, parts=2, exact_sweeps=1, shortcuts=False, time_limit=60, reserve=5)
    assert plan.meta["exact_sweeps"] == 1 and plan.meta["time_limit"] <= 55
    assert "exact" in plan.meta["candidates"]
    for bad, message in (({"reserve": 5}, "reserve is kept back from a time limit"),
                         ({"time_limit": 10, "reserve": -1}, "reserve must be a non-negative"),
                         ({"shortcuts": "no"}, "shortcuts must be True or False"),
                         ({"seed": True}, "seed must be an integer")):
        with pytest.raises(SpdnnError, match=message):
            partition(net, parts=2, **bad)
    with pytest.raises(SpdnnError, match="epsilon must be a number in") as caught:
        PartitionOptions(epsilon=0).checked(2)
    assert str(caught.value.as_flag()) == "--epsilon must be a number in (0, 1), not 0"
    save_network(net, tmp_path / "net.npz")
    proc = run_spdnn(tmp_path / "net.npz", "-P", "2", "--epsilon", "0", "-o", tmp_path / "p.npz",
                     module="partition")
    assert_one_line_error(proc, "--epsilon: must be a number in (0, 1), not 0")


def test_progress_lines_only_on_a_terminal_or_with_verbose(tmp_path):
    """spdnn-partition's progress goes to a person: printed when stderr is a terminal or
    with --verbose, not into a log file by default; --quiet silences it everywhere."""
    import pty
    import subprocess
    import sys

    from spdnn.io.bundle import save_network
    from tests.helpers import run_spdnn, small_network

    save_network(small_network((12, 16, 9, 4), fan_in=4), tmp_path / "net.npz")
    args = [tmp_path / "net.npz", "-P", "2", "-o", tmp_path / "p.npz"]
    quiet = run_spdnn(*args, module="partition")
    loud = run_spdnn(*args, "--verbose", module="partition")
    assert quiet.returncode == loud.returncode == 0, quiet.stderr + loud.stderr
    assert quiet.stderr == "" and "hypergraph:" in loud.stderr
    assert "wrote" in quiet.stdout
    main, other = pty.openpty()  # stderr a terminal, as a person's
    proc = subprocess.run([sys.executable, "-m", "partition", *map(str, args)], stderr=other,
                          stdout=subprocess.PIPE, timeout=120)
    os.close(other)
    seen = os.read(main, 65536).decode()
    os.close(main)
    assert proc.returncode == 0 and "hypergraph:" in seen
