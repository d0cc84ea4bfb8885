"""spdnn.kernels.layers: the narrow end of an inference pass in one call, against the same
layers run one kernel call at a time (spmm_act, then the dead columns dropped)."""

import numpy as np
import pytest
import scipy.sparse as sp

from spdnn.kernels import products
from spdnn.kernels.layers import LayerRun


def _network(dtype, n_layers=12, n=40, seed=0, bias=-0.2):
    rng = np.random.default_rng(seed)
    weights, biases = [], []
    for k in range(n_layers):
        n_in = 30 if k == 0 else n
        keep = rng.random((n, n_in)) < rng.random((n, 1)) * 0.5  # rows of 0 to ~20 entries
        weights.append(sp.csr_matrix((rng.standard_normal((n, n_in)) * keep).astype(dtype)))
        biases.append((rng.random(n) * bias).astype(dtype))
    return weights, biases


def _one_at_a_time(weights, biases, cap, x, first):
    """forward(keep=False, drop_dead=True) as a loop of kernel calls, from layer ``first``."""
    ids = np.arange(x.shape[1])
    for k in range(first, len(weights)):
        z = np.empty((weights[k].shape[0], x.shape[1]), x.dtype)
        if k == len(weights) - 1:
            products.spmm_act(weights[k], x, biases[k], cap, z, None)
            return z, ids
        h, alive = np.empty_like(z), np.zeros(x.shape[1], np.int32)
        products.spmm_act(weights[k], x, biases[k], cap, z, h, alive=alive)
        live = np.flatnonzero(alive)
        if len(live) == 0:
            return z[:, :0], ids[:0]
        if len(live) <= 0.75 * x.shape[1]:
            h, ids = np.ascontiguousarray(h[:, live]), ids[live]
        x = h
    raise AssertionError("unreachable")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cap", [None, 0.8])
def test_a_run_of_layers_equals_the_layers_one_at_a_time(dtype, cap):
    """Z of the last layer and the surviving samples, bit for bit, from several first layers
    and widths up to the narrow limit, with columns dying (and being dropped) on the way;
    a run where every column dies returns width 0."""
    products.set_backend("numba") if "numba" in products.available_backends() else \
        pytest.skip("the numba backend is not installed")
    limit = 128 // np.dtype(dtype).itemsize
    dropped = 0  # runs that dropped some columns and kept others
    for bias, seed in ((-0.2, 0), (-0.6, 1), (-40.0, 2)):
        weights, biases = _network(dtype, seed=seed, bias=bias)
        in_rows = [w.shape[1] for w in weights]
        run = LayerRun.of(weights, biases, in_rows)
        assert run is not None
        rng = np.random.default_rng(seed)
        for first in (0, 3, len(weights) - 1):
            for width in sorted({1, 2, 7, 8, 9, limit // 2 + 3, limit}):
                scale = rng.choice([0.0, 0.05, 1.0], size=width)  # some columns die early
                x = (rng.random((in_rows[first], width)) * scale).astype(dtype)
                assert run.fits(first, width, x.itemsize)
                z_ref, ids_ref = _one_at_a_time(weights, biases, cap, x, first)
                dropped += 0 < len(ids_ref) < width
                rows = max(in_rows) * width
                xa, xb, zbuf = (np.full(rows, np.nan, dtype) for _ in range(3))
                xa[: x.size] = x.reshape(-1)
                ids = np.arange(width)
                got, work = run.narrow(first, cap, 0.75, (xa, xb), 0, zbuf, width, ids)
                where = (bias, first, width)
                assert got == z_ref.shape[1], where
                np.testing.assert_array_equal(ids[:got], ids_ref, err_msg=str(where))
                n_last = weights[-1].shape[0]
                np.testing.assert_array_equal(zbuf[: n_last * got].reshape(n_last, got), z_ref,
                                              err_msg=str(where))
                assert (work[:first] == 0).all() and work[first] == weights[first].nnz * width
                if bias == -40.0 and first < len(weights) - 1:
                    assert got == 0  # every column died on the way
    assert dropped >= 5, dropped
    assert not run.fits(0, limit + 1, np.dtype(dtype).itemsize)


def test_no_run_without_numba_or_with_mixed_types():
    weights, biases = _network(np.float64, n_layers=3)
    before = products.backend()
    try:
        products.set_backend("scipy")
        assert LayerRun.of(weights, biases, [30, 40, 40]) is None
        if "numba" in products.available_backends():
            products.set_backend("numba")
            weights[1] = weights[1].astype(np.float32)
            assert LayerRun.of(weights, biases, [30, 40, 40]) is None
    finally:
        products.set_backend(before)
