"""One test suite run across every kernel backend, against dense numpy."""

import numpy as np
import pytest
import scipy.sparse as sp
from scipy import special

from spdnn.kernels import products as kernels
from spdnn.kernels.dense import dense_view


def test_backend_choice(monkeypatch):
    """SPDNN_KERNELS picks a backend, auto prefers numba when it is importable, and a name
    that is unknown or not installed is an error naming it."""
    from spdnn.errors import SpdnnError

    before = kernels.backend()
    # A process chooses its backend once and keeps it: forgotten between cases.
    try:
        for wanted, got in (("scipy", "scipy"), ("auto", kernels.available_backends()[-1])):
            monkeypatch.setenv("SPDNN_KERNELS", wanted)
            kernels.forget_backend()
            assert kernels.backend() == got
        monkeypatch.setenv("SPDNN_KERNELS", "cuda")
        kernels.forget_backend()
        with pytest.raises(SpdnnError, match="SPDNN_KERNELS='cuda'"):
            kernels.backend()
        # Without numba: auto falls back to scipy, asking for numba says how to install it.
        from spdnn import backends as chooser

        monkeypatch.setattr(chooser, "available_backends", lambda: ["scipy"])
        monkeypatch.setenv("SPDNN_KERNELS", "auto")
        kernels.forget_backend()
        assert kernels.backend() == "scipy"
        with pytest.raises(ValueError, match="pip install numba"):
            kernels.set_backend("numba")
    finally:
        monkeypatch.undo()
        kernels.set_backend(before)


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


def _gelu_tanh_inner(z):  # noqa: ANN001, ANN202
    return np.sqrt(2 / np.pi) * (z + 0.044715 * z**3)


