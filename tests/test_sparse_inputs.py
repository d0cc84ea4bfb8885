"""A first layer over a sparse input block (spdnn.kernels.sparse_inputs): the kernels that skip
the zero rows of the block give the full kernels' results."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from spdnn.kernels import products, sparse_inputs


def _case(dtype: type, rows: int = 40, features: int = 3_000, batch: int = 37):
    rng = np.random.default_rng(5)
    w = sp.random(rows, features, density=0.05, format="csr", random_state=6, dtype=dtype)
    w.sort_indices()
    x = np.zeros((features, batch), dtype)
    live = rng.choice(features, size=features // 20, replace=False)
    x[live] = rng.standard_normal((len(live), batch)).astype(dtype)
    x[live[::3]] *= rng.random((len(live[::3]), batch)) < 0.1  # rows live in a few columns
    return w, x, rng


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("cap", [None, 0.4])
def test_skipping_the_zero_rows_gives_the_full_kernels_results(dtype, threads, cap):
    if "numba" not in products.available_backends():
        pytest.skip("numba is not installed")
    before = products.backend(), products.threads()
    products.set_backend("numba")
    products.set_threads(min(threads, products.max_threads()))
    try:
        w, x, rng = _case(dtype)
        live = sparse_inputs.live_rows(x)
        assert live is not None and np.array_equal(live, np.flatnonzero((x != 0).any(axis=1)))
        wt = products.transpose(w)
        b = rng.standard_normal(w.shape[0]).astype(dtype)
        z, h = np.full((w.shape[0], x.shape[1]), np.nan, dtype), np.empty((w.shape[0],
                                                                          x.shape[1]), dtype)
        want_z, want_h = np.empty_like(z), np.empty_like(h)
        products.spmm_act(w, x, b, cap, want_z, want_h)
        sparse_inputs.spmm_act(wt, w.data, x, live, b, cap, z, h)
        # the same terms in the same order, fused multiply-adds both (bit for bit where the
        # CPU has FMA; the tolerance is for one without)
        same = dict(rtol=1e-15 if dtype == np.float64 else 1e-6, atol=0)
        np.testing.assert_allclose(z, want_z, **same)
        np.testing.assert_allclose(h, want_h, **same)
        sparse_inputs.spmm_act(wt, w.data, x, live, b, cap, z, None)  # no activation asked
        np.testing.assert_allclose(z, want_z, **same)
        d = rng.standard_normal(z.shape).astype(dtype)
        gw, gb = np.full(w.nnz, np.nan, dtype), np.empty(w.shape[0], dtype)
        want_gw, want_gb = np.empty_like(gw), np.empty_like(gb)
        products.sddmm(w, d, x, out=want_gw, bias_grad=want_gb)
        sparse_inputs.sddmm(w, d, x, live, gw, gb, lambda: wt)
        tol = 1e-12 if dtype == np.float64 else 2e-5
        np.testing.assert_allclose(gw, want_gw, rtol=tol, atol=tol)
        np.testing.assert_allclose(gb, want_gb, rtol=tol, atol=tol)
        dead = ~np.isin(w.indices, live)
        assert (gw[dead] == 0).all()
    finally:
        products.set_backend(before[0])
        products.set_threads(before[1])


def test_dense_blocks_and_the_scipy_backend_keep_the_full_kernels(backend):
    w, x, _ = _case(np.float64)
    x[:] = 1.0  # every row live
    assert sparse_inputs.live_rows(x) is None
    x[1:] = 0.0  # one row of 3,000 live: the numba backend skips the others
    assert (sparse_inputs.live_rows(x) is None) == (backend == "scipy")


def test_a_workspace_filled_by_sparse_blocks_holds_each_dense_block():
    """X_0 filled block after block from sparse samples (only their rows written, the last
    block's rows cleared), with a dense block between them, equals each block's dense form;
    the rows it reports hold every nonzero, and a stored zero counts as a row too."""
    from spdnn.model.batching import columns, sample_block
    from spdnn.runtime.workspace import fill_inputs

    class Ws:
        filled = None

    rng = np.random.default_rng(3)
    data = sp.random(50, 300, density=0.03, format="csr", random_state=4)
    data.data[:5] = 0  # stored zeros
    x = np.full((300, 8), np.nan)  # the buffer's first contents: garbage
    ws = Ws()
    for k, dense in enumerate([False, False, True, False, False]):
        idx = rng.choice(50, 8, replace=False)
        block = sample_block(data, idx)
        known = fill_inputs(x, columns(data, idx) if dense else block, ws)
        np.testing.assert_array_equal(x, columns(data, idx), err_msg=str(k))
        if dense:
            assert known is None and ws.filled is None
        else:
            assert np.array_equal(known, np.unique(data[idx].indices))
            assert set(np.flatnonzero(x.any(axis=1))) <= set(known)
    y = np.full((300, 8), np.nan)  # no workspace (inference's buffers): cleared whole
    assert fill_inputs(y, block, None) is not None
    np.testing.assert_array_equal(y, columns(data, idx))
