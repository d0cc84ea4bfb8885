"""PyTorch models in and out: ``from_torch`` reads an ``nn.Sequential`` of ``nn.Linear`` layers
and the activations spdnn computes (its sparsity from ``torch.nn.utils.prune`` masks, else the
weights' nonzeros; its dtype kept), ``to_torch`` gives the network back as one, with prune masks
in place, ready to fine-tune. Anything else is refused by name, never approximated.

torch is an optional extra (``pip install spdnn[torch]``), imported only here and only when
called.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from spdnn.errors import SpdnnError
from spdnn.model.activations import BY_NAME, parse
from spdnn.model.network import Layer, Network

SUPPORTED = ("Linear", "ReLU", "Hardtanh(0, cap) (capped ReLU)", "LeakyReLU", "Tanh",
             "Sigmoid", "GELU", "Dropout", "Identity", "a leading Flatten")


def _torch() -> Any:  # noqa: ANN401
    try:
        import torch
    except ImportError:
        raise SpdnnError("spdnn.from_torch and spdnn.to_torch need PyTorch: pip install "
                         "spdnn[torch] (or torch itself)") from None
    return torch


def _children(module: Any) -> list[tuple[str, Any]]:  # noqa: ANN401
    torch = _torch()
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, not {type(module).__name__}")
    if isinstance(module, (torch.nn.Linear, torch.nn.ReLU)):
        return [("0", module)]
    return list(module.named_children())


def _activation_of(name: str, m: Any) -> tuple[str, float | None] | None:  # noqa: ANN401
    """The activation (spdnn.model.activations) a torch module computes and ReLU's cap, or
    None when it is no activation."""
    nn = _torch().nn
    if isinstance(m, nn.Hardtanh) and not (m.min_val == 0 and m.max_val > 0):
        _refuse(name, m, "a Hardtanh is taken as capped ReLU, Hardtanh(0, cap)")
    for cls in BY_NAME.values():
        act = cls.of_torch(m, nn)
        if act is not None:
            return act.spec, act.cap
    return None


def _module_of(spec: str, cap: float | None) -> Any:  # noqa: ANN401
    """The torch module that computes activation ``spec`` (its class's ``torch``)."""
    return parse(spec, cap).torch(_torch().nn)


def _refuse(name: str, m: Any, why: str | None = None) -> None:  # noqa: ANN401
    raise SpdnnError(f"module '{name}' ({type(m).__name__}) is not supported: "
                     + (why or f"spdnn takes {', '.join(SUPPORTED)}"))


def from_torch(module: Any, *, dtype: Any = None) -> Network:  # noqa: ANN401
    """The network of ``module``: an ``nn.Sequential`` (or a module whose children form one)
    of Linear layers, each but the last followed by one activation (ReLU or Hardtanh(0, cap),
    one cap for all; LeakyReLU, Tanh, Sigmoid, GELU; none: identity), with Dropout and
    Identity passed over and a leading Flatten; the last Linear may be followed by ReLU
    (``output_activation="relu"``). A pruned weight's pattern is its mask; otherwise its
    nonzeros. ``dtype``: default the module's."""
    torch = _torch()
    kids = _children(module)
    linears: list[tuple[str, Any]] = []
    after: list[list[tuple[str, tuple[str, float | None]]]] = []
    for i, (name, m) in enumerate(kids):
        if isinstance(m, (torch.nn.Dropout, torch.nn.Identity)):
            continue
        if isinstance(m, torch.nn.Flatten) and not linears and i == 0:
            continue
        if isinstance(m, torch.nn.Linear):
            linears.append((name, m))
            after.append([])
            continue
        act = _activation_of(name, m) if linears else None
        if act is None:
            _refuse(name, m)
        if after[-1]:
            _refuse(name, m, "one activation follows each Linear")
        after[-1].append((name, act))
    if not linears:
        raise SpdnnError("the module holds no nn.Linear layer")
    if after[-1] and after[-1][0][1][0] != "relu":
        raise SpdnnError(f"module '{after[-1][0][0]}' follows the last Linear: the output "
                         "layer is linear (the loss takes the softmax) or ReLU")
    caps = {act[1] for acts in after for _, act in acts if act[0] == "relu"}
    activations = tuple(acts[0][1][0] if acts else "identity" for acts in after[:-1])
    if len(caps) > 1:
        raise SpdnnError(f"the activations have different caps ({sorted(map(str, caps))}): "
                         "spdnn's layers share one")
    cap = caps.pop() if caps else None
    layers = []
    for name, lin in linears:
        weight = (lin.weight_orig if hasattr(lin, "weight_orig") else lin.weight).detach()
        values = weight.cpu().numpy()
        keep = lin.weight_mask.detach().cpu().numpy() != 0 if hasattr(lin, "weight_mask") \
            else values != 0
        dt = np.dtype(dtype) if dtype is not None else values.dtype
        rows, cols = np.nonzero(keep)
        w = sp.csr_matrix((values[rows, cols].astype(np.float64), (rows, cols)),
                          shape=values.shape)
        w.sort_indices()
        bias = lin.bias.detach().cpu().numpy().astype(np.float64) if lin.bias is not None \
            else np.zeros(values.shape[0])
        layer = Layer.from_arrays(w.indptr, w.indices, w.data, w.shape, bias, "the module",
                                  f"layer '{name}'", dt, min_rows=1)
        if hasattr(lin, "weight_mask"):  # weight_orig's values outside the mask, kept
            layer = Layer(layer.weight, layer.bias, values[~keep].astype(layer.weight.dtype))
        layers.append(layer)
    for k in range(1, len(layers)):
        if layers[k].n_in != layers[k - 1].n_out:
            raise SpdnnError(f"module '{linears[k][0]}' takes {layers[k].n_in} inputs but "
                             f"'{linears[k - 1][0]}' gives {layers[k - 1].n_out}")
    net = Network(layers=tuple(layers), activations=activations, cap=cap,
                  output_activation="relu" if after[-1] else "linear",
                  extra={"safetensors": {"names": [n for n, _ in linears], "pruned": True}})
    net.validate("the module")
    return net


def to_torch(network: Network) -> Any:  # noqa: ANN401
    """``network`` as an ``nn.Sequential`` of Linear and its activations (ReLU as
    Hardtanh(0, cap) when capped) in its dtype, every weight pruned to its pattern
    (``torch.nn.utils.prune``: weight_orig and weight_mask; weight_orig's values outside the
    mask as they were read, when they were), ready to fine-tune or to ``prune.remove``."""
    torch = _torch()
    from torch.nn.utils import prune

    if not isinstance(network, Network):
        raise TypeError(f"network must be a spdnn.Network, not {type(network).__name__}")
    dt = torch.float64 if network.dtype == np.float64 else torch.float32

    mods: list[Any] = []
    for k, layer in enumerate(network.layers):
        lin = torch.nn.Linear(layer.n_in, layer.n_out, dtype=dt)
        dense = layer.weight.toarray()
        mask = ~layer.outside()  # the pattern, stored zeros included
        if layer.pruned is not None:  # weight_orig as it was read
            dense[~mask] = layer.pruned
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(dense))
            lin.bias.copy_(torch.from_numpy(np.asarray(layer.bias, dtype=np.float64)))
        prune.custom_from_mask(lin, "weight", torch.from_numpy(mask))
        mods.append(lin)
        if k < network.n_layers - 1:
            mods.append(_module_of(network.activations[k], network.cap))
        elif not network.output_function.LINEAR:
            mods.append(network.output_function.torch(_torch().nn))
    return torch.nn.Sequential(*mods)
