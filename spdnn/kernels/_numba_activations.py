"""Fast forms of the activations other than ReLU (whose value and slope the products fuse): h(z)
and ``g *= h'(z)`` on (neurons x batch) blocks, as spdnn.model.activations defines them.

numba calls the C library's tanh, exp and erf one value at a time (17-21 ns a value for tanh
here, against 0.4-1 ns for numpy's vectorised tanh and exp), so the transcendental step of each
form is numpy's where numpy has it, and the arithmetic around it one numba pass. The slopes are
read from the outputs h where a formula allows (tanh: 1 - h^2; sigmoid: (1 - h) h; GELU's tanh
form: 1 + tanh(u) = 2 h / z, so no tanh again; GELU: Phi(z) = h / z, so no erf again), which
also avoids the cancellation of 1 - tanh^2 near saturation. erf has no vectorised form here:
in float64 GELU's value calls the C library's erf (exact to rounding, 8 ns a value); in float32
it is Abramowitz and Stegun's 7.1.26 around numpy's exp (absolute error below 1.5e-7, under
float32's own rounding of 1 + erf, and closer to the exact value than torch's float32 GELU:
tests/test_kernels.py).
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from spdnn.kernels._numba_bfloat16 import value

_SQRT1_2 = math.sqrt(0.5)
_PDF = 0.5 * (2 / math.sqrt(math.pi)) * _SQRT1_2  # 1 / sqrt(2 pi)
_BETA = math.sqrt(2) * (2 / math.sqrt(math.pi)) * 0.5  # sqrt(2 / pi)
_KAPPA = 0.044715


@nb.njit(parallel=True, cache=True, nogil=True)
def _leaky_relu(z, out, slope):
    for i in nb.prange(z.shape[0]):
        zi, oi = z[i], out[i]
        for b in range(z.shape[1]):
            v = zi[b]
            oi[b] = v if v > 0 else v * slope


@nb.njit(parallel=True, cache=True, nogil=True)
def _gelu(z, out):
    for i in nb.prange(z.shape[0]):
        zi, oi = z[i], out[i]
        for b in range(z.shape[1]):
            v = zi[b]
            oi[b] = v * (0.5 * (1.0 + math.erf(v * _SQRT1_2)))


# Abramowitz and Stegun 7.1.26 (float32 constants: the arithmetic stays float32)
_F = np.float32
_AS_P, _AS_1, _AS_2 = _F(0.3275911), _F(0.254829592), _F(-0.284496736)
_AS_3, _AS_4, _AS_5 = _F(1.421413741), _F(-1.453152027), _F(1.061405429)
_F_SQRT1_2, _F_HALF, _F_ONE = _F(_SQRT1_2), _F(0.5), _F(1)


@nb.njit(parallel=True, cache=True, nogil=True)
def _gelu32_exponent(z, out):
    """out = -(z^2 / 2): the exponent of exp(-x^2), x = z / sqrt(2)."""
    for i in nb.prange(z.shape[0]):
        zi, oi = z[i], out[i]
        for b in range(z.shape[1]):
            x = zi[b] * _F_SQRT1_2
            oi[b] = -(x * x)


@nb.njit(parallel=True, cache=True, nogil=True)
def _gelu32_finish(z, out):
    """out = z Phi(z), out holding exp(-x^2): erf(x) = sign(x) (1 - t r(t) exp(-x^2)),
    t = 1 / (1 + p |x|)."""
    for i in nb.prange(z.shape[0]):
        zi, oi = z[i], out[i]
        for b in range(z.shape[1]):
            v = zi[b]
            x = abs(v * _F_SQRT1_2)
            t = _F_ONE / (_AS_P * x + _F_ONE)
            r = (((_AS_5 * t + _AS_4) * t + _AS_3) * t + _AS_2) * t + _AS_1
            e = _F_ONE - r * t * oi[b]
            oi[b] = v * (_F_HALF * (_F_ONE + (e if v >= 0 else -e)))


@nb.njit(parallel=True, cache=True, nogil=True)
def _gelu_tanh_inner(z, out):
    """out = sqrt(2 / pi) (z + 0.044715 z^3), tanh's argument."""
    for i in nb.prange(z.shape[0]):
        zi, oi = z[i], out[i]
        for b in range(z.shape[1]):
            v = zi[b]
            oi[b] = _BETA * (v + _KAPPA * (v * v * v))


