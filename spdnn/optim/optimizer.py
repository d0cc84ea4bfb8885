"""What every optimizer shares: the ``Optimizer`` base (settings, named state per parameter,
``step``), row gradients (``RowGrad``) and saved state (``SavedState``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np


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


class Parallel(Protocol):
    """Where an optimizer's fused kernel may run (spdnn.kernels.update.PARALLEL): whether the
    numba backend takes these arrays, and its threads made ready."""

    def applies(self, *arrays: np.ndarray) -> bool: ...

    def ready(self) -> None: ...

    def loads(self) -> bool: ...


@dataclass
class Optimizer:
    """Updates ``params`` in place. ``state[i]`` holds parameter i's named arrays
    (``STATE``), made at its first update as torch makes them; ``steps`` counts the steps
    taken; ``lr`` is the rate of the next step (a schedule sets it between steps, as torch's
    schedulers set a group's). With ``parallel``, an optimizer that has a fused kernel
    (``fused``) runs a parameter's update in one pass over the kernel threads where it
    applies, with the bits of its numpy form.

    A subclass is one optimizer: ``name``, its ``Config`` (settings declared with
    spdnn.schema.option), ``STATE``, ``TORCH`` (the torch.optim class it equals), its numpy
    update (``_dense``, and ``_rows`` for a RowGrad)."""

    name: ClassVar[str]
    STATE: ClassVar[tuple[str, ...]]
    Config: ClassVar[type]
    TORCH: ClassVar[str]

    config: Any
    params: list[np.ndarray]
    state: list[dict[str, np.ndarray]] = field(default_factory=list)
    steps: int = 0
    parallel: Parallel | None = None

    def __post_init__(self) -> None:
        if not self.state:
            self.state = [{} for _ in self.params]
        self.lr: float = self.config.lr
        self._scratch: list[np.ndarray | None] = [None] * len(self.params)

    @classmethod
    def state_arrays(cls, config: Any) -> int:  # noqa: ANN401
        """Arrays of state per stored value (the memory model counts them)."""
        return len(cls.STATE)

    @classmethod
    def kept_state(cls, settings: dict[str, Any]) -> set[str]:
        """The state arrays it keeps once it has stepped, under the recorded ``settings``
        (a checkpoint's state must be these)."""
        return set(cls.STATE)

    @classmethod
    def rows_refusal(cls, config: Any) -> str | None:  # noqa: ANN401
        """Why it cannot update sampled rows alone (--lsh) under ``config``; None when it
        can (``_rows``)."""
        return "it has no update of sampled rows"

    def fresh(self, name: str) -> float:
        """The value its state array ``name`` starts at (a grown weight's too)."""
        return 0.0

    @classmethod
    def torch_settings(cls, config: Any) -> dict[str, Any]:  # noqa: ANN401
        """The keywords of torch.optim's ``TORCH`` that mean ``config``."""
        return asdict(config)

    @classmethod
    def warm_up(cls, dtype: type, rows: bool = False) -> None:  # noqa: B027
        """Load its fused kernels for ``dtype`` (numba backend), if it has any."""

    def step(self, grads: list[np.ndarray | RowGrad]) -> None:
        self.steps += 1
        for i, (p, g) in enumerate(zip(self.params, grads)):
            if self.parallel is not None and self.fused(i, p, g):
                continue
            if isinstance(g, RowGrad):
                self._rows(i, p, g)
            else:
                self._dense(i, p, g)

    def fused(self, i: int, p: np.ndarray, g: np.ndarray | RowGrad) -> bool:
        """Parameter i's update in one pass, when this optimizer has a kernel for it and
        ``parallel`` applies; False otherwise (the numpy form runs: the same bits)."""
        return False

    def resize(self, i: int, param: np.ndarray, source: np.ndarray) -> None:
        """Parameter i is now ``param`` (a topology update changed its entries): its state
        follows them, ``source[e]`` the old position of new entry e, -1 for a grown entry,
        whose state starts afresh (``fresh``); a dropped entry's state goes."""
        self.params[i] = param
        self._scratch[i] = None
        kept = source >= 0
        for name, old in self.state[i].items():
            new = np.full(param.shape, self.fresh(name), dtype=old.dtype)
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
        """Lazily, the entries of ``g`` alone: an optimizer without a sparse form refuses."""
        raise NotImplementedError(f"{self.name} has no update of sampled rows (--lsh)")


@dataclass(frozen=True)
class SavedState:
    """An optimizer's state as a checkpoint holds it: per parameter its arrays by name."""

    name: str
    steps: int
    state: list[dict[str, np.ndarray]]

    @classmethod
    def of(cls, opt: Optimizer) -> SavedState:
        return cls(opt.name, opt.steps, opt.state)
