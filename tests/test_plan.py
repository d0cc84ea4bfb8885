import numpy as np
import pytest

from spdnn.errors import InputError
from spdnn.io.planfile import load_plan, save_plan
from spdnn.model.plan import Plan, network_patterns, plan_statistics
from tests.helpers import small_network


def brute_force(net, owners, nparts):
    """Volume, per-rank traffic, pairs and imbalance from the definitions, with plain loops."""
    fwd, bwd, pairs, imb = [], [], [], []
    sent, recv = [0] * nparts, [0] * nparts
    for k, layer in enumerate(net.layers, start=1):
        dense = layer.weight.toarray()
        volume, pair_set = 0, set()
        for j in range(layer.n_in):
            src = int(owners[k - 1][j])
            users = {int(owners[k][i]) for i in range(layer.n_out) if dense[i, j] != 0}
            for p in users - {src}:
                volume += 1
                pair_set.add((src, p))
                sent[src] += 1
                recv[p] += 1
                if k > 1:
                    sent[p] += 1
                    recv[src] += 1
        fwd.append(volume)
        bwd.append(volume if k > 1 else 0)
        pairs.append(len(pair_set))
        loads = [0] * nparts
        for i in range(layer.n_out):
            loads[int(owners[k][i])] += int(np.count_nonzero(dense[i]))
        imb.append(max(loads) / (sum(loads) / nparts) - 1)
    return fwd, bwd, pairs, imb, sent, recv


@pytest.mark.parametrize("nparts", [1, 2, 3, 5])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_statistics_equal_brute_force(nparts, seed, backend):
    net = small_network((15, 11, 9, 6), fan_in=5, seed=seed)
    rng = np.random.default_rng(seed)
    owners = [rng.integers(0, nparts, n).astype(np.int32) for n in net.sizes]
    stats = plan_statistics(network_patterns(net), owners, parts=nparts)
    fwd, bwd, pairs, imb, sent, recv = brute_force(net, owners, nparts)
    assert list(stats.forward) == fwd and list(stats.backward) == bwd
    assert list(stats.pairs) == pairs
    np.testing.assert_allclose(stats.imbalance, imb, rtol=1e-12)
    assert list(stats.sent) == sent and list(stats.received) == recv
    assert stats.volume == sum(fwd) + sum(bwd) == sum(sent) == sum(recv)
    if nparts == 1:
        assert stats.volume == 0


def test_plan_file_round_trip_and_checks(tmp_path):
    net = small_network()
    owners = tuple(np.arange(n, dtype=np.int32) % 3 for n in net.sizes)
    plan = Plan(3, owners, {"method": "cyclic", "fingerprint": net.fingerprint()})
    save_plan(plan, tmp_path / "plan.npz")
    back = load_plan(tmp_path / "plan.npz")
    assert back.parts == 3 and back.meta == plan.meta
    for a, b in zip(owners, back.owners):
        np.testing.assert_array_equal(a, b)
        assert b.dtype == np.int32
    back.check_for(net.sizes, net.fingerprint())
    with pytest.raises(InputError, match="plan was made for network"):
        back.check_for(net.sizes, small_network(seed=5).fingerprint(), "plan.npz")
    with pytest.raises(InputError, match="plan is for layer sizes"):
        back.check_for((12, 9, 7, 5), net.fingerprint(), "plan.npz")
    np.testing.assert_array_equal(back.rows_of(1, 1), [1, 4, 7])


def test_bad_plan_files(tmp_path):
    net = small_network()
    owners = tuple(np.zeros(n, dtype=np.int32) for n in net.sizes)
    save_plan(Plan(2, owners, {}), tmp_path / "ok.npz")
    with np.load(tmp_path / "ok.npz") as z:
        arrays = {k: z[k] for k in z.files}
    np.savez(tmp_path / "v9.npz", **{**arrays, "format": np.array("spdnn-plan/9")})
    with pytest.raises(InputError, match="unknown format version 'spdnn-plan/9'"):
        load_plan(tmp_path / "v9.npz")
    np.savez(tmp_path / "range.npz", **{**arrays, "owner2": np.full(7, 2, dtype=np.int32)})
    with pytest.raises(InputError, match=r"owner2 has ranks outside \[0, 2\)"):
        load_plan(tmp_path / "range.npz")
    with pytest.raises(InputError, match="no such file"):
        load_plan(tmp_path / "none.npz")



