"""The optimizers, with ``torch.optim``'s semantics on a flat list of parameter arrays.

An optimizer is one module here: its settings (its ``Config``, each declared once with
spdnn.schema.option: the flags, keywords, checks and checkpoint fields come from there), its
named state per stored value (``STATE``, checkpointed by those names), its update in numpy, a
fused kernel where it has one and the torch.optim class it equals. Both engines use them: the
serial reference on whole layers, the runtime on each rank's rows. Adding one is its module
and a line in ``OPTIMIZERS`` below (docs/architecture.md).

Weight decay applies to every parameter, biases included (one torch parameter group), and every
stored value is updated every step, as torch updates a masked dense parameter.
"""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

import numpy as np

from spdnn.errors import OptionError
from spdnn.optim.adagrad import Adagrad, AdagradConfig
from spdnn.optim.adam import Adam, AdamConfig, AdamW, AdamWConfig
from spdnn.optim.optimizer import (
    Optimizer,
    Parallel,
    RowGrad,
    SavedState,
    interleave,
    parameters,
)
from spdnn.optim.rmsprop import RMSprop, RMSpropConfig
from spdnn.optim.sgd import SGD, SGDConfig
from spdnn.schema import Option, options

OPTIMIZERS: dict[str, type[Optimizer]] = {cls.name: cls for cls in (SGD, Adam, AdamW,
                                                                     RMSprop, Adagrad)}

__all__ = ["Adagrad", "AdagradConfig", "Adam", "AdamConfig", "AdamW", "AdamWConfig", "OPTIMIZERS",
           "Optimizer", "RMSprop", "RMSpropConfig", "RowGrad", "SGD", "SGDConfig", "SavedState",
           "config_of", "describe", "interleave", "load_kernels", "make", "name_of",
           "optimizer_class", "parameters", "setting_options", "settings", "state_arrays",
           "torch_optimizer"]


def optimizer_class(name: str) -> type[Optimizer]:
    if name not in OPTIMIZERS:
        raise OptionError("optimizer", f"must be one of {', '.join(OPTIMIZERS)}, not {name!r}")
    return OPTIMIZERS[name]


def setting_options() -> dict[str, tuple[Option, dict[str, Any]]]:
    """Every optimizer's settings by name: the first declaration of each (its help and
    check), and each optimizer's default for it."""
    out: dict[str, tuple[Option, dict[str, Any]]] = {}
    for name, cls in OPTIMIZERS.items():
        for key, declared in options(cls.Config).items():
            first, defaults = out.setdefault(key, (declared, {}))
            defaults[name] = declared.default
    return out


def config_of(name: str, **given: Any) -> Any:  # noqa: ANN401
    """The named optimizer's config from the settings ``given`` (None: its default); one it
    does not take is refused by name."""
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
         saved: SavedState | None = None, parallel: Parallel | None = None) -> Optimizer:
    """The optimizer of ``config`` over ``params``, resuming from ``saved`` (its state by
    name and its step count) when given; ``parallel``: where its fused kernels may run
    (spdnn.kernels.update.PARALLEL)."""
    cls = OPTIMIZERS[name_of(config)]
    if saved is None or saved.name != cls.name:
        return cls(config, params, parallel=parallel)
    return cls(config, params, [dict(s) for s in saved.state], saved.steps, parallel=parallel)


def state_arrays(config: Any) -> int:  # noqa: ANN401
    """Arrays of optimizer state per stored value under ``config`` (the memory model's)."""
    return OPTIMIZERS[name_of(config)].state_arrays(config)


def settings(config: Any) -> dict[str, Any]:  # noqa: ANN401
    """The optimizer's name and settings, as a checkpoint records them."""
    return {"optimizer": name_of(config),
            **{k: list(v) if isinstance(v, tuple) else v for k, v in asdict(config).items()}}


def describe(config: Any) -> str:  # noqa: ANN401
    """``adam (lr 0.001, betas 0.9,0.999, eps 1e-08, weight decay 0)``: for a job's first
    line."""
    parts = [k.replace("_", " ") if v is True else
             f"{k.replace('_', ' ')} {','.join(f'{x:g}' for x in v) if isinstance(v, tuple) else v}"
             for k, v in asdict(config).items() if v is not False]
    return f"{name_of(config)} ({', '.join(parts)})"


def load_kernels(names: tuple[str, ...], dtypes: tuple[type, ...], *, rows: bool = False,
                 parallel: Any = None) -> None:  # noqa: ANN401
    """Load (or compile) the fused kernels of the optimizers ``names`` for ``dtypes`` now,
    where ``parallel`` runs them (with ``rows``, SGD's of row gradients too): a job loads
    them with its others, not inside its first timed step."""
    if parallel is None or not parallel.loads():
        return
    for dt in dtypes:
        for name in names:
            OPTIMIZERS[name].warm_up(dt)
        if rows:
            SGD.warm_up(dt, rows=True)


def torch_optimizer(config: Any, params: Any) -> Any:  # noqa: ANN401
    """The ``torch.optim`` optimizer that ``config`` equals, over torch ``params``."""
    import torch

    cls = OPTIMIZERS[name_of(config)]
    return getattr(torch.optim, cls.TORCH)(params, **cls.torch_settings(config))
