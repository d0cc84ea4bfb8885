"""The optimizers, with ``torch.optim``'s semantics on a flat list of parameter arrays.

An optimizer is one class here: its hyper-parameters and their checks (its ``Config``), its
named state per stored value (``STATE``, checkpointed by those names), and its update in
numpy. A fused kernel may do a parameter's update in one pass instead
(``spdnn.kernels.update.fused_update``, chosen by the optimizer's ``name``). Both engines use
these classes: the serial reference on whole layers, the runtime on each rank's rows.

Weight decay applies to every parameter, biases included (one torch parameter group), and every
stored value is updated every step, as torch updates a masked dense parameter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

import numpy as np

from spdnn.errors import OptionError


def parameters(layers: Iterable[Any]) -> list[np.ndarray]:
    """W_1.data, b_1, W_2.data, b_2, ... of anything with ``weight`` (CSR) and ``bias``
    (views: updating them updates the layers)."""
    out: list[np.ndarray] = []
    for layer in layers:
        out += [layer.weight.data, layer.bias]
    return out


def interleave(weights: list[np.ndarray], biases: list[np.ndarray]) -> list[np.ndarray]:
    """Gradients in the order of ``parameters``."""
    return [a for pair in zip(weights, biases) for a in pair]


@dataclass(frozen=True)
class RowGrad:
    """The gradient of some entries of a parameter only (LSH-selected rows): the others are
    not updated at all this step (lazily, as ``torch.optim.SparseAdam`` treats a sparse
    gradient), as SLIDE trains. The entries are ``positions``, or with ``counts`` runs of
    them: positions[k], positions[k] + 1, ..., counts[k] entries (a row's weights), the runs'
    values one after the other."""

    positions: np.ndarray
    values: np.ndarray
    counts: np.ndarray | None = None

    def entries(self) -> np.ndarray:
        """Every entry's position, runs spelled out."""
        if self.counts is None:
            return self.positions
        counts = np.asarray(self.counts, dtype=np.int64)
        shift = np.asarray(self.positions, dtype=np.int64) - (np.cumsum(counts) - counts)
        return np.repeat(shift, counts) + np.arange(int(counts.sum()))


def _number(name: str, value: object, *, positive: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise OptionError(name, f"must be a finite number {'>' if positive else '>='} 0, "
                                f"not {value!r}")


@dataclass(frozen=True)
class SGDConfig:
    """``torch.optim.SGD``'s hyper-parameters (no dampening). torch has no default rate;
    spdnn's is 0.05."""

    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0
    nesterov: bool = False

    def __post_init__(self) -> None:
        for name in ("lr", "momentum", "weight_decay"):
            _number(name, getattr(self, name))
        if not isinstance(self.nesterov, bool):
            raise OptionError("nesterov", f"must be True or False, not {self.nesterov!r}")
        if self.nesterov and self.momentum == 0:
            raise OptionError("nesterov", "needs a momentum above 0 (as torch.optim.SGD)")


@dataclass(frozen=True)
class AdamConfig:
    """``torch.optim.Adam``'s hyper-parameters and defaults (no amsgrad)."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        _number("lr", self.lr)
        _number("eps", self.eps, positive=True)
        _number("weight_decay", self.weight_decay)
        b = self.betas
        if not isinstance(b, (tuple, list)) or len(b) != 2 or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1
                for v in b):
            raise OptionError("betas", f"must be two numbers in [0, 1), not {b!r}")
        object.__setattr__(self, "betas", (float(b[0]), float(b[1])))


@dataclass(frozen=True)
class AdamWConfig(AdamConfig):
    """``torch.optim.AdamW``'s: Adam's, with its decoupled weight decay of 1e-2."""

    weight_decay: float = 1e-2


@dataclass
class Optimizer:
    """Updates ``params`` in place. ``state[i]`` holds parameter i's named arrays
    (``STATE``), made at its first update as torch makes them; ``steps`` counts the steps
    taken; ``lr`` is the rate of the next step (a schedule sets it between steps, as torch's
    schedulers set a group's). ``fused(optimizer, i, p, g) -> bool``, when given, may do
    parameter i's update in one pass instead (spdnn.kernels.update.fused_update, the
    runtime's)."""

    name: ClassVar[str]
    STATE: ClassVar[tuple[str, ...]]
    Config: ClassVar[type]

    config: Any
    params: list[np.ndarray]
    state: list[dict[str, np.ndarray]] = field(default_factory=list)
    steps: int = 0
    fused: Callable[..., bool] | None = None

    def __post_init__(self) -> None:
        if not self.state:
            self.state = [{} for _ in self.params]
        self.lr: float = self.config.lr
        self._scratch: list[np.ndarray | None] = [None] * len(self.params)

    @classmethod
    def state_arrays(cls, config: Any) -> int:  # noqa: ANN401
        """Arrays of state per stored value (the memory model counts them)."""
        return len(cls.STATE)

    def step(self, grads: list[np.ndarray | RowGrad]) -> None:
        self.steps += 1
        for i, (p, g) in enumerate(zip(self.params, grads)):
            if self.fused is not None and self.fused(self, i, p, g):
                continue
            if isinstance(g, RowGrad):
                self._rows(i, p, g)
            else:
                self._dense(i, p, g)

    def resize(self, i: int, param: np.ndarray, source: np.ndarray) -> None:
        """Parameter i is now ``param`` (a topology update changed its entries): its state
        follows them, ``source[e]`` the old position of new entry e, -1 for a grown entry,
        whose state starts at zero; a dropped entry's state goes."""
        self.params[i] = param
        self._scratch[i] = None
        kept = source >= 0
        for name, old in self.state[i].items():
            new = np.zeros(param.shape, dtype=old.dtype)
            new[kept] = old[source[kept]]
            self.state[i][name] = new

    def forget_scratch(self, i: int) -> None:
        """Parameter i is a new array: its work array is made again at its next use."""
        self._scratch[i] = None

    def scratch(self, i: int) -> np.ndarray:
        """A work array the size of parameter i, made once (no allocation per step)."""
        s = self._scratch[i]
        if s is None:
            s = self._scratch[i] = np.empty_like(self.params[i])
        return s

    def _dense(self, i: int, p: np.ndarray, g: np.ndarray) -> None:
        raise NotImplementedError

    def _rows(self, i: int, p: np.ndarray, g: RowGrad) -> None:
        raise NotImplementedError


@dataclass
class SGD(Optimizer):
    """``torch.optim.SGD``: d = g + wd p; buf = d at the first step, else m buf + d;
    Nesterov takes d + m buf, plain momentum buf; p -= lr d."""

    name: ClassVar[str] = "sgd"
    STATE: ClassVar[tuple[str, ...]] = ("momentum_buffer",)
    Config: ClassVar[type] = SGDConfig

    @classmethod
    def state_arrays(cls, config: Any) -> int:  # noqa: ANN401
        return 1 if config.momentum else 0

    def _dense(self, i: int, p: np.ndarray, g: np.ndarray) -> None:
        c = self.config
        d = self.scratch(i)
        if c.weight_decay:
            np.multiply(p, c.weight_decay, out=d)
            d += g
        else:
            np.copyto(d, g)
        if c.momentum:
            buf = self.state[i].get("momentum_buffer")
            if buf is None:
                buf = self.state[i]["momentum_buffer"] = d.copy()  # torch: the gradient
            else:
                buf *= c.momentum
                buf += d
            if c.nesterov:
                d += buf * c.momentum
            else:
                np.copyto(d, buf)
        d *= self.lr
        p -= d

    def _rows(self, i: int, p: np.ndarray, g: RowGrad) -> None:
        """The update on the entries of ``g`` alone; a buffer starts at zero, so an entry's
        first update uses its gradient as torch's first step does."""
        c = self.config
        idx = g.entries()
        d = g.values.astype(p.dtype, copy=True)
        if c.weight_decay:
            d = p[idx] * c.weight_decay + d
        if c.momentum:
            buf = self.state[i].get("momentum_buffer")
            if buf is None:
                buf = self.state[i]["momentum_buffer"] = np.zeros_like(p)
            b = buf[idx] * c.momentum + d
            buf[idx] = b
            d = d + b * c.momentum if c.nesterov else b
        p[idx] -= d * self.lr


@dataclass
class Adam(Optimizer):
    """``torch.optim.Adam`` (its single-tensor form): g += wd p; m = lerp(m, g, 1 - b1);
    v = b2 v + (1 - b2) g^2; p -= (lr / c1) m / (sqrt(v) / sqrt(c2) + eps), with
    c1 = 1 - b1^t, c2 = 1 - b2^t. Rows of a RowGrad (LSH) are updated lazily, as
    ``torch.optim.SparseAdam`` updates a sparse gradient (it has no weight decay)."""

    name: ClassVar[str] = "adam"
    STATE: ClassVar[tuple[str, ...]] = ("exp_avg", "exp_avg_sq")
    Config: ClassVar[type] = AdamConfig
    decoupled: ClassVar[bool] = False  # AdamW: p *= 1 - lr wd, and no g += wd p

    def moments(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        s = self.state[i]
        if not s:
            s["exp_avg"], s["exp_avg_sq"] = (np.zeros_like(self.params[i]) for _ in range(2))
        return s["exp_avg"], s["exp_avg_sq"]

    def scalars(self) -> tuple[float, float]:
        """This step's -lr / c1 and sqrt(c2), as torch computes them (Python floats)."""
        c = self.config
        b1, b2 = c.betas
        return -(self.lr / (1 - b1 ** self.steps)), (1 - b2 ** self.steps) ** 0.5

    def _dense(self, i: int, p: np.ndarray, g: np.ndarray) -> None:
        c = self.config
        b1, b2 = c.betas
        m, v = self.moments(i)
        d = self.scratch(i)
        if c.weight_decay and self.decoupled:
            p *= 1 - self.lr * c.weight_decay
        if c.weight_decay and not self.decoupled:
            np.multiply(p, c.weight_decay, out=d)
            d += g
            g = d
        # torch's lerp: m + w (g - m) for a weight below 0.5, else g - (g - m) (1 - w)
        w = 1 - b1
        diff = np.subtract(g, m)
        if abs(w) < 0.5:
            diff *= w
            m += diff
        else:
            diff *= 1 - w
            np.subtract(g, diff, out=m)
        v *= b2
        v += (1 - b2) * g * g
        step, root = self.scalars()
        np.sqrt(v, out=d)
        d /= root
        d += c.eps
        np.divide(step * m, d, out=d)
        p += d

    def _rows(self, i: int, p: np.ndarray, g: RowGrad) -> None:
        """``torch.optim.SparseAdam`` on the entries of ``g``: m += (g - m)(1 - b1),
        v += (g^2 - v)(1 - b2), p -= lr sqrt(c2) / c1 * m / (sqrt(v) + eps)."""
        c = self.config
        b1, b2 = c.betas
        m, v = self.moments(i)
        idx = g.entries()
        if not len(idx):
            return
        grad = g.values.astype(p.dtype, copy=False)
        old_m, old_v = m[idx], v[idx]
        dm = (grad - old_m) * (1 - b1)
        dv = (grad ** 2 - old_v) * (1 - b2)
        m[idx] = old_m + dm
        v[idx] = old_v + dv
        numer = dm + old_m
        denom = np.sqrt(dv + old_v) + c.eps
        size = self.lr * math.sqrt(1 - b2 ** self.steps) / (1 - b1 ** self.steps)
        p[idx] += -size * (numer / denom)


@dataclass
class AdamW(Adam):
    """``torch.optim.AdamW``: Adam with decoupled weight decay, p *= 1 - lr wd before the
    step, in place of g += wd p."""

    name: ClassVar[str] = "adamw"
    Config: ClassVar[type] = AdamWConfig
    decoupled: ClassVar[bool] = True


OPTIMIZERS: dict[str, type[Optimizer]] = {cls.name: cls for cls in (SGD, Adam, AdamW)}


def optimizer_class(name: str) -> type[Optimizer]:
    if name not in OPTIMIZERS:
        raise OptionError("optimizer", f"must be one of {', '.join(OPTIMIZERS)}, not {name!r}")
    return OPTIMIZERS[name]


def config_of(name: str, **given: Any) -> Any:  # noqa: ANN401
    """The named optimizer's config from the hyper-parameters ``given`` (None: its default);
    one it does not take is refused by name."""
    cls = optimizer_class(name)
    known = {f.name for f in fields(cls.Config)}
    for key, value in given.items():
        if value is not None and key not in known:
            takers = [n for n, c in OPTIMIZERS.items()
                      if key in {f.name for f in fields(c.Config)}]
            raise OptionError(key, f"is not a setting of {name} (it applies to "
                                   f"{' and '.join(takers)})")
    return cls.Config(**{k: v for k, v in given.items() if v is not None and k in known})


def name_of(config: Any) -> str:  # noqa: ANN401
    """The optimizer whose config this is."""
    return next(n for n, c in OPTIMIZERS.items() if type(config) is c.Config)


def make(config: Any, params: list[np.ndarray],  # noqa: ANN401
         saved: SavedState | None = None, fused: Callable[..., bool] | None = None
         ) -> Optimizer:
    """The optimizer of ``config`` over ``params``, resuming from ``saved`` (its state by
    name and its step count) when given."""
    cls = OPTIMIZERS[name_of(config)]
    if saved is None or saved.name != cls.name:
        return cls(config, params, fused=fused)
    return cls(config, params, [dict(s) for s in saved.state], saved.steps, fused=fused)


def state_arrays(config: Any) -> int:  # noqa: ANN401
    """Arrays of optimizer state per stored value under ``config`` (the memory model's)."""
    return OPTIMIZERS[name_of(config)].state_arrays(config)


def settings(config: Any) -> dict[str, Any]:  # noqa: ANN401
    """The optimizer's name and hyper-parameters, as a checkpoint records them."""
    return {"optimizer": name_of(config),
            **{k: list(v) if isinstance(v, tuple) else v for k, v in asdict(config).items()}}


def describe(config: Any) -> str:  # noqa: ANN401
    """``adam (lr 0.001, betas 0.9,0.999, eps 1e-08, weight decay 0)``: for a job's first
    line."""
    parts = [k.replace("_", " ") if v is True else
             f"{k.replace('_', ' ')} {','.join(f'{x:g}' for x in v) if isinstance(v, tuple) else v}"
             for k, v in asdict(config).items() if v is not False]
    return f"{name_of(config)} ({', '.join(parts)})"


@dataclass(frozen=True)
class SavedState:
    """An optimizer's state as a checkpoint holds it: per parameter its arrays by name."""

    name: str
    steps: int
    state: list[dict[str, np.ndarray]]

    @classmethod
    def of(cls, opt: Optimizer) -> SavedState:
        return cls(opt.name, opt.steps, opt.state)
