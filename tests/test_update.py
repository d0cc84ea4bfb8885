"""The optimizers' fused updates (spdnn.optim, where spdnn.kernels.update.PARALLEL applies)
give numpy's bits on either backend and at any thread count."""

from contextlib import contextmanager

import numpy as np
import pytest

from spdnn.kernels import products as kernels
from spdnn.kernels.update import PARALLEL, PARALLEL_MIN
from spdnn.optim import AdamConfig, AdamWConfig, RowGrad, SGDConfig, make
from spdnn.optim.sgd import step, step_rows


def _params(dtype, seed=0):
    rng = np.random.default_rng(seed)
    sizes = (PARALLEL_MIN + 123, 77, 3 * PARALLEL_MIN)  # big enough for threads, and small
    return [rng.standard_normal(n).astype(dtype) for n in sizes]


@contextmanager
def _kernel_threads(n: int):
    if n > kernels.max_threads():
        pytest.skip(f"this process's kernel pool has {kernels.max_threads()} thread(s)")
    before = kernels.threads()
    kernels.set_threads(n)
    try:
        yield
    finally:
        kernels.set_threads(before)


def _assert_same_updates(config, dtype, make_grads):
    """Three steps of an optimizer's numpy form and of its fused kernel on the same
    gradients: the same bits in the parameters and in its state."""
    plain, fused = _params(dtype), _params(dtype)
    opt_plain, opt_fused = make(config, plain), make(config, fused, parallel=PARALLEL)
    rng = np.random.default_rng(1)
    for _ in range(3):
        grads = make_grads(plain, rng)
        opt_plain.step(grads)
        opt_fused.step(grads)
    for a, b in zip(plain, fused):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(opt_plain.state, opt_fused.state):
        assert a.keys() == b.keys()
        assert bool(a) == (getattr(config, "momentum", 1) != 0)
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])
    assert not np.array_equal(plain[0], _params(dtype)[0])  # it did update


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("config", [
    SGDConfig(0.1), SGDConfig(0.05, 0.9), SGDConfig(0.01, 0.9, 0.001), SGDConfig(0.3, 0, 0.01),
    SGDConfig(0.02, 0.8, 0.01, nesterov=True), AdamConfig(), AdamConfig(0.01, (0.8, 0.9),
                                                                         1e-6, 0.05),
    AdamConfig(0.01, (0.2, 0.5)), AdamWConfig(), AdamWConfig(0.01, (0.8, 0.9), 1e-6, 0.1)])
@pytest.mark.parametrize("threads", [1, 2])
def test_fused_updates_give_numpys_bits(backend, dtype, config, threads):
    with _kernel_threads(threads):
        _assert_same_updates(config, dtype, lambda params, rng: [
            rng.standard_normal(len(p)).astype(dtype) for p in params])


def _row_grads(params, rng):
    """Half the entries of each parameter, others each step (buffers start at zero where
    never updated); the largest is above PARALLEL_MIN, so numba takes it."""
    out = []
    for p in params:
        rows = np.sort(rng.choice(len(p), size=max(len(p) // 2, 1), replace=False))
        out.append(RowGrad(rows, rng.standard_normal(len(rows)).astype(p.dtype)))
    return out


def _run_grads(params, rng):
    """As ``_row_grads`` in runs of consecutive entries (a row's weights: RowGrad.counts),
    of 1 to 40 entries, some runs adjacent."""
    out = []
    for p in params:
        cuts = np.unique(rng.integers(0, len(p), size=max(len(p) // 10, 2)))
        starts, ends = cuts[:-1], np.minimum(cuts[1:], cuts[:-1] + rng.integers(1, 41))
        keep = rng.random(len(starts)) < 0.7
        starts, counts = starts[keep], (ends - starts)[keep]
        out.append(RowGrad(starts, rng.standard_normal(int(counts.sum())).astype(p.dtype),
                           counts))
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("config", [SGDConfig(0.1), SGDConfig(0.05, 0.9),
                                    SGDConfig(0.01, 0.9, 0.001),
                                    SGDConfig(0.01, 0.9, 0.001, nesterov=True)])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("grads", [_row_grads, _run_grads])
def test_fused_row_updates_give_numpys_bits(backend, dtype, config, threads, grads):
    with _kernel_threads(threads):
        _assert_same_updates(config, dtype, grads)
    p = _params(dtype)[2]
    idx = np.arange(0, len(p), 2)
    handled = step_rows(PARALLEL, p, RowGrad(idx, np.ones(len(idx), dtype)), p, 0.1, 0.0, 0.0)
    assert handled == (backend == "numba")


def test_runs_spell_out_their_entries():
    g = RowGrad(np.array([5, 0, 9]), np.arange(6.0), np.array([2, 1, 3]))
    np.testing.assert_array_equal(g.entries(), [5, 6, 0, 9, 10, 11])
    assert RowGrad(np.array([3, 1]), np.zeros(2)).entries().tolist() == [3, 1]


def test_fused_sgd_declines_what_it_does_not_handle(backend):
    p = np.zeros(PARALLEL_MIN, np.float32)
    g = np.ones(PARALLEL_MIN, np.float32)
    handled = step(PARALLEL, p, g, p, 0.1, 0.0, 0.0, False)
    assert handled == (backend == "numba")
    assert not step(PARALLEL, p, g.astype(np.float64), p, 0.1, 0.0, 0.0, False)  # mixed types
    assert not step(PARALLEL, p[:10], g[:10], p[:10], 0.1, 0.0, 0.0, False)  # too small for threads
    assert not step(PARALLEL, p[::2], g[::2], p[::2], 0.1, 0.0, 0.0, False)  # strided
