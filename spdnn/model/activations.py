"""Hidden activations, one definition each: value, derivative, and whether it yields exact zeros.

Written as ``name`` or ``name:parameter`` (``leaky_relu:0.2``), one per hidden layer. The
formulas are PyTorch's (torch.nn.functional and its backward formulas), so a network trained
here and in torch computes the same to rounding:

- ``relu``: max(z, 0), capped at the network's ``cap`` when it has one (torch's
  Hardtanh(0, cap)); h'(z) = 1 only for 0 < z < cap (0 at z = 0, as torch).
- ``leaky_relu[:s]``: z for z > 0, else s z (s = 0.01 by default, any finite s); h'(0) = s.
- ``tanh``, ``sigmoid``: derivatives from the output, 1 - h^2 and h (1 - h).
- ``gelu``: z Phi(z) with the exact normal CDF; ``gelu_tanh``: torch's tanh approximation.
- ``identity``: z.

Only ReLU yields exact zeros whose slope is zero too; the parts that rely on them (the fold's
masks, dead-sample pruning, the fused narrow kernels, LSH's hidden layers) apply to it alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

ACTIVATIONS = ("relu", "leaky_relu", "tanh", "sigmoid", "gelu", "gelu_tanh", "identity")
LEAKY_SLOPE = 0.01  # torch.nn.LeakyReLU's default negative_slope

_SQRT1_2 = math.sqrt(0.5)
_PDF = 0.5 * (2 / math.sqrt(math.pi)) * _SQRT1_2  # 1 / sqrt(2 pi), as torch forms it
_BETA = math.sqrt(2) * (2 / math.sqrt(math.pi)) * 0.5  # sqrt(2 / pi)
_KAPPA = 0.044715


@dataclass(frozen=True)
class Activation:
    """One hidden layer's h: ``name`` from ACTIVATIONS, leaky_relu's ``slope``, ReLU's ``cap``."""

    name: str = "relu"
    slope: float = 0.0
    cap: float | None = None

    @property
    def spec(self) -> str:
        """As written in a bundle and on the command line (the cap is the network's)."""
        return f"leaky_relu:{self.slope!r}" if self.name == "leaky_relu" else self.name

    @property
    def zeros(self) -> bool:
        """Whether h(z) = 0 exactly where h'(z) = 0 (ReLU): what the masks read."""
        return self.name == "relu"

    def apply(self, z: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """h(z) into ``out`` (may be ``z``; a new array when None)."""
        out = np.empty_like(z) if out is None else out
        name = self.name
        if name == "relu":
            np.maximum(z, 0, out=out)
            if self.cap is not None:
                np.minimum(out, self.cap, out=out)
        elif name == "leaky_relu":
            np.copyto(out, np.where(z > 0, z, z * z.dtype.type(self.slope)))
        elif name == "tanh":
            np.tanh(z, out=out)
        elif name == "sigmoid":  # 1 / (1 + exp(-z)), torch's formula
            np.negative(z, out=out)
            np.exp(out, out=out)
            out += 1
            np.reciprocal(out, out=out)
        elif name == "gelu":
            t = _erf(z * _SQRT1_2)
            t += 1
            t *= 0.5
            np.multiply(z, t, out=out)
        elif name == "gelu_tanh":  # in torch's order: 0.5 x (1 + tanh(b (x + k x^3)))
            t = z * z
            t *= z
            t *= _KAPPA
            t += z
            t *= _BETA
            np.tanh(t, out=t)
            t += 1
            np.multiply(z * 0.5, t, out=out)
        else:
            np.copyto(out, z)
        return out

    def slope_of(self, z: np.ndarray, h: np.ndarray | None = None) -> np.ndarray:
        """h'(z), from the output ``h`` = h(z) where the formula reads it (tanh, sigmoid)."""
        name = self.name
        if name == "relu":
            keep = z > 0
            if self.cap is not None:
                keep &= z < self.cap
            return keep.astype(z.dtype)
        if name == "leaky_relu":
            return np.where(z > 0, 1, self.slope).astype(z.dtype)
        if name in ("tanh", "sigmoid"):
            h = self.apply(z) if h is None else h
            return 1 - h * h if name == "tanh" else (1 - h) * h
        if name == "gelu":
            cdf = 0.5 * (1 + _erf(z * _SQRT1_2))
            return cdf + z * (np.exp(-0.5 * z * z) * _PDF)
        if name == "gelu_tanh":
            zz = z * z
            inner = np.tanh(_BETA * (z + _KAPPA * (zz * z)))
            return 0.5 * (1 + inner) + (0.5 * z) * (1 - inner * inner) * (
                _BETA * (1 + 3 * _KAPPA * zz))
        return np.ones_like(z)

    def backward(self, g: np.ndarray, z: np.ndarray, h: np.ndarray | None = None) -> None:
        """``g *= h'(z)`` in place."""
        if self.name != "identity":
            g *= self.slope_of(z, h)


RELU = Activation()


def _erf(x: np.ndarray) -> np.ndarray:
    import scipy.special  # on first use: a ReLU job does not pay for its import

    return scipy.special.erf(x)


def parse(spec: str, cap: float | None = None) -> Activation:
    """An activation from its written form (``tanh``, ``leaky_relu:0.2``); ValueError naming
    the choices otherwise. ``cap``: the network's, for ReLU."""
    if not isinstance(spec, str):
        raise ValueError(f"an activation is a name, not {spec!r}")
    name, sep, arg = spec.strip().partition(":")
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {spec!r}; choose from {', '.join(ACTIVATIONS)}")
    if name != "leaky_relu":
        if sep:
            raise ValueError(f"activation {spec!r}: only leaky_relu takes a parameter "
                             "(leaky_relu:SLOPE)")
        return Activation(name, cap=cap if name == "relu" else None)
    try:
        slope = float(arg) if sep else LEAKY_SLOPE
    except ValueError:
        raise ValueError(f"activation {spec!r}: the slope must be a number") from None
    if not math.isfinite(slope):
        raise ValueError(f"activation {spec!r}: the slope must be finite")
    return Activation(name, slope=slope)


def parse_list(specs: Sequence[str] | str, count: int, cap: float | None = None
               ) -> tuple[Activation, ...]:
    """``count`` activations from a list (or comma-separated string) of that length, or of
    one, which every layer then uses."""
    items = specs.split(",") if isinstance(specs, str) else list(specs)
    if len(items) == 1 and count != 1:
        items = items * count
    if len(items) != count:
        raise ValueError(f"{len(items)} activations for {count} hidden layers "
                         "(give one per hidden layer, or one for all)")
    return tuple(parse(s, cap) for s in items)


def canonical(specs: Sequence[str]) -> tuple[str, ...]:
    """The written forms of ``specs``, normalised (leaky_relu's slope spelled out)."""
    return tuple(parse(s).spec for s in specs)
