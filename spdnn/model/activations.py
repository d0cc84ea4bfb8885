"""Hidden activations, one class each (``BY_NAME``): value, derivative, compiled forms, the torch
module that computes it, and whether it yields exact zeros. Adding one is its class here and a
line in ``BY_NAME``.

Written as ``name`` or ``name:parameter`` (``leaky_relu:0.2``), one per hidden layer. The
formulas are PyTorch's (torch.nn.functional and its backward formulas), so a network trained
here and in torch computes the same to rounding:

- ``relu``: max(z, 0), capped at the network's ``cap`` when it has one (torch's
  Hardtanh(0, cap)); h'(z) = 1 only for 0 < z < cap (0 at z = 0, as torch).
- ``leaky_relu[:s]``: z for z > 0, else s z (s = 0.01 by default, any finite s); h'(0) = s.
- ``tanh``, ``sigmoid``: derivatives from the output, 1 - h^2 and h (1 - h).
- ``gelu``: z Phi(z) with the exact normal CDF; ``gelu_tanh``: torch's tanh approximation.
- ``identity``: z.

A bfloat16 run keeps no Z once a layer's outputs are rounded, so it trains the activations
whose slope reads only the outputs (``BFLOAT16``: relu, tanh, sigmoid, identity).

Only ReLU yields exact zeros whose slope is zero too; the parts that rely on them (the fold's
masks, dead-sample pruning, the fused narrow kernels, LSH's hidden layers) apply to it alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

LEAKY_SLOPE = 0.01  # torch.nn.LeakyReLU's default negative_slope

_SQRT1_2 = math.sqrt(0.5)
_PDF = 0.5 * (2 / math.sqrt(math.pi)) * _SQRT1_2  # 1 / sqrt(2 pi), as torch forms it
_BETA = math.sqrt(2) * (2 / math.sqrt(math.pi)) * 0.5  # sqrt(2 / pi)
_KAPPA = 0.044715


@dataclass(frozen=True)
class Activation:
    """One hidden layer's h, one subclass per activation: its ``name``, its value
    (``value``) and slope (``slope_of``) in numpy, its compiled forms (``compiled_value``,
    ``compiled_slope``: the numba half's kernels, spdnn.kernels._numba_activations, given as
    ``nb``; False where it has none) and the torch module that computes it (``torch``).
    ``slope``: leaky_relu's; ``cap``: ReLU's (the network's)."""

    slope: float = 0.0
    cap: float | None = None
    name: ClassVar[str] = ""
    ZEROS: ClassVar[bool] = False  # h(z) = 0 exactly where h'(z) = 0: what the masks read
    LINEAR: ClassVar[bool] = False  # h(z) = z: a softmax over the outputs reads z itself
    FROM_OUTPUT: ClassVar[bool] = False  # its compiled slope reads the outputs h(z)
    # its slope needs no Z (it reads the outputs, or is 1): a bfloat16 pass, whose Z is spent
    # once the outputs are rounded, trains it with the slope read from the rounded outputs
    BFLOAT16: ClassVar[bool] = False

    @property
    def spec(self) -> str:
        """As written in a bundle and on the command line (the cap is the network's)."""
        return self.name

    @property
    def zeros(self) -> bool:
        return self.ZEROS

    def apply(self, z: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """h(z) into ``out`` (may be ``z``; a new array when None)."""
        out = np.empty_like(z) if out is None else out
        self.value(z, out)
        return out

    def value(self, z: np.ndarray, out: np.ndarray) -> None:
        np.copyto(out, z)

    def slope_of(self, z: np.ndarray, h: np.ndarray | None = None) -> np.ndarray:
        """h'(z), from the output ``h`` = h(z) where the formula reads it (tanh, sigmoid)."""
        return np.ones_like(z)

    def backward(self, g: np.ndarray, z: np.ndarray, h: np.ndarray | None = None) -> None:
        """``g *= h'(z)`` in place."""
        g *= self.slope_of(z, h)

    def compiled_value(self, nb: Any, z: np.ndarray, out: np.ndarray) -> bool:  # noqa: ANN401
        """``out = h(z)`` with the numba half ``nb`` (C-contiguous 2-D blocks); False where
        numpy's vectorised pass is the form."""
        return False

    def compiled_slope(self, nb: Any, g: np.ndarray, z: np.ndarray,  # noqa: ANN401
                       h: np.ndarray | None) -> bool:
        """``g *= h'(z)`` with ``nb`` (``h`` given when FROM_OUTPUT); False where none."""
        return False

    def torch(self, nn: Any) -> Any:  # noqa: ANN401
        """The ``torch.nn`` module (from ``nn``) that computes it."""
        raise NotImplementedError

    @classmethod
    def of_torch(cls, m: Any, nn: Any) -> Activation | None:  # noqa: ANN401
        """This activation, when the torch module ``m`` computes it; else None."""
        return cls() if type(m) is type(cls().torch(nn)) else None


@dataclass(frozen=True)
class ReLU(Activation):
    """max(z, 0), capped at ``cap`` when given (torch's Hardtanh(0, cap)); h'(z) = 1 only for
    0 < z < cap (0 at z = 0, as torch). The products fuse its value and slope."""

    name: ClassVar[str] = "relu"
    ZEROS: ClassVar[bool] = True
    BFLOAT16: ClassVar[bool] = True

    def value(self, z: np.ndarray, out: np.ndarray) -> None:
        np.maximum(z, 0, out=out)
        if self.cap is not None:
            np.minimum(out, self.cap, out=out)

    def slope_of(self, z: np.ndarray, h: np.ndarray | None = None) -> np.ndarray:
        keep = z > 0
        if self.cap is not None:
            keep &= z < self.cap
        return keep.astype(z.dtype)

    def torch(self, nn: Any) -> Any:  # noqa: ANN401
        return nn.ReLU() if self.cap is None else nn.Hardtanh(0.0, float(self.cap))

    @classmethod
    def of_torch(cls, m: Any, nn: Any) -> Activation | None:  # noqa: ANN401
        if isinstance(m, nn.ReLU):
            return cls()
        if isinstance(m, nn.Hardtanh) and m.min_val == 0 and m.max_val > 0:
            return cls(cap=float(m.max_val))
        return None


@dataclass(frozen=True)
class LeakyReLU(Activation):
    """z for z > 0, else s z (s = 0.01 by default, any finite s); h'(0) = s."""

    name: ClassVar[str] = "leaky_relu"

    @property
    def spec(self) -> str:
        return f"leaky_relu:{self.slope!r}"

    def value(self, z: np.ndarray, out: np.ndarray) -> None:
        np.copyto(out, np.where(z > 0, z, z * z.dtype.type(self.slope)))

    def slope_of(self, z: np.ndarray, h: np.ndarray | None = None) -> np.ndarray:
        return np.where(z > 0, 1, self.slope).astype(z.dtype)

    def compiled_value(self, nb: Any, z: np.ndarray, out: np.ndarray) -> bool:  # noqa: ANN401
        nb.leaky_relu(z, out, z.dtype.type(self.slope))
        return True

    def compiled_slope(self, nb: Any, g: np.ndarray, z: np.ndarray,  # noqa: ANN401
                       h: np.ndarray | None) -> bool:
        nb.slope_leaky_relu(g, z, g.dtype.type(self.slope))
        return True

    def torch(self, nn: Any) -> Any:  # noqa: ANN401
        return nn.LeakyReLU(self.slope)

    @classmethod
    def of_torch(cls, m: Any, nn: Any) -> Activation | None:  # noqa: ANN401
        return cls(slope=float(m.negative_slope)) if isinstance(m, nn.LeakyReLU) else None


@dataclass(frozen=True)
class _SlopeFromOutput(Activation):
    """An activation whose slope is a function of its output alone: the numba half's
    ``slope_NAME(g, h)``, and torch's ``nn.TORCH()``."""

    TORCH: ClassVar[str] = ""
    FROM_OUTPUT: ClassVar[bool] = True
    BFLOAT16: ClassVar[bool] = True

    def compiled_slope(self, nb: Any, g: np.ndarray, z: np.ndarray,  # noqa: ANN401
                       h: np.ndarray | None) -> bool:
        getattr(nb, "slope_" + self.name)(g, h)
        return True

    def torch(self, nn: Any) -> Any:  # noqa: ANN401
        return getattr(nn, self.TORCH)()


@dataclass(frozen=True)
class Tanh(_SlopeFromOutput):
    """tanh z; h'(z) = 1 - h^2, from the output."""

    name: ClassVar[str] = "tanh"
    TORCH: ClassVar[str] = "Tanh"

    def value(self, z: np.ndarray, out: np.ndarray) -> None:
        np.tanh(z, out=out)

    def slope_of(self, z: np.ndarray, h: np.ndarray | None = None) -> np.ndarray:
        h = self.apply(z) if h is None else h
        return 1 - h * h


@dataclass(frozen=True)
class Sigmoid(_SlopeFromOutput):
    """1 / (1 + exp(-z)), torch's formula; h'(z) = (1 - h) h, from the output."""

    name: ClassVar[str] = "sigmoid"
    TORCH: ClassVar[str] = "Sigmoid"

    def value(self, z: np.ndarray, out: np.ndarray) -> None:
        np.negative(z, out=out)
        np.exp(out, out=out)
        out += 1
        np.reciprocal(out, out=out)

    def slope_of(self, z: np.ndarray, h: np.ndarray | None = None) -> np.ndarray:
        h = self.apply(z) if h is None else h
        return (1 - h) * h


@dataclass(frozen=True)
class _GELUForm(Activation):
    """What both forms of GELU share: torch's ``nn.GELU(approximate=APPROXIMATE)``, and the
    numba half's ``NAME`` and ``slope_NAME`` kernels (the slope read from the outputs)."""

    APPROXIMATE: ClassVar[str] = ""
    FROM_OUTPUT: ClassVar[bool] = True

    def compiled_value(self, nb: Any, z: np.ndarray, out: np.ndarray) -> bool:  # noqa: ANN401
        getattr(nb, self.name)(z, out)
        return True

    def compiled_slope(self, nb: Any, g: np.ndarray, z: np.ndarray,  # noqa: ANN401
                       h: np.ndarray | None) -> bool:
        getattr(nb, "slope_" + self.name)(g, z, h)
        return True

    def torch(self, nn: Any) -> Any:  # noqa: ANN401
        return nn.GELU(approximate=self.APPROXIMATE)

    @classmethod
    def of_torch(cls, m: Any, nn: Any) -> Activation | None:  # noqa: ANN401
        return cls() if isinstance(m, nn.GELU) and m.approximate == cls.APPROXIMATE else None


@dataclass(frozen=True)
class GELU(_GELUForm):
    """z Phi(z) with the exact normal CDF."""

    name: ClassVar[str] = "gelu"
    APPROXIMATE: ClassVar[str] = "none"

    def value(self, z: np.ndarray, out: np.ndarray) -> None:
        t = _erf(z * _SQRT1_2)
        t += 1
        t *= 0.5
        np.multiply(z, t, out=out)

    def slope_of(self, z: np.ndarray, h: np.ndarray | None = None) -> np.ndarray:
        cdf = 0.5 * (1 + _erf(z * _SQRT1_2))
        return cdf + z * (np.exp(-0.5 * z * z) * _PDF)


@dataclass(frozen=True)
class GELUTanh(_GELUForm):
    """torch's tanh approximation of GELU: 0.5 z (1 + tanh(b (z + k z^3))), in its order."""

    name: ClassVar[str] = "gelu_tanh"
    APPROXIMATE: ClassVar[str] = "tanh"

    def value(self, z: np.ndarray, out: np.ndarray) -> None:
        t = z * z
        t *= z
        t *= _KAPPA
        t += z
        t *= _BETA
        np.tanh(t, out=t)
        t += 1
        np.multiply(z * 0.5, t, out=out)

    def slope_of(self, z: np.ndarray, h: np.ndarray | None = None) -> np.ndarray:
        zz = z * z
        inner = np.tanh(_BETA * (z + _KAPPA * (zz * z)))
        return 0.5 * (1 + inner) + (0.5 * z) * (1 - inner * inner) * (
            _BETA * (1 + 3 * _KAPPA * zz))


@dataclass(frozen=True)
class Identity(Activation):
    """z."""

    name: ClassVar[str] = "identity"
    LINEAR: ClassVar[bool] = True
    BFLOAT16: ClassVar[bool] = True

    def backward(self, g: np.ndarray, z: np.ndarray, h: np.ndarray | None = None) -> None:
        return

    def compiled_slope(self, nb: Any, g: np.ndarray, z: np.ndarray,  # noqa: ANN401
                       h: np.ndarray | None) -> bool:
        return True

    def torch(self, nn: Any) -> Any:  # noqa: ANN401
        return nn.Identity()

    @classmethod
    def of_torch(cls, m: Any, nn: Any) -> Activation | None:  # noqa: ANN401
        return None  # torch's Identity between Linears is "no activation": the pytorch reader


BY_NAME: dict[str, type[Activation]] = {cls.name: cls for cls in (
    ReLU, LeakyReLU, Tanh, Sigmoid, GELU, GELUTanh, Identity)}
ACTIVATIONS = tuple(BY_NAME)
# The output layer's, by the name a network file records: linear (a softmax or MSE head), or
# ReLU with the network's cap (the Graph Challenge's networks).
OUTPUTS: dict[str, type[Activation]] = {"linear": Identity, "relu": ReLU}


def relu_only(specs: Sequence[str]) -> bool:
    """Whether the hidden layers written as ``specs`` are all ReLU, whose slope the backward
    products apply as they write (spdnn.model.memory counts no block for it)."""
    return all(spec.partition(":")[0] == ReLU.name for spec in specs)


def output_of(name: str, cap: float | None = None) -> Activation:
    """The output layer's activation a network records as ``name`` (a key of OUTPUTS)."""
    cls = OUTPUTS[name]
    return cls(cap=cap if cls is ReLU else None)


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
        return BY_NAME[name](cap=cap if name == "relu" else None)
    try:
        slope = float(arg) if sep else LEAKY_SLOPE
    except ValueError:
        raise ValueError(f"activation {spec!r}: the slope must be a number") from None
    if not math.isfinite(slope):
        raise ValueError(f"activation {spec!r}: the slope must be finite")
    return LeakyReLU(slope=slope)


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

