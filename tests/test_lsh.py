"""LSH of neurons and samples (spdnn.kernels.lsh and .hashing, their numba kernels) against
plain computations: DWTA and SimHash codes, the tables' order and retrieval, the rebuild
schedule, the rows-only SGD update, and the options' errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp

from spdnn.kernels._numba_hashing import _probe
from spdnn.kernels.hashing import HashFunctions, Tables
from spdnn.kernels.lsh import (
    LshSpec,
    apply_cap,
    fill_rows,
    is_rebuild_step,
    parse_lsh,
    top_bias_rows,
)
from spdnn.model.labels import MultiLabels
from spdnn.optim import SGD, RowGrad, SGDConfig
from spdnn.reference import lsh_tables
from tests.helpers import launch, small_network


def test_parse():
    assert parse_lsh("2:6:50") == LshSpec(layer=2, k=6, tables=50, kind="dwta")
    assert parse_lsh("3:9:50:SIMHASH").text() == "3:9:50:simhash"
    for bad, message in (("2:6", "LAYER:K:L"), ("2:x:5", "integers"), ("2:6:50:minhash",
                         "unknown hash"), ("2:0:5", "K must lie"), ("2:21:5", "K must lie"),
                         ("2:6:0", "L must lie"), ("0:6:5", "count from 1")):
        with pytest.raises(ValueError, match=message):
            parse_lsh(bad)


def _dwta_by_hand(hf: HashFunctions, v: np.ndarray) -> np.ndarray:
    k, tables = hf.spec.k, hf.spec.tables
    n_fn = k * tables
    arg = np.full(n_fn, -1)
    for f in range(n_fn):
        members = [(int(c), q) for q, c in enumerate(hf.members[f])]
        assert len(set(members)) == hf.base  # a bin of distinct coordinates
        live = [(v[c], -q, q) for c, q in members if v[c] != 0]
        if live:
            arg[f] = max(live)[2]  # the largest value, the first position among equals
    codes = []
    for t in range(tables):
        code = 0
        for j in range(k):
            f, a, attempt = t * k + j, arg[t * k + j], 1
            while a < 0 and attempt <= 2 * n_fn:
                a = arg[_probe(f, attempt, n_fn)]
                attempt += 1
            code = code * hf.base + max(a, 0)
        codes.append(code)
    return np.array(codes)


@pytest.mark.parametrize("spec", ["2:3:5:dwta", "2:6:7:dwta"])  # 15 functions; 32 + 10
def test_dwta_codes_match_a_plain_computation(spec, backend):
    hf = HashFunctions.make(parse_lsh(spec), 40, seed=4)
    rng = np.random.default_rng(0)
    v = rng.standard_normal((6, 40)) * (rng.random((6, 40)) < 0.4)
    v[1] = 0  # every bin empty: code 0
    v[2, :] = np.where(v[2] != 0, 1.0, 0)  # ties: the first position wins
    v[3, :5] = -2.0  # negative values win where nothing larger is there
    m = sp.csr_matrix(v)
    got = hf.codes(m.indptr, m.indices, m.data)
    for i in range(6):
        np.testing.assert_array_equal(got[i], _dwta_by_hand(hf, v[i]), err_msg=str(i))
    assert np.all(got[1] == 0) and got.max() < 8 ** hf.spec.k


@pytest.mark.parametrize("n_in", [5, 8, 40, 300])  # bins of 5 (no power of 2), 8, and wide
def test_dwta_codes_over_several_blocks_of_rows(n_in, backend):
    """More rows than one block (side-by-side rows: 128 at 40 inputs) and a tail; float32
    and float64 alike; a column map gives the codes of the mapped rows."""
    hf = HashFunctions.make(parse_lsh("2:4:9:dwta"), n_in, seed=7)
    rng = np.random.default_rng(n_in)
    v = rng.standard_normal((301, n_in)) * (rng.random((301, n_in)) < 0.3)
    v[7] = 0
    m = sp.csr_matrix(v)
    got = hf.codes(m.indptr, m.indices, m.data)
    assert got.shape == (301, 9)
    for i in range(0, 301, 7):
        np.testing.assert_array_equal(got[i], _dwta_by_hand(hf, v[i]), err_msg=str(i))
    m32 = m.astype(np.float32)
    np.testing.assert_array_equal(hf.codes(m32.indptr, m32.indices, m32.data),
                                  hf.codes(m32.indptr, m32.indices, m32.data.astype(np.float64)))
    perm = rng.permutation(n_in)  # local column j is input coordinate perm[j]
    local = sp.csr_matrix(v[:, perm])
    np.testing.assert_array_equal(hf.codes(local.indptr, local.indices, local.data, perm), got)


@pytest.mark.parametrize("top", [1, 5, 2**11, 8**6, 2**31 + 5, 2**40, 2**61])
def test_tables_order_rows_by_bucket_then_row(top, backend):
    """Every sort path (radix passes of up to 11 bits; int64 keys beyond int32; packed pairs;
    a stable argsort) gives the order of a stable sort by bucket."""
    rng = np.random.default_rng(top % 1000)
    codes = rng.integers(0, top, (1000, 3), dtype=np.int64)
    codes[::10, 1] = codes[5, 1]  # many rows in one bucket
    codes[0, 2] = top - 1
    tables = Tables.build(np.asfortranarray(codes))
    for t in range(3):
        order = np.argsort(codes[:, t], kind="stable")
        np.testing.assert_array_equal(tables.rows[t], order)
        np.testing.assert_array_equal(tables.keys[t], codes[order, t])
    assert tables.rows.dtype == np.int32
    assert tables.keys.dtype == (np.int32 if top <= 2**31 else np.int64)
    again = Tables.build(codes[::-1], tables)  # a rebuild into the old tables' arrays
    assert again.keys is tables.keys
    np.testing.assert_array_equal(again.rows[0], np.argsort(codes[::-1, 0], kind="stable"))


@pytest.mark.parametrize("top", [8**6, 2**40])
@pytest.mark.parametrize("share", [0.002, 0.3])  # few codes move in place; many: a rebuild
def test_refreshed_tables_equal_tables_built_from_every_code(top, share, monkeypatch, backend):
    builds = []
    build = Tables.build
    monkeypatch.setattr(Tables, "build", lambda *a: builds.append(1) or build(*a))
    rng = np.random.default_rng(int(share * 1000))
    codes = np.asfortranarray(rng.integers(0, top, (5000, 4), dtype=np.int64))
    codes[::7, 1] = codes[3, 1]  # a crowded bucket: rows leave and join it
    tables = Tables.build(codes.copy(order="F"))
    held = codes.copy(order="F")
    for _ in range(3):  # refreshed again and again, as training's rebuilds do
        rows = np.flatnonzero(rng.random(5000) < 0.4)
        fresh = np.asfortranarray(codes[rows])
        moved = rng.random(fresh.shape) < share
        fresh[moved] = rng.integers(0, top, int(moved.sum()))
        fresh[: len(rows) // 20, 1] = codes[3, 1]
        codes[rows] = fresh
        builds.clear()
        half = len(rows) // 2  # in two parts, as rebuilds hash them
        tables = tables.refresh(held, [(rows[:half], np.asfortranarray(fresh[:half])),
                                       (rows[half:], np.asfortranarray(fresh[half:]))])
        assert len(builds) == (share > 0.1)  # moved in place, or rebuilt
        expected = Tables.build(codes.copy(order="F"))
        np.testing.assert_array_equal(held, codes)
        np.testing.assert_array_equal(tables.keys, expected.keys)
        np.testing.assert_array_equal(tables.rows, expected.rows)
        np.testing.assert_array_equal(tables.starts, expected.starts)


def test_a_refreshed_code_beyond_int32_keys_rebuilds_with_int64_keys(backend):
    codes = np.asfortranarray(np.arange(40, dtype=np.int64).reshape(20, 2))
    tables = Tables.build(codes.copy(order="F"))
    assert tables.keys.dtype == np.int32
    rows = np.array([3, 11])
    fresh = np.asfortranarray([[2**35, 1], [5, 2**33]], dtype=np.int64)
    codes[rows] = fresh
    tables = tables.refresh(codes.copy(order="F"), [(rows, fresh)])
    assert tables.keys.dtype == np.int64
    np.testing.assert_array_equal(tables.keys, Tables.build(codes).keys)
    np.testing.assert_array_equal(tables.rows, Tables.build(codes).rows)


@pytest.mark.parametrize("kind", ["dwta", "simhash"])
def test_codes_of_some_rows_and_of_dense_rows_equal_those_of_every_row(kind, backend):
    """``rows`` hashes those rows alone; ``dense`` reads a full layer's rows in place, with
    its columns in any order of the inputs (a rank's buffer)."""
    hf = HashFunctions.make(parse_lsh(f"2:3:5:{kind}"), 37, seed=4)
    w = sp.csr_matrix(np.random.default_rng(2).standard_normal((150, 37)).astype(np.float32))
    w.data[::11] = 0  # a stored zero counts as absent on either path
    columns = np.random.default_rng(3).permutation(37)
    every = hf.codes(w.indptr, w.indices, w.data, columns)
    rows = np.array([0, 5, 6, 77, 149])
    np.testing.assert_array_equal(hf.codes(w.indptr, w.indices, w.data, columns, rows=rows),
                                  every[rows])
    np.testing.assert_array_equal(hf.codes(w.indptr, w.indices, w.data, columns, dense=True),
                                  every)
    np.testing.assert_array_equal(
        hf.codes(w.indptr, w.indices, w.data, columns, rows=rows, dense=True), every[rows])


def test_simhash_codes_match_a_plain_computation(backend):
    hf = HashFunctions.make(parse_lsh("2:7:4:simhash"), 30, seed=2)
    proj = np.zeros((30, 28))
    for c in range(30):
        for j in range(hf.col_ptr[c], hf.col_ptr[c + 1]):
            proj[c, hf.col_fn[j]] = hf.col_sign[j]
    assert 0.2 < np.count_nonzero(proj) / proj.size < 0.45  # about a third take part
    v = np.random.default_rng(1).standard_normal((9, 30))
    m = sp.csr_matrix(v)
    bits = (v @ proj > 0).astype(np.int64).reshape(9, 4, 7)
    expected = (bits * (2 ** np.arange(6, -1, -1))).sum(axis=2)
    np.testing.assert_array_equal(hf.codes(m.indptr, m.indices, m.data), expected)


@pytest.mark.parametrize("kind", ["dwta", "simhash"])
def test_codes_depend_on_seed_and_layer_not_on_the_order_of_entries(kind, backend):
    spec = parse_lsh(f"2:4:6:{kind}")
    hf = HashFunctions.make(spec, 50, seed=9)
    w = sp.random(20, 50, density=0.3, format="csr", random_state=3)
    codes = hf.codes(w.indptr, w.indices, w.data)
    shuffled = w.copy()
    for i in range(20):  # entries of a row in another order (another plan's local columns)
        lo, hi = shuffled.indptr[i], shuffled.indptr[i + 1]
        perm = np.random.default_rng(i).permutation(hi - lo)
        shuffled.indices[lo:hi] = shuffled.indices[lo:hi][perm]
        shuffled.data[lo:hi] = shuffled.data[lo:hi][perm]
    np.testing.assert_array_equal(hf.codes(shuffled.indptr, shuffled.indices, shuffled.data),
                                  codes)
    again = HashFunctions.make(spec, 50, seed=9).codes(w.indptr, w.indices, w.data)
    np.testing.assert_array_equal(again, codes)
    other = HashFunctions.make(parse_lsh(f"3:4:6:{kind}"), 50, seed=9)
    assert not np.array_equal(other.codes(w.indptr, w.indices, w.data), codes)


@pytest.mark.parametrize(("n", "top"), [(30, 4), (1000, 300), (1000, 2**40)])
def test_retrieval_is_the_union_of_the_buckets_and_the_labels(n, top, backend):
    """Also through a directory of many prefixes, and for sample codes beyond every key."""
    rng = np.random.default_rng(5)
    row_codes = rng.integers(0, top, (n, 3))
    tables = Tables.build(row_codes)
    sample_codes = rng.integers(0, top + top // 4 + 1, (7, 3))
    sample_codes[1:4] = row_codes[[29, 4, 3]]  # hits, beside the labels
    label_ptr = np.array([0, 2, 2, 3, 3, 3, 3, 4])
    label_rows = np.array([29, -1, 4, 3])  # -1: a label held by another rank
    weights = np.array([0.5, 0.5, 1.0, 1.0])
    ptr, act, mass, hits = tables.retrieve(sample_codes, n, label_ptr, label_rows, weights)
    for s in range(7):
        hit = {r for t in range(3) for r in range(n) if row_codes[r, t] == sample_codes[s, t]}
        labels = {int(r): w for r, w in zip(label_rows[label_ptr[s]:label_ptr[s + 1]],
                                            weights[label_ptr[s]:label_ptr[s + 1]]) if r >= 0}
        assert list(act[ptr[s]:ptr[s + 1]]) == sorted(hit | set(labels))
        for r, h in zip(act[ptr[s]:ptr[s + 1]], hits[ptr[s]:ptr[s + 1]]):
            tables_hit = sum(row_codes[r, t] == sample_codes[s, t] for t in range(3))
            assert h == tables_hit + (4 if r in labels else 0)  # a label: 1 + the tables more
        assert {int(r): m for r, m in zip(act[ptr[s]:ptr[s + 1]], mass[ptr[s]:ptr[s + 1]])
                if m} == labels
    ptr, act, mass, _ = tables.retrieve(sample_codes, n, np.zeros(0, np.int64),
                                     np.zeros(0, np.int64), np.zeros(0))
    assert not mass.any()


def test_top_bias_rows_merged_over_ranks_equal_the_whole_layers():
    bias = np.random.default_rng(3).standard_normal(50).round(1)  # ties among the biases
    whole = top_bias_rows(bias, np.arange(50), 7, lambda a, b: (a, b))
    order = sorted(range(50), key=lambda r: (-bias[r], r))[:7]
    np.testing.assert_array_equal(whole, sorted(order))
    owners = np.random.default_rng(4).integers(0, 3, 50)  # three ranks' rows
    mine = [np.flatnonzero(owners == p) for p in range(3)]

    def gather(a, b):  # every rank's best, as the model communicator's allgather gives them
        best = [top_bias_rows(bias[m], m, 7, lambda x, y: (x, y)) for m in mine]
        return bias[np.concatenate(best)], np.concatenate(best)

    np.testing.assert_array_equal(top_bias_rows(bias[mine[0]], mine[0], 7, gather), whole)
    assert len(top_bias_rows(bias, np.arange(50), 0, lambda a, b: (a, b))) == 0


def test_the_cap_keeps_labels_and_fillers_besides_the_retrieved():
    tables = Tables.build(np.zeros((40, 2), dtype=np.int64))  # every row in one bucket
    codes = np.zeros((3, 2), dtype=np.int64)
    label_ptr = np.array([0, 2, 3, 5])
    label_rows = np.array([5, 30, 7, 12, 39])
    weights = np.array([1.0, 0.0, 1.0, 0.0, 0.0])  # a label, then fillers (mass 0)
    ptr, act, mass, hits = tables.retrieve(codes, 40, label_ptr, label_rows, weights)
    assert np.all(np.diff(ptr) == 40)
    spec = parse_lsh("2:1:2", max_active=4)
    ptr, act, mass, _ = apply_cap(ptr, act, mass, hits, act, spec, 40, 0, lambda a, b: (a, b))
    for s in range(3):
        kept = set(act[ptr[s]:ptr[s + 1]].tolist())
        joined = set(label_rows[label_ptr[s]:label_ptr[s + 1]].tolist())
        assert joined <= kept and len(kept - joined) == 4, (s, kept)


@pytest.mark.parametrize("estimate", [False, True])
def test_the_tail_estimate_gives_the_full_softmax_when_every_output_is_equal(estimate):
    """With every output's logit equal, the random neurons standing for the outputs not
    retrieved make the sampled loss the full softmax's, log(n_out), whatever was retrieved;
    the active outputs alone give log(active)."""
    from spdnn.reference import sampled_backward

    net = small_network((30, 16, 500), fan_in=8, seed=2, bias_scale=0.0)
    net.layers[-1].weight.data[:] = 0
    x = np.abs(np.random.default_rng(0).standard_normal((30, 6)))
    labels = MultiLabels(np.array([0, 1, 3, 4, 5, 6, 7]), np.array([3, 7, 9, 1, 400, 2, 5]), 500)
    spec = parse_lsh("2:2:4", random=40, top_bias=3, estimate_tail=estimate)
    hashes = HashFunctions.make(spec, 16, seed=1)
    tables = lsh_tables(net, hashes)
    fill = fill_rows(0, 0, 6, 40, 500)
    g, active = sampled_backward(net, x, labels, hashes, tables, 0, fill, np.array([0, 1, 2]))
    mean_active = active / 6
    if estimate:
        assert g.loss == pytest.approx(np.log(500), rel=1e-12)
    else:
        assert g.loss < np.log(mean_active + 1) < np.log(500)
    with pytest.raises(ValueError, match="needs random neurons"):
        parse_lsh("2:2:4", estimate_tail=True)


def test_rebuild_schedule():
    steps = [s for s in range(400) if is_rebuild_step(s, 50)]
    # periods 1, 2, 4, ..., 32, then 50 and each 10% longer, rounded up
    assert steps == [0, 1, 3, 7, 15, 31, 63, 113, 168, 229, 297, 372]
    assert [s for s in range(40) if is_rebuild_step(s, 4)] == [0, 1, 3, 7, 12, 18, 25, 33]
    assert [s for s in range(22) if is_rebuild_step(s, 1)] == [0, 1, 3, 6, 10, 15, 21]
    assert [s for s in range(30) if is_rebuild_step(s, 50, checkpoint_every=10)] == \
        [0, 1, 3, 7, 10, 15, 20]


def test_rows_only_update_equals_the_dense_one_on_those_rows():
    cfg = SGDConfig(lr=0.1, momentum=0.9, weight_decay=0.01)
    rng = np.random.default_rng(2)
    p0 = rng.standard_normal(10)
    dense, rows = p0.copy(), p0.copy()
    a, b = SGD(cfg, [dense]), SGD(cfg, [rows])
    idx = np.array([1, 4, 7])
    for _ in range(3):  # the same rows every step: the same arithmetic as the dense update
        g = np.zeros(10)
        g[idx] = rng.standard_normal(3)
        a.step([g])
        b.step([RowGrad(idx, g[idx])])
    np.testing.assert_array_equal(rows[idx], dense[idx])
    np.testing.assert_array_equal(np.delete(rows, idx), np.delete(p0, idx))  # untouched


@pytest.mark.parametrize("args, message", [
    (["--lsh", "2:6"], "LAYER:K:L"),
    (["--lsh", "1:4:5", "--lsh-random", "5"], "layer 1 is hidden"),
    (["--lsh", "1:4:5", "--compress", "sidco:0.1"], "--compress does not apply with --lsh"),
    (["--lsh", "3:4:5"], "layer 3 is beyond the network"),
    (["--lsh", "2:4:5", "--loss", "mse"], "cross_entropy"),
    (["--lsh", "2:4:5", "--rehash", "0"], "--rehash"),
    (["--lsh-random", "5"], "needs --lsh"),
    (["--lsh-estimate-tail"], "needs --lsh"),
    (["--lsh", "2:4:5", "--lsh-estimate-tail"], "needs random neurons"),
    (["--lsh", "2:4:5", "--lsh-random", "11"], "more than the output layer's 10 neurons"),
    (["--lsh", "2:4:5", "--lsh-random", "-1"], "--lsh-random"),
    (["--lsh-top-bias", "5"], "needs --lsh"),
    (["--lsh", "2:4:5", "--lsh-top-bias", "11"], "more than the output layer's 10 neurons"),
    (["--lsh", "2:4:5", "--lsh-top-bias", "x"], "--lsh-top-bias"),
])
def test_bad_lsh_options_get_one_line(tmp_path, args, message):
    from spdnn.io.bundle import save_network

    save_network(small_network((64, 16, 10), fan_in=8), tmp_path / "n.npz")
    r = launch(0, "train", "--network", tmp_path / "n.npz", "--data", "digits", "--epochs", "1",
               *args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


def test_a_sampled_hidden_layer_trains_with_either_loss(tmp_path):
    """The mse loss is refused on a sampled output layer only: above a hidden one the network's
    own loss applies, over every output (single labels: digits)."""
    from spdnn.io.bundle import save_network

    save_network(small_network((64, 16, 10), fan_in=8), tmp_path / "n.npz")
    r = launch(0, "train", "--network", tmp_path / "n.npz", "--data", "digits", "--epochs", "1",
               "--lsh", "1:3:6", "--loss", "mse", "--metrics-out", "m.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert 0 < json.loads((tmp_path / "m.json").read_text())["epochs"][0]["loss"] < 1


@pytest.mark.parametrize("inputs", ["digits", "images.tsv"])
def test_infer_lsh_needs_label_sets(tmp_path, inputs):
    from spdnn.io.bundle import save_network

    save_network(small_network((64, 16, 10), fan_in=8), tmp_path / "n.npz")
    (tmp_path / "images.tsv").write_text("1\t1\t1.0\n")
    r = launch(0, "infer", "--network", tmp_path / "n.npz", "--inputs", inputs, "--lsh",
               "2:2:4", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "--lsh reports P@k on label sets" in r.stderr



def test_the_sampled_softmax_gradient_flushes_under_the_floor_as_the_full_one():
    """The sampled output layer's gradient drops values under ``flush_below`` (float32:
    9.9e-32; subnormal ones among them, which cost microcode assists in the products on
    Intel CPUs) and keeps the others exactly as computed."""
    from types import SimpleNamespace

    from spdnn.kernels.softmax import flush_below
    from spdnn.runtime.lsh_layer import PairBatch
    from spdnn.runtime.lsh_output import loss

    z = np.array([0.0, -60.0, -75.0, -90.0], dtype=np.float32)  # e^-90: subnormal in float32
    batch = PairBatch(ptr=np.array([0, 4]), act=np.arange(4), mass=np.array([1.0, 0, 0, 0]),
                      z=z, xt=np.zeros((1, 1), np.float32), tail=None)
    s = SimpleNamespace(batch=batch, comm=SimpleNamespace(size=1), n_out=4,
                        layer=SimpleNamespace(rows=np.arange(4)))
    labels = MultiLabels(np.array([0, 1]), np.array([0]), 4)
    value, correct, delta = loss(s, labels, 2)
    assert delta.dtype == np.float32 and correct == 1
    e = np.exp(z)
    assert e[3] != 0 and abs(e[3]) < np.finfo(np.float32).tiny  # the case the floor is for
    expected = ((e / e.sum() - batch.mass) / 2).astype(np.float32)
    floor = flush_below(np.float32)
    assert expected[2] != 0 and abs(expected[2]) < floor < abs(expected[1])
    assert np.array_equal(delta, np.where(np.abs(expected) < floor, 0, expected))
    assert value == pytest.approx(float(np.log(e.sum())) / 2, rel=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("dense", [False, True])
def test_sampled_passes_equal_dense_products_and_agree_between_backends(dtype, dense):
    """The sampled forward and backward passes on random active pairs: within rounding of the
    dense products W x and the gradients of the pairs alone, and the numba half and its numpy
    twin (the scipy backend's) to the bit, in float32 and float64."""
    import scipy.sparse as sp

    from spdnn.backends import backend as current_backend
    from spdnn.backends import set_backend
    from spdnn.kernels.hashing import passes_of

    rng = np.random.default_rng(3)
    n_out, n_in, batch = 30, 21, 5
    w = sp.random(n_out, n_in, density=1.0 if dense else 0.4, random_state=4, format="csr",
                  dtype=dtype)
    w.data = rng.standard_normal(w.nnz).astype(dtype)
    w.indptr, w.indices = w.indptr.astype(np.int32), w.indices.astype(np.int32)
    bias = rng.standard_normal(n_out).astype(dtype)
    xt = rng.standard_normal((batch, n_in)).astype(dtype)
    chosen = [np.sort(rng.choice(n_out, rng.integers(1, 12), replace=False))
              for _ in range(batch)]
    ptr = np.concatenate([[0], np.cumsum([len(c) for c in chosen])]).astype(np.int64)
    act = np.concatenate(chosen).astype(np.int64)
    sample = np.repeat(np.arange(batch), np.diff(ptr))
    delta = rng.standard_normal(len(act)).astype(dtype)
    union = np.unique(act)
    slot = np.full(n_out, -1, dtype=np.int64)
    slot[union] = np.arange(len(union))
    counts = np.diff(w.indptr)[union]
    entry_start = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    results = {}
    before = current_backend()
    try:
        for backend in ("numba", "scipy"):
            set_backend(backend)
            z = np.empty(len(act), dtype=dtype)
            gw, gb = np.zeros(int(counts.sum()), dtype), np.zeros(len(union), dtype)
            part_t = np.zeros((batch, n_in), dtype)
            lsh = passes_of("lsh")
            lsh.sampled_forward(ptr, act, w.indptr, w.indices, w.data, bias, xt, z, dense)
            lsh.sampled_backward(ptr, act, delta, w.indptr, w.indices, w.data, xt, slot,
                                 entry_start, gw, gb, part_t, dense)
            results[backend] = (z, gw, gb, part_t)
    finally:
        set_backend(before)
    for a, b in zip(results["numba"], results["scipy"]):
        np.testing.assert_array_equal(a, b)
    z, gw, gb, part_t = results["scipy"]
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    dw = w.toarray().astype(np.float64)
    np.testing.assert_allclose(z, bias[act] + np.einsum("ij,ij->i", dw[act], xt[sample]), **tol)
    err = np.zeros((n_out, batch))
    err[act, sample] = delta
    np.testing.assert_allclose(gb, err.sum(axis=1)[union], **tol)
    grad = (err @ xt.astype(np.float64))[union] * (dw[union] != 0)
    np.testing.assert_allclose(gw, grad[dw[union] != 0], **tol)
    np.testing.assert_allclose(part_t, (dw.T @ err).T, **tol)
