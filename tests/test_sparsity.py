"""Dynamic sparsity's rule and its options: the schedule of the updates, the serial reference's
update (fan-in kept, the smallest |w| dropped, RigL's growth where torch's gradient of the
masked dense network is largest), and every bad input refused in one line (exit code 2).
The distributed runs against the reference: tests/test_sparsity_mpi.py."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from spdnn.errors import OptionError
from spdnn.io.bundle import save_network
from spdnn.model.generate import random_network
from spdnn.model.sparsity import SparseUpdate, drop_counts, grow_draws, layer_draws
from spdnn.optim import SGDConfig, make, parameters
from spdnn.reference import layer_gradients, update_topology
from tests.helpers import assert_one_line_error, import_torch, launch, small_network


def test_the_fraction_decays_by_a_cosine_to_zero_at_the_end():
    upd = SparseUpdate(mode="rigl", every=100, drop_fraction=0.3, until=0.75, total=1000)
    assert upd.end() == 750
    assert [s for s in range(1, 1001) if upd.due(s)] == [100, 200, 300, 400, 500, 600, 700]
    assert upd.fraction(0) == pytest.approx(0.3)
    assert upd.fraction(375) == pytest.approx(0.15)
    assert upd.fraction(750) == pytest.approx(0.0, abs=1e-15)
    assert upd.fraction(100) == pytest.approx(0.15 * (1 + math.cos(math.pi * 100 / 750)))
    at_step = replace(upd, until=450)  # an integer: a step
    assert at_step.end() == 450 and not at_step.due(500) and at_step.due(400)
    assert drop_counts(np.array([0, 1, 2, 5, 10]), 0.25).tolist() == [0, 0, 1, 1, 3]


@pytest.mark.parametrize(("changes", "name"), [
    ({"drop_fraction": 0}, "drop_fraction"), ({"drop_fraction": 1}, "drop_fraction"),
    ({"drop_fraction": 1.5}, "drop_fraction"), ({"every": 0}, "update_every"),
    ({"until": 0}, "update_until"), ({"until": 1.5}, "update_until"),
    ({"mode": "prune"}, "sparse_update"), ({"scope": "column"}, "update_scope"),
])
def test_bad_settings_are_refused_by_name(changes, name):
    with pytest.raises(OptionError) as exc:
        SparseUpdate(**{"mode": "set", **changes})
    assert exc.value.name == name


def test_set_draws_depend_on_the_row_not_on_who_draws_them():
    rows = np.arange(50)
    whole = grow_draws(3, 2, 1, rows, 0, 30)
    assert np.array_equal(whole[10:20], grow_draws(3, 2, 1, rows[10:20], 0, 30))
    assert not np.array_equal(whole, grow_draws(3, 3, 1, rows, 0, 30))  # another update
    assert whole.min() >= 0 and whole.max() < 30


def test_set_draws_are_uniform_and_near_columns_w_times_as_likely():
    """Over 60,000 draws, every column of 30 is drawn about equally often (each count within
    5 standard deviations of 2,000), in row scope and layer scope; with --grow-locality 4 a
    near column is drawn 4 times as often as a far one."""
    rows, n_in = np.arange(60_000), 30
    counts = np.bincount(grow_draws(3, 2, 1, rows, 0, n_in), minlength=n_in)
    assert np.all(np.abs(counts - 2000) < 5 * np.sqrt(2000))
    cells = np.bincount(layer_draws(3, 2, 1, 0, 60_000, 20, 30) % 30, minlength=30)
    assert np.all(np.abs(cells - 2000) < 5 * np.sqrt(2000))
    near = np.arange(0, 30, 3)  # 10 near, 20 far: a near column's share 4 / (4 x 10 + 20)
    counts = np.bincount(grow_draws(3, 2, 1, rows, 0, n_in, near, 4.0), minlength=n_in)
    expected = np.where(np.isin(np.arange(n_in), near), 4.0, 1.0) * 60_000 / 60
    assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected))


def _stepped(mode: str, scope: str = "row"):  # noqa: ANN202
    net = small_network((16, 20, 12, 5), fan_in=5, seed=4, bias_scale=0.3).copy()
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((16, 8)), rng.integers(0, 5, 8)
    opt = make(SGDConfig(0.05, 0.9, 0.0), parameters(net.layers))
    for k, layer in enumerate(net.layers):  # a momentum buffer to follow the entries
        opt.state[2 * k]["momentum_buffer"] = layer.weight.data * 10
    before = net.copy()
    upd = SparseUpdate(mode=mode, every=1, drop_fraction=0.5, until=10, seed=1, total=10,
                       scope=scope)
    counts = update_topology(net, opt, upd, 1, x, y, "cross_entropy")
    return before, net, opt, upd, counts, (x, y)


@pytest.mark.parametrize("mode", ["set", "rigl"])
def test_an_update_keeps_every_fan_in_and_drops_the_smallest(mode):
    before, after, opt, upd, counts, (x, y) = _stepped(mode)
    scores = layer_gradients(before, x, y, "cross_entropy") if mode == "rigl" else None
    for k, (a, b) in enumerate(zip(before.layers, after.layers)):
        assert np.array_equal(np.diff(a.weight.indptr), np.diff(b.weight.indptr))
        for i in range(a.n_out):
            old = dict(zip(a.weight[i].indices, a.weight[i].data))
            new = dict(zip(b.weight[i].indices, b.weight[i].data))
            c = int(drop_counts(np.array([len(old)]), upd.fraction(1))[0])
            dropped = set(sorted(old, key=lambda j: (abs(old[j]), j))[:c])
            kept = set(old) - dropped
            grown = set(new) - kept  # a dropped column grown again keeps its weight
            assert kept <= set(new) and len(grown) == c
            assert all(new[j] == old[j] for j in set(new) & set(old))
            buf = opt.state[2 * k]["momentum_buffer"]
            row = slice(b.weight.indptr[i], b.weight.indptr[i + 1])
            for j, v in zip(b.weight.indices[row], buf[row]):
                assert v == (10 * old[j] if j in old else 0)
            came = set(new) - set(old)
            if mode == "rigl":
                assert all(new[j] == 0 for j in came)
                if grown:  # the grown beat every column not held
                    g = np.abs(scores[k][i])
                    free = [j for j in range(a.n_in) if j not in kept and j not in grown]
                    assert min(g[j] for j in grown) >= max((g[j] for j in free), default=0)
            else:
                limit = math.sqrt(6 / (a.n_in + a.n_out))
                assert all(0 < abs(new[j]) <= limit for j in came)
    assert sum(c["dropped"] for c in counts) > 0


@pytest.mark.parametrize("mode", ["set", "rigl"])
def test_layer_scope_drops_the_layers_smallest_and_keeps_its_count(mode):
    before, after, _, upd, counts, (x, y) = _stepped(mode, "layer")
    scores = layer_gradients(before, x, y, "cross_entropy") if mode == "rigl" else None
    moved = False
    for k, (a, b) in enumerate(zip(before.layers, after.layers)):
        assert a.nnz == b.nnz
        moved |= not np.array_equal(np.diff(a.weight.indptr), np.diff(b.weight.indptr))
        old = {(i, j): v for i, j, v in zip(*_coo(a))}
        new = {(i, j): v for i, j, v in zip(*_coo(b))}
        c = int(drop_counts(np.array([a.nnz]), upd.fraction(1))[0])
        dropped = set(sorted(old, key=lambda p: (abs(old[p]), p))[:c])
        kept = set(old) - dropped
        grown = set(new) - kept
        assert kept <= set(new) and len(grown) == c
        if mode == "rigl":
            g = np.abs(scores[k])
            free = [(i, j) for i in range(a.n_out) for j in range(a.n_in)
                    if (i, j) not in kept and (i, j) not in grown]
            assert min(g[p] for p in grown) >= max(g[p] for p in free)
    assert moved  # rows' fan-ins change in layer scope


def _coo(layer):  # noqa: ANN001, ANN202
    coo = layer.weight.tocoo()
    return coo.row.tolist(), coo.col.tolist(), coo.data.tolist()


def test_rigl_scores_are_torchs_gradient_of_the_masked_dense_network():
    torch = import_torch()
    net = small_network((16, 20, 12, 5), fan_in=5, seed=4, bias_scale=0.3)
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((16, 8)), rng.integers(0, 5, 8)
    weights = [torch.tensor(layer.weight.toarray(), requires_grad=True) for layer in net.layers]
    h = torch.tensor(x.T)
    for k, (w, layer) in enumerate(zip(weights, net.layers)):
        h = h @ w.T + torch.tensor(layer.bias)
        if k + 1 < net.n_layers:
            h = torch.relu(h)
    torch.nn.functional.cross_entropy(h, torch.tensor(y)).backward()
    for ours, w in zip(layer_gradients(net, x, y, "cross_entropy"), weights):
        np.testing.assert_allclose(ours, w.grad.numpy(), rtol=0, atol=1e-12)


@pytest.fixture(scope="module")
def networks(tmp_path_factory):
    d = tmp_path_factory.mktemp("sparse")
    save_network(random_network([64, 32, 10], 8, seed=0), d / "sparse.npz")
    save_network(random_network([64, 32], 64, seed=0, head=10), d / "dense.npz")
    return d


@pytest.mark.parametrize(("args", "fragments"), [
    (["--drop-fraction", "1"], ("--drop-fraction", "(0, 1)")),
    (["--drop-fraction", "0"], ("--drop-fraction", "(0, 1)")),
    (["--update-every", "0"], ("--update-every", "must be a positive integer, not 0")),
    (["--update-until", "1.5"], ("--update-until",)),
    (["--grow-locality", "0"], ("--grow-locality", "> 0")),
    (["--replan", "often"], ("--replan", "never, auto or every:K")),
    (["--replan", "every:0"], ("--replan", "every:K")),
    (["--update-scope", "layer", "--grow-locality", "2"], ("--grow-locality", "layer scope")),
    (["--lsh", "2:4:4"], ("--sparse-update does not apply with --lsh",)),
    (["--compress", "topk:0.1"], ("--sparse-update does not apply with --compress",)),
    (["--critical-set", "0.5"], ("--sparse-update does not apply with --critical-set",)),
])
def test_bad_update_options_get_one_line(networks, args, fragments):
    proc = launch(0, "train", "--network", networks / "sparse.npz", "--epochs", "1",
                  "--sparse-update", "set", *args)
    assert_one_line_error(proc, *fragments)


def test_an_update_setting_without_an_update_and_a_dense_network_are_refused(networks):
    proc = launch(0, "train", "--network", networks / "sparse.npz", "--update-every", "5")
    assert_one_line_error(proc, "--update-every needs --sparse-update")
    proc = launch(0, "train", "--network", networks / "dense.npz", "--sparse-update", "rigl")
    assert_one_line_error(proc, "dense.npz", "every layer is dense")


def test_a_resume_with_other_update_settings_is_refused(networks, tmp_path):
    common = ["train", "--network", networks / "sparse.npz", "--epochs", "2",
              "--sparse-update", "set", "--update-every", "5"]
    ckpt = tmp_path / "ckpt"
    proc = launch(0, *common, "--max-steps", "12", "--checkpoint-dir", ckpt)
    assert proc.returncode == 0, proc.stderr
    proc = launch(0, *common[:-1], "7", "--resume", ckpt)
    assert_one_line_error(proc, "manifest.json", "update_every 5, this run has 7")
    proc = launch(0, *common[:-4], "--resume", ckpt)
    assert_one_line_error(proc, "sparse_update set, this run has none")
    metrics = tmp_path / "m.json"
    proc = launch(0, *common, "--resume", ckpt, "--metrics-out", metrics)
    assert proc.returncode == 0, proc.stderr
    updates = json.loads(metrics.read_text())["topology_updates"]
    # 12 steps were done; 2 epochs are 46 steps, and updates end at 0.75 of them (34)
    assert [u["step"] for u in updates] == [15, 20, 25, 30]
    assert "4 topology update(s) from step 15 to 30" in proc.stdout


def test_two_ranks_stop_one_resumes_and_saves_the_topology_one_run_reaches(networks, tmp_path):
    """The command line end to end: RigL on 2 ranks under a hypergraph plan, stopped at step
    12; resumed on one process (the checkpoint carries the topology), its saved network equals
    that of one process that ran through."""
    from spdnn.io.bundle import load_network
    from tests.helpers import run_cli

    plan = tmp_path / "p2.npz"
    assert run_cli(networks / "sparse.npz", "-P", "2", "-o", plan, module="partition"
                   ).returncode == 0
    common = ["train", "--network", networks / "sparse.npz", "--epochs", "2", "--dtype",
              "float64", "--sparse-update", "rigl", "--update-every", "4"]
    ckpt = tmp_path / "ckpt"
    first = launch(2, *common, "--plan", plan, "--max-steps", "12", "--checkpoint-dir", ckpt)
    assert first.returncode == 0, first.stderr
    resumed = launch(0, *common, "--resume", ckpt, "--save", tmp_path / "resumed.npz")
    assert resumed.returncode == 0, resumed.stderr
    whole = launch(0, *common, "--save", tmp_path / "whole.npz")
    assert whole.returncode == 0, whole.stderr
    a, b = load_network(tmp_path / "resumed.npz"), load_network(tmp_path / "whole.npz")
    original = load_network(networks / "sparse.npz")
    assert not np.array_equal(a.layers[0].weight.indices, original.layers[0].weight.indices)
    for la, lb in zip(a.layers, b.layers):
        np.testing.assert_array_equal(la.weight.indptr, lb.weight.indptr)
        np.testing.assert_array_equal(la.weight.indices, lb.weight.indices)
        np.testing.assert_allclose(la.weight.data, lb.weight.data, rtol=0, atol=1e-10)


def test_the_saved_plan_is_for_the_final_topology(networks, tmp_path):
    """--save-plan on 2 ranks with --replan every:1: the plan file carries the fingerprint of
    the network --save wrote and, as its statistics, the rows a step the last update's record
    gives; spdnn infer runs the saved network under it on 2 ranks."""
    import json

    from spdnn.io.bundle import load_network
    from spdnn.io.planfile import load_plan
    from spdnn.model.plan import network_patterns, plan_statistics
    from tests.helpers import run_cli

    plan = tmp_path / "p2.npz"
    assert run_cli(networks / "sparse.npz", "-P", "2", "-o", plan, "--method", "block",
                   module="partition").returncode == 0
    saved, final, metrics = tmp_path / "trained.npz", tmp_path / "final.npz", tmp_path / "m.json"
    proc = launch(2, "train", "--network", networks / "sparse.npz", "--plan", plan,
                  "--epochs", "1", "--sparse-update", "set", "--update-every", "5",
                  "--replan", "every:1", "--save", saved, "--save-plan", final,
                  "--metrics-out", metrics)
    assert proc.returncode == 0, proc.stderr
    assert f"saved the plan in force to {final}" in proc.stdout
    net, got = load_network(saved), load_plan(final)
    assert got.fingerprint == net.fingerprint() != load_network(networks / "sparse.npz"
                                                                 ).fingerprint()
    stats = plan_statistics(network_patterns(net), got.owners, parts=2)
    last = json.loads(metrics.read_text())["topology_updates"][-1]
    assert stats.forward_total + stats.backward_total == last["rows_per_step"]
    assert got.meta["stats"] == json.loads(json.dumps(stats.summary()))
    infer = launch(2, "infer", "--network", saved, "--plan", final, "--inputs", "digits")
    assert infer.returncode == 0, infer.stderr
    # an output that names the input plan is refused before the job starts
    clash = launch(0, "train", "--network", networks / "sparse.npz", "--plan", plan,
                   "--sparse-update", "set", "--save-plan", plan)
    assert clash.returncode == 2 and clash.stderr.count("\n") == 1, clash.stderr


class _OneRank:
    rank = 0

    @staticmethod
    def bcast(x):  # noqa: ANN001, ANN205
        return x


@pytest.mark.parametrize("pays", [False, True])
def test_replan_auto_backs_off_while_its_checks_do_not_pay(pays):
    """--replan auto checks after updates 1, 3, 7, 15, 31, 47 when no check pays (waits of
    1, 2, 4, 8, 16 updates, then 16), after every update while they pay; every:K after
    every K-th."""
    from types import SimpleNamespace

    from spdnn.model.plan import Plan
    from spdnn.runtime import replan as rp

    owners = (np.zeros(4, np.int32), np.array([0, 0, 1, 1], np.int32))
    checks: list[int] = []

    def replanner(patterns, plan_owners, parts):  # noqa: ANN001, ANN202
        checks.append(count)
        return plan_owners, 100 - (1000 if pays else 0)  # 1000 rows fewer pays

    moves: list[int] = []
    monkey = pytest.MonkeyPatch()
    monkey.setattr(rp, "move_rows", lambda dnet, opt, plan: moves.append(count))
    try:
        dnet = SimpleNamespace(comm=_OneRank(), layers=[], dtype=np.dtype(np.float32),
                               plan=Plan(2, owners, {"method": "block"}))
        opt = SimpleNamespace(config=None, state_arrays=lambda config: 1)
        for every in ("auto", "every:5"):
            checks.clear()
            update = SparseUpdate(mode="set", every=10, replan=every)
            replanning = rp.Replanning(dnet, opt, update, replanner, batch=8)
            for count in range(1, 51):
                replanning.after(count, 100)
            if every == "every:5":
                assert checks == list(range(5, 51, 5))
            elif pays:
                assert checks == list(range(1, 51))
            else:
                assert checks == [1, 3, 7, 15, 31, 47]
    finally:
        monkey.undo()


def test_replan_auto_counts_the_layers_a_move_rebuilds():
    """A move pays when the rows it saves outweigh the values it carries and the values of the
    layers it rebuilds: one neuron of 5 values moving in a 100-value layer costs 105 values
    of 16 bytes (float32, a momentum, an index); a row a step saves 8 x 4 bytes x 10 steps."""
    from types import SimpleNamespace

    from spdnn.model.plan import Plan
    from spdnn.runtime.replan import Replanning

    indptr = np.array([0, 5] + [5 + 5 * i for i in range(1, 20)])  # 20 rows, 5 values each
    patterns = [(indptr, np.zeros(100, np.int64), (20, 4))]
    old = (np.zeros(4, np.int32), np.repeat(np.array([0, 1], np.int32), 10))
    new = (old[0], old[1].copy())
    new[1][0] = 1
    dnet = SimpleNamespace(dtype=np.dtype(np.float32), plan=Plan(2, old, {}))
    opt = SimpleNamespace(config=None, state_arrays=lambda config: 1)
    replanning = Replanning(dnet, opt, SparseUpdate(mode="set", every=10, replan="auto"),
                            lambda *a: None, batch=8)
    assert not replanning._pays(patterns, old, 0)
    assert not replanning._pays(patterns, new, 5)  # 1,600 B < 105 x 16 B: the rebuild counts
    assert replanning._pays(patterns, new, 6)  # 1,920 B
