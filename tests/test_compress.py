"""Gradient compressors (spdnn.lossy.compress) against brute-force references and scipy's fits; the
critical set's choice; the options' errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from spdnn.lossy import _numba_compress as nbc  # internal: its kernels are the unit tested
from spdnn.lossy import compress as C
from spdnn.lossy.critical import CriticalSet
from tests.helpers import launch


@pytest.mark.parametrize("text, expected", [
    ("none", C.CompressSpec()),
    ("topk:0.01", C.CompressSpec("topk", 0.01)),
    ("DGC:1", C.CompressSpec("dgc", 1.0)),
    ("sidco:0.001", C.CompressSpec("sidco", 0.001, "exp")),
    ("sidco:0.05:gpareto", C.CompressSpec("sidco", 0.05, "gpareto")),
])
def test_parse(text, expected):
    assert C.parse_compress(text) == expected
    assert C.parse_compress(expected.text()) == expected


@pytest.mark.parametrize("text", ["topk", "topk:0", "topk:1.5", "topk:-0.1", "topk:nan",
                                  "topk:x", "zip:0.1", "sidco:0.1:normal", "dgc:0.1:exp",
                                  "none:0.1", "sidco:0.1:exp:2"])
def test_parse_rejects(text):
    with pytest.raises(ValueError):
        C.parse_compress(text)


def _heavy(n: int, seed: int, dtype=np.float32) -> np.ndarray:
    """Gradient-like values: Laplace bulk with a heavier tail."""
    rng = np.random.default_rng(seed)
    return (rng.laplace(size=n) * rng.exponential(size=n) ** 0.5).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 7, 16, 17, 100, 1001])
def test_vector_selection_matches_numpy(dtype, n):
    x = _heavy(n, n, dtype)
    ws = C.Workspace(n, dtype)
    for t1, t2 in ((0.2, 0.9), (0.0, 1.7), (5.0, 9.0), (0.3, float(np.float32(0.7)) + 1e-12)):
        c = nbc.select_above(x, nbc.below(t1, x.dtype), ws.idx, ws.val)
        ref = np.flatnonzero(np.abs(x).astype(np.float64) > t1)
        np.testing.assert_array_equal(ws.idx[:c], ref)
        np.testing.assert_array_equal(ws.val[:c], x[ref])
        c = nbc.keep_above(ws.idx, ws.val, c, nbc.below(t2, x.dtype))
        ref = np.flatnonzero(np.abs(x).astype(np.float64) > max(t1, t2))
        np.testing.assert_array_equal(ws.idx[:c], ref)
        np.testing.assert_array_equal(ws.val[:c], x[ref])


@pytest.mark.parametrize("n, ratio", [(1, 0.5), (10, 0.3), (1000, 0.01), (5000, 0.001)])
def test_topk_is_exact(n, ratio):
    x = _heavy(n, 3)
    k = max(1, math.ceil(ratio * n))
    got = C.topk_select(x, k)
    brute = np.sort(np.argsort(-np.abs(x), kind="stable")[:k])
    assert len(got) == k and np.all(np.diff(got) > 0)
    # Magnitudes are distinct here, so the set is unique.
    np.testing.assert_array_equal(got, brute)


def test_topk_with_ties_takes_k_of_the_largest():
    x = np.array([1, -3, 3, 2, 3, 0], dtype=np.float32)
    got = C.topk_select(x, 2)
    assert len(got) == 2 and set(got) <= {1, 2, 4}


def test_dgc_uses_the_sampled_quantile():
    x = _heavy(200_000, 5)
    ratio = 0.01
    ws = C.Workspace(len(x), x.dtype)
    got = C.dgc_select(x, ratio, np.random.default_rng(11), ws)
    rng = np.random.default_rng(11)  # the same draw, by hand
    s = max(C.DGC_MIN_SAMPLE, math.ceil(C.DGC_SAMPLE * len(x)))
    sample = np.sort(np.abs(x[rng.integers(0, len(x), s)]))[::-1]
    t = sample[math.ceil(ratio * s) - 1]
    np.testing.assert_array_equal(got, np.flatnonzero(np.abs(x) >= t))
    assert 0.5 < len(got) / (ratio * len(x)) < C.DGC_OVERSHOOT


def test_dgc_falls_back_to_top_k_when_the_sample_misleads():
    x = np.ones(100_000, dtype=np.float32)
    x[:10] = 2  # the sample almost surely holds ones only: its threshold passes everything
    ws = C.Workspace(len(x), x.dtype)
    got = C.dgc_select(x, 0.01, np.random.default_rng(0), ws)
    assert len(got) == 1000 and set(range(10)) <= set(got)


@pytest.mark.parametrize("ratio", [0.3, 0.01, 1e-4])
def test_thresholds_are_the_distributions_quantiles(ratio):
    assert C.exp_threshold(2.0, ratio, 1.0) == pytest.approx(1 + stats.expon(scale=2).isf(ratio))
    for shape in (0.3, 1.0, 4.0):
        assert C.gamma_threshold(shape, 2.0, ratio) == \
            pytest.approx(stats.gamma(shape, scale=2).isf(ratio), rel=1e-10)
    for xi in (-0.2, 1e-12, 0.3):
        assert C.gpareto_threshold(xi, 1.5, ratio, 0.5) == \
            pytest.approx(0.5 + stats.genpareto(xi, scale=1.5).isf(ratio), rel=1e-8)


def test_fits_against_scipy():
    """On 200,000 samples of known distributions: the gamma shape within 2% of scipy's maximum
    likelihood fit, the generalised Pareto moments fit within 5% of scipy's (and of the
    truth), the exponential mean exactly the sample mean (its maximum likelihood)."""
    rng = np.random.default_rng(0)
    x = stats.gamma(0.6, scale=0.01).rvs(200_000, random_state=rng)
    shape, scale = C.gamma_fit(x.mean(), np.log(x).mean())
    a, _, sc = stats.gamma.fit(x, floc=0)
    assert shape == pytest.approx(a, rel=0.02) and scale == pytest.approx(sc, rel=0.02)
    y = stats.genpareto(0.15, scale=2.0).rvs(200_000, random_state=rng)
    xi, sigma = C.gpareto_fit(y.mean(), y.var())
    c, _, s = stats.genpareto.fit(y, floc=0)
    assert xi == pytest.approx(c, abs=0.05) and sigma == pytest.approx(s, rel=0.05)
    assert xi == pytest.approx(0.15, abs=0.05) and sigma == pytest.approx(2.0, rel=0.05)
    z = rng.exponential(3.0, 200_000)
    _, e = stats.expon.fit(z, floc=0)
    assert z.mean() == pytest.approx(e, rel=1e-12)


def _sidco_by_hand(x: np.ndarray, ratio: float, dist: str, stages: int) -> np.ndarray:
    """SIDCo in plain float64 numpy, for comparison."""
    a = np.abs(x.astype(np.float64))
    ratios = C.stage_ratios(ratio, stages)
    if dist == "exp":
        t = -a.mean() * math.log(ratios[0])
    elif dist == "gamma":
        nz = a[a > 0]
        shape, scale = C.gamma_fit(nz.mean(), np.log(nz).mean())
        t = C.gamma_threshold(shape, scale, min(1.0, ratios[0] * len(a) / len(nz)))
    else:
        t = C.gpareto_threshold(*C.gpareto_fit(a.mean(), a.var()), ratios[0])
    for r in ratios[1:]:
        e = a[a > t] - t
        if len(e) < 2:
            break
        t = t - e.mean() * math.log(r) if dist == "exp" else \
            C.gpareto_threshold(*C.gpareto_fit(e.mean(), e.var()), r, t)
    return np.flatnonzero(a > t)


@pytest.mark.parametrize("dist", C.DISTRIBUTIONS)
@pytest.mark.parametrize("stages", [1, 2, 4])
def test_sidco_selection_matches_the_plain_computation(dist, stages):
    x = _heavy(50_000, 8, np.float64)
    ws = C.Workspace(len(x), x.dtype)
    got = C.sidco_select(x, 0.01, dist, stages, ws)
    np.testing.assert_array_equal(got, _sidco_by_hand(x, 0.01, dist, stages))


@pytest.mark.parametrize("dist", C.DISTRIBUTIONS)
@pytest.mark.parametrize("ratio", [0.01, 0.001])
def test_sidco_adapts_towards_the_target(dist, ratio):
    spec = C.CompressSpec("sidco", ratio, dist)
    comp = C.Compressor(spec, 200_000, np.float32)
    achieved = []
    for step in range(60):
        achieved.append(len(comp.select(_heavy(200_000, step), step)) / (ratio * 200_000))
    assert 0.8 <= np.mean(achieved[-20:]) <= 1.2, achieved


@pytest.mark.parametrize("kind", ["topk:0.05", "dgc:0.05", "sidco:0.05", "sidco:0.01:gamma"])
def test_error_feedback_conserves_the_gradient(kind):
    spec = C.parse_compress(kind)
    rng = np.random.default_rng(1)
    comp = C.Compressor(spec, 3000, np.float32, seed=4, stream=(0, 1))
    for step in range(5):
        gw, gb = _heavy(2900, step), _heavy(100, 50 + step)
        accumulated = comp.residual + np.concatenate([gw, gb])  # the same float32 sums
        idx, values = comp.compress((gw, gb), step)
        sent = np.zeros(3000, np.float32)
        sent[idx] = values
        assert np.all(comp.residual[idx] == 0)
        np.testing.assert_array_equal(sent + comp.residual, accumulated)
        assert len(np.unique(idx)) == len(idx)
    del rng


def test_compressor_draws_depend_on_seed_step_and_stream_only():
    spec = C.parse_compress("dgc:0.01")
    g = _heavy(100_000, 2)
    a = C.Compressor(spec, len(g), np.float32, seed=1, stream=(3,))
    b = C.Compressor(spec, len(g), np.float32, seed=1, stream=(3,))
    np.testing.assert_array_equal(a.select(g, 7), b.select(g, 7))
    a.select(g, 8)
    np.testing.assert_array_equal(a.select(g, 9), b.select(g, 9))


def test_critical_set_picks_the_highest_losses_with_ties_by_index():
    crit = CriticalSet(10, 0.3, 2)
    assert crit.full(0) and crit.full(1)  # nothing measured yet: full passes
    crit.record(np.arange(10), np.array([0.1, 5, 0.2, 3, 3, 0.1, 9, 3, 0, 1], float))
    crit.losses, crit.pending = crit.pending.copy(), np.zeros(10)
    np.testing.assert_array_equal(crit.chosen(), [1, 3, 6])  # 9, 5, then the first 3
    assert crit.full(2) and not crit.full(1) and not crit.full(3)
    order = crit.order(1, seed=0, shuffle=True)
    assert sorted(order) == [1, 3, 6]
    np.testing.assert_array_equal(crit.order(1, 0, True), order)
    assert sorted(crit.order(2, 0, True)) == list(range(10))
    np.testing.assert_array_equal(CriticalSet(7, 1.0, 1).order(0, 0, False), np.arange(7))


@pytest.mark.parametrize("args, message", [
    (["--compress", "topk:0"], "(0, 1]"),
    (["--compress", "topk:2"], "(0, 1]"),
    (["--compress", "zstd:0.1"], "unknown compressor"),
    (["--compress", "sidco:0.1:normal"], "unknown distribution"),
    (["--critical-set", "0"], "(0, 1]"),
    (["--critical-set", "1.5"], "(0, 1]"),
    (["--refresh", "2"], "--refresh needs --critical-set"),
    (["--critical-set", "0.5", "--refresh", "0"], "positive integer"),
])
def test_bad_options_get_one_line_and_exit_2(tmp_path, args, message):
    from spdnn.io.bundle import save_network
    from spdnn.model.generate import random_network

    save_network(random_network([64, 16, 10], 8, seed=0), tmp_path / "n.npz")
    p = launch(0, "train", "--network", tmp_path / "n.npz", "--epochs", "1", *args, timeout=120)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], p.stderr


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_compressors_numpy_passes_equal_the_compiled_ones(dtype):
    """The scipy backend's passes (spdnn.lossy._numpy_compress) select exactly the entries
    the numba kernels select, and their float64 statistics agree within rounding."""
    pytest.importorskip("numba")
    from spdnn.lossy import _numba_compress as compiled
    from spdnn.lossy import _numpy_compress as plain

    rng = np.random.default_rng(3)
    x = (rng.standard_normal(5000) * rng.random(5000)).astype(dtype)
    x[::7] = 0
    for name in ("abs_sum", "abs_moments", "abs_log_moments"):
        np.testing.assert_allclose(getattr(plain, name)(x), getattr(compiled, name)(x),
                                   rtol=1e-12)
    t = plain.below(0.4, np.dtype(dtype))
    pad = 64 // np.dtype(dtype).itemsize
    itype = np.int32 if dtype == np.float32 else np.int64
    got = [(np.empty(len(x) + pad, itype), np.empty(len(x) + pad, dtype)) for _ in range(2)]
    counts = [half.select_above(x, t, *buf) for half, buf in zip((plain, compiled), got)]
    assert counts[0] == counts[1] > 0
    for a, b in zip(*got):
        np.testing.assert_array_equal(a[:counts[0]], b[:counts[0]])
    t2 = plain.below(0.9, np.dtype(dtype))
    kept = [half.keep_above(*buf, counts[0], t2) for half, buf in zip((plain, compiled), got)]
    assert kept[0] == kept[1] > 0
    for a, b in zip(*got):
        np.testing.assert_array_equal(a[:kept[0]], b[:kept[0]])
    np.testing.assert_allclose(plain.excess_moments(got[0][1], kept[0], 0.9),
                               compiled.excess_moments(got[1][1], kept[1], 0.9), rtol=1e-12)