@nb.njit(parallel=True, cache=True, nogil=True)
def _gelu_tanh_finish(z, out):
    """out = 0.5 z (1 + out), out holding tanh of the inner term."""
    for i in nb.prange(z.shape[0]):
        zi, oi = z[i], out[i]
        for b in range(z.shape[1]):
            oi[b] = (0.5 * zi[b]) * (1.0 + oi[b])


@nb.njit(parallel=True, cache=True, nogil=True)
def _slope_leaky_relu(g, z, slope):
    for i in nb.prange(g.shape[0]):
        gi, zi = g[i], z[i]
        for b in range(g.shape[1]):
            if not zi[b] > 0:
                gi[b] = gi[b] * slope


@nb.njit(parallel=True, cache=True, nogil=True)
def _slope_tanh(g, h):
    for i in nb.prange(g.shape[0]):
        gi, hi = g[i], h[i]
        for b in range(g.shape[1]):
            v = value(hi[b])  # bfloat16 outputs widened
            gi[b] = gi[b] * (1 - v * v)


@nb.njit(parallel=True, cache=True, nogil=True)
def _slope_sigmoid(g, h):
    for i in nb.prange(g.shape[0]):
        gi, hi = g[i], h[i]
        for b in range(g.shape[1]):
            v = value(hi[b])
            gi[b] = gi[b] * ((1 - v) * v)


@nb.njit(parallel=True, cache=True, nogil=True)
def _slope_gelu(g, z, h, e):
    """Phi(z) + z phi(z) with Phi = h / z (0.5 at z = 0) and ``e`` = exp(-z^2 / 2)."""
    for i in nb.prange(g.shape[0]):
        gi, zi, hi, ei = g[i], z[i], h[i], e[i]
        for b in range(g.shape[1]):
            v = zi[b]
            cdf = hi[b] / v if v != 0 else 0.5
            gi[b] = gi[b] * (cdf + v * (ei[b] * _PDF))


@nb.njit(parallel=True, cache=True, nogil=True)
def _slope_gelu_tanh(g, z, h):
    """0.5 (1 + t) + 0.5 z (1 - t^2) u' with 1 + t = 2 h / z (1 at z = 0) and
    1 - t^2 = (1 + t) (2 - (1 + t))."""
    for i in nb.prange(g.shape[0]):
        gi, zi, hi = g[i], z[i], h[i]
        for b in range(g.shape[1]):
            v = zi[b]
            p = 2 * hi[b] / v if v != 0 else 1.0
            gi[b] = gi[b] * (0.5 * p + (0.5 * v) * (p * (2 - p))
                             * (_BETA * (1.0 + 3.0 * _KAPPA * (v * v))))


@nb.njit(parallel=True, cache=True, nogil=True)
def _half_square_negated(z, out):
    for i in nb.prange(z.shape[0]):
        zi, oi = z[i], out[i]
        for b in range(z.shape[1]):
            v = zi[b]
            oi[b] = -0.5 * v * v


# The forms spdnn.model.activations' classes call (each class names the ones it has).
leaky_relu = _leaky_relu
slope_leaky_relu = _slope_leaky_relu
slope_tanh = _slope_tanh
slope_sigmoid = _slope_sigmoid
slope_gelu_tanh = _slope_gelu_tanh


def gelu(z: np.ndarray, out: np.ndarray) -> None:
    """GELU's value: in float32 around numpy's exp, in float64 with the C library's erf."""
    if z.dtype == np.float32:
        _gelu32_exponent(z, out)
        np.exp(out, out=out)
        _gelu32_finish(z, out)
    else:
        _gelu(z, out)


def gelu_tanh(z: np.ndarray, out: np.ndarray) -> None:
    """GELU's tanh form: the arithmetic in numba, the tanh numpy's."""
    _gelu_tanh_inner(z, out)
    np.tanh(out, out=out)
    _gelu_tanh_finish(z, out)


def slope_gelu(g: np.ndarray, z: np.ndarray, h: np.ndarray) -> None:
    """``g *= GELU'(z)``, Phi(z) read from the outputs h."""
    e = np.empty_like(z)
    _half_square_negated(z, e)
    np.exp(e, out=e)
    _slope_gelu(g, z, h, e)


def warm_up(dtypes: tuple) -> None:
    """Compile (or load from cache) every activation's kernels for ``dtypes``."""
    import sys

    from spdnn.model.activations import BY_NAME

    this = sys.modules[__name__]
    for dt in dtypes:
        z = np.ones((1, 2), dt)
        for cls in BY_NAME.values():
            act = cls()
            act.compiled_value(this, z, z.copy())
            act.compiled_slope(this, z.copy(), z, z)