def test_step_values_and_the_stats_command(tmp_path):
    from partition.methods import partition_network
    from spdnn.io.bundle import save_network
    from spdnn.model.plan import step_values
    from tests.helpers import assert_one_line_error, run_spdnn

    net = small_network()
    plan = partition_network(network_patterns(net), 2, method="cyclic",
                             fingerprint=net.fingerprint())
    stats = plan_statistics(network_patterns(net), plan.owners, parts=2)
    v = step_values(stats, [lay.nnz for lay in net.layers], net.sizes[1:], 3, 10)
    assert v.expand == tuple(10 * f for f in stats.forward)
    assert v.fold == tuple(10 * b for b in stats.backward) and v.fold[0] == 0
    assert v.gradient_in == tuple(3 * (lay.nnz + lay.n_out) for lay in net.layers)
    assert v.gradient_sent == tuple(2 * 2 * (lay.nnz + lay.n_out) for lay in net.layers)
    assert step_values(stats, [1, 1, 1], [1, 1, 1], 1, 10).gradient_in == (0, 0, 0)
    save_network(net, tmp_path / "net.npz")
    save_plan(plan, tmp_path / "plan.npz")
    proc = run_spdnn("stats", tmp_path / "net.npz", tmp_path / "plan.npz", "--replicas", "3",
                     "--batch-size", "10", module="partition")
    assert proc.returncode == 0, proc.stderr
    assert "ring all-reduce" in proc.stdout
    assert f"total  {sum(v.expand):>12,}  {sum(v.fold):>12,}  {sum(v.gradient_in):>16,}" \
        in proc.stdout
    assert_one_line_error(run_spdnn("stats", tmp_path / "net.npz", tmp_path / "plan.npz",
                                    "--replicas", "2", module="partition"), "go together")


def test_imbalance_limits_and_the_balance_report():
    from spdnn.model.plan import PlanStats, balance_report, imbalance_limits

    # Layer 1: 8 rows of 2 nonzeros; layer 2: 3 heavy rows (a head) of 8.
    one = (np.arange(0, 17, 2), np.zeros(16, np.int64), (8, 4))
    head = (np.arange(0, 25, 8), np.zeros(24, np.int64), (3, 8))
    limits = imbalance_limits([one, head], 2, 0.03)
    # A part may hold (1 + eps) x average + the heaviest row: eps + w_max x P / total.
    assert limits == pytest.approx((0.03 + 2 * 2 / 16, 0.03 + 8 * 2 / 24))
    within = PlanStats(parts=2, forward=(1, 2), backward=(0, 2), pairs=(1, 1), imbalance=(0.0,
                                                                                           1 / 3),
        sent=(1, 1), received=(1, 1))
    assert balance_report(within, limits).startswith("every layer within its balance limit")
    assert "33.33% on layer 2, whose limit is 69.67%" in balance_report(within, limits)
    over = PlanStats(parts=2, forward=(1, 2), backward=(0, 2), pairs=(1, 1), imbalance=(0.5,
                                                                                         1 / 3),
        sent=(1, 1), received=(1, 1))
    assert balance_report(over, limits) == \
        "OVER the balance limit on layer(s) 1 (50.00% > 28.00%)"
    assert balance_report(over, None) == "max imbalance 50.00% (layer 1)"


