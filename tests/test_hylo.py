"""Hylo's 2-bit gradient sums (spdnn.lossy.hylo) against a plain numpy computation: codes,
packing, scale, error feedback and the sum of several replicas' messages."""

from __future__ import annotations

import numpy as np
import pytest

from spdnn.lossy import compress as C
from spdnn.lossy import hylo


def _heavy(n: int, seed: int, dtype=np.float32) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.laplace(size=n) * rng.exponential(size=n) ** 0.5).astype(dtype)


def _by_hand(acc: np.ndarray) -> tuple[np.ndarray, float]:
    """Codes (-1, 0, +1) and scale as the policy states them, in float64."""
    mag = np.abs(acc.astype(np.float64))
    t = mag.mean()
    sent = (mag >= t) & (mag > 0)
    return np.where(sent, np.sign(acc), 0).astype(np.int8), mag[sent].mean() if sent.any() else 0


def _decode(message: np.ndarray, n: int) -> tuple[np.ndarray, float]:
    codes = np.unpackbits(message[:-8], bitorder="little").reshape(-1, 2)
    code = codes[:, 0] + 2 * codes[:, 1]
    assert np.all(code[n:] == 0) and not np.any(code == 3)
    return np.where(code == 1, 1, np.where(code == 2, -1, 0))[:n].astype(np.int8), \
        float(message[-8:].view(np.float64)[0])


def test_parse():
    assert C.parse_compress("hylo") == C.CompressSpec(kind="hylo")
    assert C.parse_compress("HYLO", 500) == C.CompressSpec(kind="hylo", min_values=500)
    assert C.parse_compress("hylo").text() == "hylo"
    assert C.parse_compress("hylo", 10).applies(10) and not C.parse_compress("hylo", 11).applies(10)
    for bad in ("hylo:0.1", "hylo:2"):
        with pytest.raises(ValueError, match="takes no ratio"):
            C.parse_compress(bad)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 3, 4, 5, 1001])
def test_codes_scale_and_error_feedback(dtype, n):
    comp = hylo.HyloCompressor(n, np.dtype(dtype))
    for step in range(4):
        gw, gb = _heavy(n - n // 3, step, dtype), _heavy(n // 3, 50 + step, dtype)
        accumulated = comp.residual + np.concatenate([gw, gb])
        codes, scale = _by_hand(accumulated)
        message, nonzero = comp.pack((gw, gb))
        assert len(message) == hylo.message_bytes(n) == (n + 3) // 4 + 8
        got, got_scale = _decode(message, n)
        np.testing.assert_array_equal(got, codes)
        assert nonzero == np.count_nonzero(codes)
        assert got_scale == pytest.approx(scale, rel=1e-6 if dtype == np.float32 else 1e-12)
        assert got_scale == float(dtype(got_scale))  # travels in the values' own type
        sent = codes.astype(dtype) * dtype(got_scale)
        # what was sent and what stays add up to the accumulated gradient (one rounding)
        np.testing.assert_allclose(sent + comp.residual, accumulated,
                                   rtol=0, atol=4 * np.finfo(dtype).eps * np.abs(accumulated).max())


def test_zero_and_constant_vectors():
    comp = hylo.HyloCompressor(10, np.dtype(np.float64))
    message, nonzero = comp.pack((np.zeros(10),))
    assert nonzero == 0 and not message[:-8].any() and _decode(message, 10)[1] == 0
    message, nonzero = comp.pack((np.full(10, -0.5),))
    codes, scale = _decode(message, 10)
    assert nonzero == 10 and np.all(codes == -1) and scale == 0.5
    assert not comp.residual.any()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_messages_add_in_replica_order(dtype):
    n = 999
    comps = [hylo.HyloCompressor(n, np.dtype(dtype)) for _ in range(3)]
    messages = [c.pack((_heavy(n, r, dtype),))[0].copy() for r, c in enumerate(comps)]
    total = np.zeros(n, dtype=dtype)
    hylo.add_messages(np.concatenate(messages), n, total)
    expected = np.zeros(n, dtype=dtype)
    for m in messages:
        codes, scale = _decode(m, n)
        expected += codes.astype(dtype) * dtype(scale)
    np.testing.assert_array_equal(total, expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_two_bit_sums_numpy_passes_give_the_compiled_ones_bits(dtype):
    """The scipy backend's passes (spdnn.lossy._numpy_hylo): the same statistics, message
    bytes, residual and sums as the numba kernels, bit for bit."""
    pytest.importorskip("numba")
    from spdnn.lossy import _numba_hylo as compiled
    from spdnn.lossy import _numpy_hylo as plain

    rng = np.random.default_rng(4)
    x = rng.standard_normal(1001).astype(dtype)
    x[::5] = 0
    t = dtype(0.5)
    assert plain.above_stats(x, 0.5) == compiled.above_stats(x, 0.5)
    xs, outs = [x.copy(), x.copy()], [np.empty(251, np.uint8), np.empty(251, np.uint8)]
    nz = [half.quantize_pack(v, t, dtype(0.75), o) for half, v, o in
          zip((plain, compiled), xs, outs)]
    assert nz[0] == nz[1] > 0
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(xs[0], xs[1])
    totals = [np.ones(1001, dtype), np.ones(1001, dtype)]
    for half, total in zip((plain, compiled), totals):
        half.unpack_add(outs[0], dtype(0.75), total)
    np.testing.assert_array_equal(totals[0], totals[1])
