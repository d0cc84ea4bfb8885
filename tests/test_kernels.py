"""One test suite run across every kernel backend, against dense numpy."""

import numpy as np
import pytest
import scipy.sparse as sp

from spdnn import kernels


def test_both_backends_are_installed():
    assert kernels.available_backends() == ["scipy", "numba"]


def _case(dtype, n_out=37, n_in=29, batch=11, seed=0):
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((n_out, n_in)) * (rng.random((n_out, n_in)) < 0.2)
    dense[3] = 0  # an empty row
    w = sp.csr_matrix(dense.astype(dtype))
    x = rng.standard_normal((n_in, batch)).astype(dtype)
    d = rng.standard_normal((n_out, batch)).astype(dtype)
    b = rng.standard_normal(n_out).astype(dtype)
    return w, x, d, b


def _tol(dtype):
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == np.float32 else {"rtol": 1e-12,
                                                                      "atol": 1e-12}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_spmm_and_fused_activation(backend, dtype):
    w, x, _, b = _case(dtype)
    dense = w.toarray() @ x + b[:, None]
    np.testing.assert_allclose(kernels.spmm(w, x, b), dense, **_tol(dtype))
    np.testing.assert_allclose(kernels.spmm(w, x), w.toarray() @ x, **_tol(dtype))
    z = np.full_like(dense, np.nan)
    h = np.full_like(dense, np.nan)
    kernels.spmm_act(w, x, b, 0.5, z, h)
    np.testing.assert_allclose(z, dense, **_tol(dtype))
    np.testing.assert_allclose(h, np.clip(dense, 0, 0.5), **_tol(dtype))
    kernels.spmm_act(w, x, b, None, z, h)
    np.testing.assert_allclose(h, np.maximum(dense, 0), **_tol(dtype))


def test_row_ranges_and_accumulation(backend):
    w, x, d, b = _case(np.float64)
    dense = w.toarray()
    out = np.full((w.shape[0], x.shape[1]), -7.0)
    kernels.spmm(w, x, b, out, rows=(5, 12))
    np.testing.assert_allclose(out[5:12], dense[5:12] @ x + b[5:12, None], rtol=1e-12)
    assert np.all(out[:5] == -7.0) and np.all(out[12:] == -7.0)
    kernels.spmm(w, x, None, out, rows=(5, 12), accumulate=True)
    np.testing.assert_allclose(out[5:12], 2 * dense[5:12] @ x + b[5:12, None], rtol=1e-12)
    z = np.ones((w.shape[0], x.shape[1]))
    h = np.empty_like(z)
    alive = np.zeros(x.shape[1], dtype=np.int32)
    kernels.spmm_act(w, x, None, None, z, h, accumulate=True, alive=alive)
    np.testing.assert_allclose(h, np.maximum(1 + dense @ x, 0), rtol=1e-12)
    np.testing.assert_array_equal(alive, np.any(h != 0, axis=0))
    g = np.zeros((w.shape[1], d.shape[1]))
    for rows in ((0, 10), (10, w.shape[0])):
        kernels.spmm_t(w, d, g, rows, accumulate=True)
    np.testing.assert_allclose(g, dense.T @ d, rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_transposed_product(backend, dtype):
    w, _, d, _ = _case(dtype)
    out = np.full((w.shape[1], d.shape[1]), np.nan, dtype)
    np.testing.assert_allclose(kernels.spmm_t(w, d, out), w.toarray().T @ d, **_tol(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("batch", [1, 11])
def test_sddmm(backend, dtype, batch):
    w, x, d, _ = _case(dtype, batch=batch)
    coo = w.tocoo()
    expected = np.einsum("ij,ij->i", d[coo.row], x[coo.col])
    np.testing.assert_allclose(kernels.sddmm(w, d, x), expected, **_tol(dtype))


def test_scipy_sddmm_works_in_chunks(monkeypatch):
    monkeypatch.setattr(kernels, "SDDMM_CHUNK", 16)
    kernels_before = kernels.backend()
    kernels.set_backend("scipy")
    try:
        w, x, d, _ = _case(np.float64, batch=5)
        coo = w.tocoo()
        np.testing.assert_allclose(kernels.sddmm(w, d, x),
                                   np.einsum("ij,ij->i", d[coo.row], x[coo.col]), rtol=1e-12)
    finally:
        kernels.set_backend(kernels_before)


def test_unknown_backend():
    with pytest.raises(ValueError, match="unknown kernel backend"):
        kernels.set_backend("cuda")
