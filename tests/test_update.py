"""The elementwise passes of a training step (spdnn.kernels.update): the fused SGD update and
the refresh gather give numpy's bits on either backend and at any thread count."""

import numpy as np
import pytest

from spdnn.kernels import products as kernels
from spdnn.kernels.update import PARALLEL_MIN, sgd_step, take
from spdnn.model.optim import SGD, SGDConfig


def _params(dtype, seed=0):
    rng = np.random.default_rng(seed)
    sizes = (PARALLEL_MIN + 123, 77, 3 * PARALLEL_MIN)  # big enough for threads, and small
    return [rng.standard_normal(n).astype(dtype) for n in sizes]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("config", [SGDConfig(0.1), SGDConfig(0.05, 0.9),
                                    SGDConfig(0.01, 0.9, 0.001), SGDConfig(0.3, 0, 0.01)])
@pytest.mark.parametrize("threads", [1, 2])
def test_fused_sgd_gives_numpys_bits(backend, dtype, config, threads):
    if threads > kernels.max_threads():
        pytest.skip(f"this process's kernel pool has {kernels.max_threads()} thread(s)")
    before = kernels.threads()
    kernels.set_threads(threads)
    try:
        plain, fused = _params(dtype), _params(dtype)
        opt_plain = SGD(config, plain)
        opt_fused = SGD(config, fused, fused=sgd_step)
        rng = np.random.default_rng(1)
        for _ in range(3):
            grads = [rng.standard_normal(len(p)).astype(dtype) for p in plain]
            opt_plain.step(grads)
            opt_fused.step(grads)
        for a, b in zip(plain, fused):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(opt_plain.buffers, opt_fused.buffers):
            assert (a is None) == (b is None) == (config.momentum == 0)
            if a is not None:
                np.testing.assert_array_equal(a, b)
        assert not np.array_equal(plain[0], _params(dtype)[0])  # it did update
    finally:
        kernels.set_threads(before)


def test_fused_sgd_declines_what_it_does_not_handle(backend):
    p = np.zeros(PARALLEL_MIN, np.float32)
    g = np.ones(PARALLEL_MIN, np.float32)
    handled = sgd_step(p, g, p, 0.1, 0.0, 0.0, False)
    assert handled == (backend == "numba")
    assert not sgd_step(p, g.astype(np.float64), p, 0.1, 0.0, 0.0, False)  # mixed types
    assert not sgd_step(p[:10], g[:10], p[:10], 0.1, 0.0, 0.0, False)  # too small for threads
    assert not sgd_step(p[::2], g[::2], p[::2], 0.1, 0.0, 0.0, False)  # strided


@pytest.mark.parametrize("n", [10, 5 * PARALLEL_MIN])
def test_take(backend, n):
    rng = np.random.default_rng(n)
    src = rng.standard_normal(n)
    gather = rng.permutation(n).astype(np.int64)
    out = np.full(n, np.nan)
    take(src, gather, out)
    np.testing.assert_array_equal(out, src[gather])