def test_cut_pairs_by_table_equal_cut_pairs_by_sorting(monkeypatch):
    from spdnn.model import plan as plan_module

    rng = np.random.default_rng(0)
    for _ in range(30):
        n_in, n_out, nparts = int(rng.integers(1, 60)), int(rng.integers(1, 60)), \
            int(rng.integers(1, 9))
        indptr = np.concatenate([[0], np.cumsum(rng.integers(0, 5, n_out))])
        indices = rng.integers(0, n_in, indptr[-1]).astype(np.int32)
        owner_out = rng.integers(0, nparts, n_out).astype(np.int32)
        owner_in = rng.integers(0, nparts, n_in).astype(np.int32)
        table = plan_module.cut_pairs(indptr, indices, owner_out, owner_in, nparts)
        monkeypatch.setattr(plan_module, "CUT_TABLE_CELLS", 0)
        sorted_ = plan_module.cut_pairs(indptr, indices, owner_out, owner_in, nparts)
        monkeypatch.undo()
        assert all(np.array_equal(a, b) for a, b in zip(table, sorted_))


def test_statistics_in_one_pass_equal_statistics_from_sorted_pairs(monkeypatch):
    """plan_statistics counts cut rows, per-rank volumes and rank pairs in one numba pass;
    above PAIR_TABLE_PARTS ranks it sorts the (input row, rank) pairs as before. Both agree,
    windows (first_layer > 1: every layer folds) included."""
    from spdnn.model import plan as plan_module

    rng = np.random.default_rng(1)
    for trial in range(40):
        sizes = rng.integers(1, 50, int(rng.integers(2, 5)))
        nparts = int(rng.integers(1, 12))
        patterns, owners = [], [rng.integers(0, nparts, sizes[0]).astype(np.int32)]
        for n_in, n_out in zip(sizes[:-1], sizes[1:]):
            indptr = np.concatenate([[0], np.cumsum(rng.integers(0, 6, n_out))])
            indices = rng.integers(0, n_in, indptr[-1]).astype(np.int32)
            patterns.append((indptr, indices, (int(n_out), int(n_in))))
            owners.append(rng.integers(0, nparts, n_out).astype(np.int32))
        first = 1 + trial % 2
        fast = plan_statistics(patterns, owners, parts=nparts, first_layer=first)
        monkeypatch.setattr(plan_module, "PAIR_TABLE_PARTS", 0)
        slow = plan_statistics(patterns, owners, parts=nparts, first_layer=first)
        monkeypatch.undo()
        assert fast == slow


def test_messages_per_step_count_each_communicating_pair_once_each_way():
    """Brute force: a layer's messages are the distinct (owner of input j, owner of a row
    reading j) pairs of different ranks; a layer that folds sends each back once more."""
    rng = np.random.default_rng(3)
    net = small_network((30, 40, 20, 9), fan_in=4)
    patterns = network_patterns(net)
    for nparts in (1, 2, 5):
        owners = [rng.integers(0, nparts, n).astype(np.int32) for n in net.sizes]
        want = 0
        for k, (indptr, indices, _) in enumerate(patterns, start=1):
            rows = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
            pairs = {(int(owners[k - 1][j]), int(owners[k][i]))
                     for i, j in zip(rows, indices) if owners[k - 1][j] != owners[k][i]}
            want += len(pairs) * (2 if k > 1 else 1)
        stats = plan_statistics(patterns, owners, parts=nparts)
        assert stats.messages == want == stats.summary()["messages"]


def test_arguments_of_the_wrong_kind_are_named_at_the_call(tmp_path):
    """A network where a plan goes (or an array where a network goes) is a TypeError naming
    the argument, not an AttributeError from inside the writer; nothing is written."""
    from partition import partition
    from spdnn.io.bundle import save_network

    net = small_network()
    plan = partition(net, parts=2, method="block")
    with pytest.raises(TypeError, match="plan must be a spdnn.Plan .*not Network"):
        save_plan(net, tmp_path / "p.npz")
    with pytest.raises(TypeError, match="network must be a spdnn.Network, not Plan"):
        save_network(plan, tmp_path / "n.npz")
    with pytest.raises(TypeError, match="network must be a network bundle's path or a "
                                        "spdnn.Network, not ndarray"):
        partition(np.zeros(3), parts=2)
    assert list(tmp_path.iterdir()) == []
