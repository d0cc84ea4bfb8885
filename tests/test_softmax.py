"""The softmax passes (spdnn.kernels.softmax) against numpy, and the fused training loss of a
block spread over the ranks (spdnn.runtime.outputs.training_loss) against the serial
``ops.loss_and_gradient`` and argmax."""

from __future__ import annotations

import numpy as np
import pytest

from spdnn.kernels import products, softmax
from spdnn.model.labels import MultiLabels
from spdnn.model.ops import loss_and_gradient

TOL = {np.float64: 1e-14, np.float32: 3e-7}


def _block(rng: np.random.Generator, rows: int, batch: int, dtype: type) -> np.ndarray:
    z = (rng.standard_normal((rows, batch)) * 4).round(1).astype(dtype)  # ties everywhere
    z[:, 0] = 0.5  # a column of equal values: its first row wins
    z[rows // 2, 1] = z[:, 1].max() + 200  # the others' exponentials under float32's range
    return z


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("threads", [1, 2])
def test_softmax_passes_equal_numpy(backend, dtype, threads):
    rng = np.random.default_rng(7)
    z = _block(rng, 5_000 + 7, 33, dtype)  # three blocks of rows, the last one short
    before = products.threads()
    products.set_threads(min(threads, products.max_threads()))
    try:
        best = softmax.column_max(z)
        np.testing.assert_array_equal(best, z.max(axis=0))
        want = np.exp((z - best).astype(np.float64))
        e = z.copy()
        total, first = softmax.exp_columns(e, best)
        assert e.dtype == dtype and total.dtype == dtype
        np.testing.assert_array_equal(first, z.argmax(axis=0))  # the first among equals
        np.testing.assert_allclose(e, want, rtol=4 * TOL[dtype], atol=1e-37)
        np.testing.assert_allclose(total, want.sum(axis=0), rtol=4 * TOL[dtype])
        above = z.copy()  # a shift above every value: no row equals it
        assert (softmax.exp_columns(above, best + 1)[1] == -1).all()
        factor = (1 / total).astype(dtype)
        scaled = e.copy()
        softmax.scale_columns(scaled, factor)
        floor = softmax.flush_below(dtype)
        want = e * factor[None, :]
        want[np.abs(want) < floor] = 0
        np.testing.assert_array_equal(scaled, want)
        # Results under the floor flushed to 0 (a far-off class's probability over a large
        # batch: subnormal, or subnormal once times a small weight), the floor and NaN kept.
        assert floor > np.finfo(dtype).tiny and floor * np.finfo(dtype).eps >= np.finfo(dtype).tiny
        g = np.full((3, 70), floor, dtype)  # 70 columns: past the vector width, with a tail
        g[1] = -4 * floor
        g[2, 5] = np.nan
        factor = np.full(70, 0.5, dtype)
        factor[::2] = 0.25
        softmax.scale_columns(g, factor)
        assert (g[0] == 0).all()  # floor / 2, floor / 4
        np.testing.assert_array_equal(g[1], np.where(factor == 0.5, -2 * floor, -floor))
        assert np.isnan(g[2, 5]) and (np.delete(g[2], 5) == 0).all()
    finally:
        products.set_threads(before)
    empty = np.zeros((0, 4), dtype)
    assert (softmax.column_max(empty) == -np.inf).all()
    total, first = softmax.exp_columns(empty, np.zeros(4, dtype))
    assert (total == 0).all() and (first == -1).all()


def test_exp32_is_within_one_ulp_and_clamps_below_float32s_normals():
    if "numba" not in products.available_backends():
        pytest.skip("numba is not installed")
    import numba

    from spdnn.kernels._numba_softmax import exp32

    @numba.njit
    def run(x, out):  # noqa: ANN001, ANN202
        for i in range(x.size):
            out[i] = exp32(x[i])

    x = np.concatenate([np.linspace(-87, 0, 1_000_003, dtype=np.float32),
                        np.float32([-0.0, -1e-30, -87.5, -1e4, -np.inf, np.nan])])
    got = np.empty_like(x)
    run(x, got)
    exact = np.exp(x.astype(np.float64))
    normal = x >= -87
    ulp = np.spacing(exact[normal].astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got[normal] - exact[normal]) / ulp) <= 1.5
    assert (got[[-6, -5]] == 1).all()
    assert (got[[-4, -3, -2]] == np.float32(np.exp(np.float32(-87)))).all()  # clamped
    assert np.isnan(got[-1])  # a NaN loss stays NaN: the step refuses it


def _labels(rng: np.random.Generator, n_out: int, batch: int) -> MultiLabels:
    rows = [sorted(rng.choice(n_out, size=int(rng.integers(0, 4)), replace=False))
            for _ in range(batch)]
    indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    return MultiLabels(indptr, np.array([v for r in rows for v in r], np.int64), n_out)


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("multi", [False, True])
def test_training_loss_over_the_ranks_equals_the_serial_loss(comm, backend, dtype, multi):
    from spdnn.model.activations import output_of
    from spdnn.runtime.outputs import training_loss

    rng = np.random.default_rng(11)
    n_out, batch = 37, 9
    z = _block(rng, n_out, batch, dtype)
    y = _labels(rng, n_out, batch) if multi else rng.integers(0, n_out, batch)
    rows = np.flatnonzero(np.arange(n_out) % (comm.size + 1) == comm.rank)  # the last: none
    if comm.rank == comm.size - 1:
        rows = np.concatenate([rows, np.flatnonzero(np.arange(n_out) % (comm.size + 1)
                                                    == comm.size)])
        rows.sort()
    want_value, want_grad = loss_and_gradient(z.astype(np.float64), y, "cross_entropy")
    pred = z.argmax(axis=0)
    want_hits = int(np.sum(y.contains(pred) if multi else pred == y))
    losses = np.empty(batch)
    mine = z[rows].copy()
    value, hits, grad = training_loss(comm, rows, n_out, mine, y, "cross_entropy", batch,
                                      losses, output_of("linear"))
    assert grad is mine  # consumed: the gradient is left in the block
    assert hits == want_hits
    assert value == pytest.approx(want_value, rel=10 * TOL[dtype])
    np.testing.assert_allclose(grad, want_grad[rows], rtol=10 * TOL[dtype],
                               atol=10 * TOL[dtype] / batch)
    assert losses.sum() / batch == pytest.approx(value, rel=TOL[dtype])