# Each activation's value and slope, from its textbook formula (the oracle of both backends:
# spdnn.model.activations, which the scipy backend runs, is not its own test).
_ACTIVATION_FORMULAS = {
    "leaky_relu": (lambda z: np.where(z > 0, z, -0.3 * z), lambda z: np.where(z > 0, 1, -0.3)),
    "tanh": (np.tanh, lambda z: 1 - np.tanh(z) ** 2),
    "sigmoid": (lambda z: 1 / (1 + np.exp(-z)),
                lambda z: np.exp(-z) / (1 + np.exp(-z)) ** 2),
    "gelu": (lambda z: 0.5 * z * (1 + special.erf(z / np.sqrt(2))),
             lambda z: 0.5 * (1 + special.erf(z / np.sqrt(2)))
             + z * np.exp(-z * z / 2) / np.sqrt(2 * np.pi)),
    "gelu_tanh": (lambda z: 0.5 * z * (1 + np.tanh(_gelu_tanh_inner(z))),
                  lambda z: 0.5 * (1 + np.tanh(_gelu_tanh_inner(z)))
                  + 0.5 * z * (1 - np.tanh(_gelu_tanh_inner(z)) ** 2)
                  * np.sqrt(2 / np.pi) * (1 + 3 * 0.044715 * z * z)),
    "identity": (lambda z: z, lambda z: np.ones_like(z)),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("spec", ["leaky_relu:-0.3", "tanh", "sigmoid", "gelu", "gelu_tanh",
                                  "identity"])
def test_every_activation_and_its_slope(backend, dtype, spec):
    """The activations the products do not fuse: value and ``g *= h'(z)`` (from the outputs
    where given) as spdnn.model.activations defines them, on rows of a (neurons x batch) block
    (the owned rows of a buffer: a contiguous slice)."""
    from spdnn.model.activations import parse

    act = parse(spec)
    rng = np.random.default_rng(1)
    buf = (rng.standard_normal((40, 13)) * 3).astype(dtype)
    buf[0, :4] = [0, -0.0, 40, -40]
    z = buf[:31]
    value, slope = _ACTIVATION_FORMULAS[spec.split(":")[0]]
    want = value(z.astype(np.float64)).astype(dtype)  # written out here, not spdnn's
    out = np.full((35, 13), np.nan, dtype)
    kernels.activate(act, z, out[:31])
    assert out.dtype == dtype and np.isnan(out[31:]).all()
    np.testing.assert_allclose(out[:31], want, **_tol(dtype))
    g0 = rng.standard_normal(z.shape).astype(dtype)
    expected = (g0 * slope(z.astype(np.float64))).astype(dtype)
    for h in (None, out[:31]):
        g = g0.copy()
        kernels.activation_backward(act, g, z, h)
        np.testing.assert_allclose(g, expected, **_tol(dtype))


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
    wt = kernels.transpose(w).matrix(w.data)
    g = np.full((w.shape[1], d.shape[1]), np.nan)
    for rows in ((0, 10), (10, w.shape[1])):
        kernels.spmm(wt, d, None, g, rows)
    np.testing.assert_allclose(g, dense.T @ d, rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_transposed_product(backend, dtype):
    w, _, d, _ = _case(dtype)
    w.data[:] = np.arange(1, w.nnz + 1)  # every value distinct: the gather map is checked
    t = kernels.transpose(w)
    assert t.shape == w.shape[::-1] and t.order.dtype == np.int32
    assert np.all(np.diff(t.indices[t.indptr[0]:t.indptr[1]]) > 0)  # sorted within a row
    wt = t.matrix(w.data)
    np.testing.assert_array_equal(wt.toarray(), w.toarray().T)
    np.testing.assert_array_equal(w.data[t.order], wt.data)
    out = np.full((w.shape[1], d.shape[1]), np.nan, dtype)
    np.testing.assert_allclose(kernels.spmm(wt, d, None, out), w.toarray().T @ d,
                               **_tol(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("threads", [1, 2])
def test_dense_layers_give_the_same_results(backend, dtype, threads):
    """Every entry stored (a dense head): the forward products run on the dense view of
    W.data (BLAS), the backward in numba's one pass where numba is the backend (7 rows: a head
    of at most ONE_PASS_DENSE_ROWS), else BLAS (below, 40 rows)."""
    before = kernels.threads()
    kernels.set_threads(min(threads, kernels.max_threads()))
    try:
        _dense_layer_products(dtype)
    finally:
        kernels.set_threads(before)


def _dense_layer_products(dtype: type) -> None:
    rng = np.random.default_rng(3)
    dense = rng.standard_normal((7, 13)).astype(dtype)
    w = sp.csr_matrix(dense)
    # ``dense_view`` is where a layer is routed to BLAS: what this test is about.
    assert w.nnz == dense.size and dense_view(w) is not None
    x = rng.standard_normal((13, 5)).astype(dtype)
    d = rng.standard_normal((7, 5)).astype(dtype)
    b = rng.standard_normal(7).astype(dtype)
    z, h = np.empty((7, 5), dtype), np.empty((7, 5), dtype)
    alive = np.zeros(5, np.int32)
    kernels.spmm_act(w, x, b, 0.7, z, h, alive=alive)
    np.testing.assert_allclose(z, dense @ x + b[:, None], **_tol(dtype))
    np.testing.assert_allclose(h, np.clip(dense @ x + b[:, None], 0, 0.7), **_tol(dtype))
    np.testing.assert_array_equal(alive, np.any(h != 0, axis=0))
    kernels.spmm(w, x, None, z, rows=(2, 5), accumulate=True)
    np.testing.assert_allclose(z[2:5], 2 * dense[2:5] @ x + b[2:5, None], **_tol(dtype))
    gb = np.empty(7, dtype)
    np.testing.assert_allclose(kernels.sddmm(w, d, x, bias_grad=gb), (d @ x.T).ravel(),
                               **_tol(dtype))
    np.testing.assert_allclose(gb, d.sum(axis=1), **_tol(dtype))
    t = kernels.transpose(w)
    assert t.dense and dense_view(t.matrix(w.data)) is not None
    np.testing.assert_allclose(kernels.spmm(t.matrix(w.data), d), dense.T @ d, **_tol(dtype))
    # the backward's two products: every column of W at once, and a range of them
    for lo, hi in ((0, 13), (4, 9)):
        g, gw = np.full((hi - lo, 5), np.nan, dtype), np.zeros(w.nnz, dtype)
        kernels.backward_products(t, w.data, d, x, g, gw, (lo, hi), base=lo)
        np.testing.assert_allclose(g, dense[:, lo:hi].T @ d, **_tol(dtype))
        np.testing.assert_allclose(gw.reshape(7, 13)[:, lo:hi], d @ x[lo:hi].T, **_tol(dtype))
        assert (gw.reshape(7, 13)[:, :lo] == 0).all() and (gw.reshape(7, 13)[:, hi:] == 0).all()
    # with the slope of the layer below (ReLU capped at 0.7): its pre-activations z
    zb = rng.standard_normal((13, 5)).astype(dtype)
    g, gw = np.full((13, 5), np.nan, dtype), np.zeros(w.nnz, dtype)
    kernels.backward_products(t, w.data, d, x, g, gw, z=zb, cap=0.7)
    np.testing.assert_allclose(g, (dense.T @ d) * ((zb > 0) & (zb < 0.7)), **_tol(dtype))
    np.testing.assert_allclose(gw.reshape(7, 13), d @ x.T, **_tol(dtype))
    # a dense layer of more rows than ONE_PASS_DENSE_ROWS: BLAS's products in either backend
    wide = rng.standard_normal((40, 13)).astype(dtype)
    tw, dw = kernels.transpose(sp.csr_matrix(wide)), rng.standard_normal((40, 5)).astype(dtype)
    g, gw = np.full((13, 5), np.nan, dtype), np.zeros(wide.size, dtype)
    kernels.backward_products(tw, wide.ravel(), dw, x, g, gw, z=zb, cap=0.7)
    np.testing.assert_allclose(g, (wide.T @ dw) * ((zb > 0) & (zb < 0.7)), **_tol(dtype))
    np.testing.assert_allclose(gw.reshape(40, 13), dw @ x.T, **_tol(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("batch", [1, 11])
def test_sddmm(backend, dtype, batch):
    w, x, d, _ = _case(dtype, batch=batch)
    coo = w.tocoo()
    expected = np.einsum("ij,ij->i", d[coo.row], x[coo.col])
    np.testing.assert_allclose(kernels.sddmm(w, d, x), expected, **_tol(dtype))
    gb = np.full(w.shape[0], np.nan, dtype)
    np.testing.assert_allclose(kernels.sddmm(w, d, x, bias_grad=gb), expected, **_tol(dtype))
    np.testing.assert_allclose(gb, d.sum(axis=1), **_tol(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("dense", [False, True])
@pytest.mark.parametrize("cap", [None, 0.5])
def test_backward_products(backend, dtype, dense, cap):
    """One pass over row ranges of W^T: W^T d into an offset output block (times h'(z) when z is
    given) and the weight gradient scattered back into W's entry order."""
    if dense:
        rng = np.random.default_rng(5)
        w = sp.csr_matrix(rng.standard_normal((9, 29)).astype(dtype))
        x = rng.standard_normal((29, 11)).astype(dtype)
        d = rng.standard_normal((9, 11)).astype(dtype)
    else:
        w, x, d, _ = _case(dtype, n_out=37, n_in=29, batch=11)
    wt = kernels.transpose(w)
    assert wt.dense == dense
    z = np.random.default_rng(1).uniform(-1, 1, (29, 11)).astype(dtype)
    z[0, :3] = (0, cap or 1, 0.5)  # exactly zero, exactly at the cap
    coo = w.tocoo()
    expected_grad = np.einsum("ij,ij->i", d[coo.row], x[coo.col])
    product = w.toarray().T @ d
    grad = np.full(w.nnz, np.nan, dtype)
    low = np.full((20, 11), np.nan, dtype)
    high = np.full((9, 11), np.nan, dtype)
    kernels.backward_products(wt, w.data, d, x, high, grad, (20, 29), base=20)
    for rows in ((0, 7), (7, 20)):
        kernels.backward_products(wt, w.data, d, x, low, grad, rows, z=z, cap=cap)
    keep = (z > 0) & ((z < cap) if cap is not None else True)
    np.testing.assert_allclose(low, product[:20] * keep[:20], **_tol(dtype))
    np.testing.assert_allclose(high, product[20:], **_tol(dtype))
    np.testing.assert_allclose(grad, expected_grad, **_tol(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("batch", [0, 1, 7, 8, 16, 17, 26, 40, 60, 100, 120, 129, 300])
def test_every_batch_width(backend, dtype, batch):
    """Widths around the vector blocks (16 float32 or 8 float64 per vector; full blocks of 8
    vectors, then a partial block of 1 to 8, its last vector masked: every count is met by one
    dtype or the other), rows long enough to prefetch across rows; every output
    starts as NaN so an entry left unwritten fails (an empty batch has zero gradients)."""
    rng = np.random.default_rng(batch)
    dense = rng.standard_normal((50, 120)) * (rng.random((50, 120)) < 0.3)
    w = sp.csr_matrix(dense.astype(dtype))
    x = rng.standard_normal((120, batch)).astype(dtype)
    d = rng.standard_normal((50, batch)).astype(dtype)
    ref = w.toarray().astype(np.float64)
    z = np.full((50, batch), np.nan, dtype)
    np.testing.assert_allclose(kernels.spmm(w, x, None, z), ref @ x, **_tol(dtype))
    coo = w.tocoo()
    expected = np.einsum("ij,ij->i", d[coo.row].astype(np.float64), x[coo.col])
    grad = np.full(w.nnz, np.nan, dtype)
    np.testing.assert_allclose(kernels.sddmm(w, d, x, grad), expected, **_tol(dtype))
    wt = kernels.transpose(w)
    out = np.full((120, batch), np.nan, dtype)
    grad[:] = np.nan
    kernels.backward_products(wt, w.data, d, x, out, grad)
    np.testing.assert_allclose(out, ref.T @ d, **_tol(dtype))
    np.testing.assert_allclose(grad, expected, **_tol(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_sample_does_not_depend_on_its_place_in_the_batch(backend, dtype):
    """A column's products are bit-identical whatever the batch's width and the column's place
    in it (replica shares and resumed runs split batches differently)."""
    rng = np.random.default_rng(7)
    w = sp.csr_matrix((rng.standard_normal((60, 90)) * (rng.random((60, 90)) < 0.4))
                      .astype(dtype))
    x = rng.standard_normal((90, 301)).astype(dtype)
    d = rng.standard_normal((60, 301)).astype(dtype)
    b = rng.standard_normal(60).astype(dtype)
    wt = kernels.transpose(w)
    full = kernels.spmm(w, x, b)
    back = np.empty((90, 301), dtype)
    kernels.backward_products(wt, w.data, d, x, back, np.empty(w.nnz, dtype))
    for cols in ([300], [0, 5, 9], list(range(7, 27)), list(range(7, 40)),
                 list(range(150, 301))):
        xs, ds = np.ascontiguousarray(x[:, cols]), np.ascontiguousarray(d[:, cols])
        np.testing.assert_array_equal(kernels.spmm(w, xs, b), full[:, cols])
        part = np.empty((90, len(cols)), dtype)
        kernels.backward_products(wt, w.data, ds, xs, part, np.empty(w.nnz, dtype))
        np.testing.assert_array_equal(part, back[:, cols])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("threads", [1, 2])
def test_narrow_batches_in_groups_of_rows(dtype, threads):
    """Batches of up to 4 vectors of 256 bits run several rows at a time, storing whole
    vectors across the next rows' places: every bit equals the wide kernel's column for
    column, in every mode (bias, none, accumulate; activation and live flags), over row ranges
    of every parity, and no row outside the range changes. Row lengths differ (0 to 60)."""
    from spdnn.kernels import products

    if "numba" not in products.available_backends():
        pytest.skip("the numba backend is not installed")
    nb = products._nb()
    rng = np.random.default_rng(3)
    n, n_in = 23, 70
    dense = rng.standard_normal((n, n_in)) * (rng.random((n, n_in)) < rng.random((n, 1)))
    w = sp.csr_matrix(dense.astype(dtype))
    bias = rng.standard_normal(n).astype(dtype)
    wide = rng.standard_normal((n_in, 80)).astype(dtype)
    prior = rng.standard_normal((n, 80)).astype(dtype)
    lanes = 32 // np.dtype(dtype).itemsize
    for width in sorted({1, 2, lanes - 1, lanes, lanes + 1, 2 * lanes, 3 * lanes - 1,
                         3 * lanes, 4 * lanes, 4 * lanes + 1}):
        for init in (0, 1, 2):
            for r0, r1 in ((0, n), (1, n), (2, n - 1), (5, 8), (4, 5)):
                runs = []
                for x in (wide, np.ascontiguousarray(wide[:, :width])):
                    z = prior[:, :x.shape[1]].copy()
                    h = np.full_like(z, np.nan)
                    alive = np.zeros(x.shape[1], np.int32)
                    nb.spmm_rows(w.indptr[:-1], w.indptr[1:], w.indices, w.data, x, bias, z,
                                 r0, r1, init, 0.75, True, h, alive, threads)
                    runs.append((z[:, :width], h[:, :width], alive[:width]))
                (z_wide, h_wide, a_wide), (z, h, alive) = runs
                where = (width, init, r0, r1)
                np.testing.assert_array_equal(z, z_wide, err_msg=str(where))
                np.testing.assert_array_equal(h, h_wide, err_msg=str(where))
                np.testing.assert_array_equal(alive, a_wide, err_msg=str(where))
                outside = np.r_[0:r0, r1:n]
                np.testing.assert_array_equal(z[outside], prior[outside, :width])
                assert np.isnan(h[outside]).all()
                expected = {0: prior[:, :width], 1: np.repeat(bias[:, None], width, 1),
                            2: np.zeros((n, width))}[init][r0:r1] + dense[r0:r1] @ wide[:, :width]
                np.testing.assert_allclose(z[r0:r1], expected, **_tol(dtype))


@pytest.mark.parametrize("cap", [None, 0.5])
def test_apply_slope(backend, cap):
    """g *= h'(z): zero where z <= 0 and where z is at or beyond the cap; NaN stays NaN."""
    z = np.array([[-1.0, 0.0, 0.25, 0.5, 0.75], [2.0, -0.0, 1e-300, 0.5, -3.0]])
    g = np.array([[1.0, -2.0, 3.0, 4.0, np.nan], [5.0, 6.0, -7.0, 8.0, -9.0]])
    expected = g * ((z > 0) & ((z < cap) if cap is not None else True))
    kernels.apply_slope(g, z, cap)
    np.testing.assert_array_equal(g, expected)
    assert np.isnan(g[0, 4]) and np.signbit(g[0, 1])


def test_threads(backend):
    before = kernels.threads()
    try:
        for n in range(1, kernels.max_threads() + 1):
            kernels.set_threads(n)
            for n_out, batch in ((301, 9), (1100, 1000)):  # below and above SMALL_PRODUCT
                w, x, _, b = _case(np.float64, n_out=n_out, batch=batch)
                np.testing.assert_allclose(kernels.spmm(w, x, b), w.toarray() @ x + b[:, None],
                                           rtol=1e-12, atol=1e-12)
                if backend == "numba":  # a small product's one thread does not stick
                    import numba

                    assert numba.get_num_threads() == n
        with pytest.raises(ValueError, match="threads must be between 1 and"):
            kernels.set_threads(kernels.max_threads() + 1)
    finally:
        kernels.set_threads(before)


def test_every_live_column_is_flagged_at_every_thread_count(backend):
    """Column c lives in one row only, the rows of different columns far apart (in different
    threads' shares): the flags must name every live column. When the threads shared one flag
    array, a row's read, OR and store of it lost 12-17% of them at 2 threads."""
    n, batch = 4096, 64  # above SMALL_PRODUCT: the threads are used
    w = sp.identity(n, dtype=np.float32, format="csr")
    bias = np.full(n, -0.5, np.float32)
    x = np.zeros((n, batch), np.float32)
    live = [c * 16 + (n // 2) * (c % 2) for c in range(batch)]
    x[live, np.arange(batch)] = 1.0
    before = kernels.threads()
    try:
        for threads in range(1, kernels.max_threads() + 1):
            kernels.set_threads(threads)
            for _ in range(50):
                z, h = np.empty((n, batch), np.float32), np.empty((n, batch), np.float32)
                alive = np.zeros(batch, np.int32)
                kernels.spmm_act(w, x, bias, None, z, h, alive=alive)
                assert np.count_nonzero(h) == batch
                assert alive.tolist() == [1] * batch, (threads, alive)
    finally:
        kernels.set_threads(before)


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


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_largest_per_row_against_a_sort(backend, dtype):
    """Each row's largest entries (RigL's growth) are the first of a sort by (-score, column):
    ties to the lower column, -inf (held connections) only when a row has too few others, a
    count of a whole row or more takes every column, zero takes none."""
    from spdnn.kernels.selection import largest_per_row

    rng = np.random.default_rng(3)
    score = np.abs(rng.standard_normal((40, 57))).round(1).astype(dtype)  # ties everywhere
    score[rng.random(score.shape) < 0.3] = -np.inf
    score[5, :50] = -np.inf  # seven scores left, ten wanted
    score[6] = 1.0  # every column tied
    counts = rng.integers(0, 12, len(score))
    counts[5], counts[6], counts[7], counts[8] = 10, 9, 57, 80
    rows, cols = largest_per_row(np.ascontiguousarray(score), counts)
    want_rows, want_cols = [], []
    for r, c in enumerate(counts):
        order = np.lexsort((np.arange(score.shape[1]), -score[r].astype(np.float64)))
        chosen = np.sort(order[:min(c, score.shape[1])])
        want_rows += [r] * len(chosen)
        want_cols += list(chosen)
    np.testing.assert_array_equal(rows, want_rows)
    np.testing.assert_array_equal(cols, want_cols)
    np.testing.assert_array_equal(cols[rows == 6], np.arange(9))
    # not C-contiguous: numpy's partition, the same columns
    r2, c2 = largest_per_row(np.asfortranarray(score), counts)
    np.testing.assert_array_equal(r2, rows)
    np.testing.assert_array_equal(c2, cols)
