"""The sparse network model shared by every part of spdnn.

Column convention (docs/formats.md): layer k maps X_{k-1} (n_{k-1} x B) to
X_k = h(W_k X_{k-1} + b_k), W_k is CSR with one row per output neuron.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import scipy.sparse as sp

from spdnn.errors import InputError, OptionError
from spdnn.model.activations import OUTPUTS, Activation, output_of, parse, parse_list
from spdnn.model.csr import as_dtype, cast_values, check_csr
from spdnn.model.fingerprint import fingerprint_of

OUTPUT_ACTIVATIONS = tuple(OUTPUTS)


@dataclass(frozen=True)
class Layer:
    """One layer: W (n_out x n_in, CSR) and bias b (n_out). ``pruned``: the values a pruned
    torch module holds outside the pattern (``weight_orig`` where ``weight_mask`` is 0, in
    row-major order), kept from where they were read to where they are written (a bundle, a
    module, a safetensors file); spdnn computes nothing with them, and its training does not
    carry them."""

    weight: sp.csr_matrix
    bias: np.ndarray
    pruned: np.ndarray | None = None

    def outside(self) -> np.ndarray:
        """The dense mask of the positions outside the pattern (stored zeros are inside)."""
        mask = np.ones(self.weight.shape, dtype=bool)
        coo = self.weight.tocoo()
        mask[coo.row, coo.col] = False
        return mask

    def check_pruned(self, source: str, what: str) -> None:
        """``pruned`` holds one finite float per position outside the pattern."""
        p = self.pruned
        if p is None:
            return
        n = self.n_out * self.n_in - self.nnz
        if p.ndim != 1 or len(p) != n or not np.issubdtype(p.dtype, np.floating):
            raise InputError(source, f"{what}: pruned values must be {n} floats (one per "
                             "position outside the pattern)")
        if not np.all(np.isfinite(p)):
            raise InputError(source, f"{what}: non-finite pruned value")

    @property
    def n_out(self) -> int:
        return int(self.weight.shape[0])

    @property
    def n_in(self) -> int:
        return int(self.weight.shape[1])

    @property
    def nnz(self) -> int:
        return int(self.weight.nnz)

    @staticmethod
    def from_arrays(
        indptr: np.ndarray,
        indices: np.ndarray,
        data: np.ndarray,
        shape: Sequence[int],
        bias: np.ndarray,
        source: str = "network",
        what: str = "layer",
        dtype: Any = None,
        min_rows: int = 1,
    ) -> Layer:
        """Build a validated layer from raw CSR arrays (as stored in a bundle)."""
        shape_t = (int(shape[0]), int(shape[1]))
        check_csr(indptr, indices, data, shape_t, source, what, min_rows)
        bias = np.asarray(bias)
        if bias.shape != (shape_t[0],):
            raise InputError(source,
                             f"{what}: bias has shape {bias.shape}, expected ({shape_t[0]},)")
        if not np.issubdtype(bias.dtype, np.floating) or not np.all(np.isfinite(bias)):
            raise InputError(source, f"{what}: bias must be finite floating point values")
        # Stored in another floating type (float16, as train and infer read it): float32
        # unless asked, on every path alike (spdnn-partition too).
        own = data.dtype if data.dtype in (np.float32, np.float64) else np.float32
        dt = as_dtype(dtype if dtype is not None else own)
        # Keep int32 indices where they fit: scipy's kernels are fastest on them.
        itype = np.int32 if len(indices) < 2**31 and shape_t[1] < 2**31 else np.int64
        values = cast_values(data, dt, source, what)
        bias = cast_values(bias, dt, source, f"{what} bias")
        w = sp.csr_matrix(
            (values, indices.astype(itype, copy=False), indptr.astype(itype, copy=False)),
            shape=shape_t,
        )
        return Layer(w, bias)


@dataclass(frozen=True, kw_only=True)
class Network:
    """An ordered list of sparse layers plus the activation settings.

    ``activations``: one per hidden layer (spdnn.model.activations; empty: ReLU on every one),
    ReLU capped at ``cap`` when given; ``output_activation`` is "linear" (a softmax/MSE head)
    or "relu" (ReLU and the cap on the last layer too, as in the Graph Challenge). ``extra``
    holds further metadata.
    """

    layers: tuple[Layer, ...]
    activations: tuple[str, ...] = ()
    cap: float | None = None
    output_activation: Literal["linear", "relu"] = "linear"
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        acts = tuple(parse(a).spec for a in self.activations)
        if not acts and self.layers:
            acts = ("relu",) * (len(self.layers) - 1)
        object.__setattr__(self, "activations", acts)

    @property
    def output_function(self) -> Activation:
        """The output layer's activation (its ``output_activation``, with the cap)."""
        return output_of(self.output_activation, self.cap)

    def hidden(self, k: int) -> Activation:
        """The activation of hidden layer k (1-based, k < n_layers), with the network's cap."""
        return parse(self.activations[k - 1], self.cap)

    def with_activations(self, specs: str | Sequence[str]) -> Network:
        """The same layers with these hidden activations: one for all, or one per hidden layer
        (a list, or comma-separated); OptionError ``activations`` otherwise."""
        try:
            acts = parse_list(specs, self.n_layers - 1, self.cap)
        except ValueError as exc:
            text = specs if isinstance(specs, str) else ",".join(map(str, specs))
            raise OptionError("activations", f"{text}: {exc}") from None
        return replace(self, activations=tuple(a.spec for a in acts))

    def truncated(self, count: int) -> Network:
        """The first ``count`` layers, with their activations."""
        return replace(self, layers=self.layers[:count],
                       activations=self.activations[:max(count - 1, 0)])

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def sizes(self) -> tuple[int, ...]:
        """Neuron counts n_0..n_L."""
        return (self.layers[0].n_in, *(layer.n_out for layer in self.layers))

    @property
    def dtype(self) -> np.dtype:
        return self.layers[0].weight.dtype

    @property
    def nnz(self) -> int:
        return sum(layer.nnz for layer in self.layers)

    def meta(self) -> dict[str, Any]:
        """The JSON-able metadata stored in a bundle's ``meta`` key."""
        return {
            **self.extra,
            "activations": list(self.activations),
            "cap": self.cap,
            "output_activation": self.output_activation,
        }

    def validate(self, source: str = "network") -> Network:
        """Check shapes chain, indices are sorted, unique and in range, values finite."""
        validate_meta(self.meta(), source)
        if not self.layers:
            raise InputError(source, "network has no layers")
        if len(self.activations) != self.n_layers - 1:
            raise InputError(source, f"{len(self.activations)} activations for "
                             f"{self.n_layers - 1} hidden layers")
        for k, layer in enumerate(self.layers, start=1):
            w = layer.weight
            if not sp.isspmatrix_csr(w) and not isinstance(w, sp.csr_array):
                raise InputError(source, f"layer {k}: weight is not CSR")
            Layer.from_arrays(w.indptr, w.indices, w.data, w.shape, layer.bias, source,
                              f"layer {k}")
            layer.check_pruned(source, f"layer {k}")
            if k > 1 and layer.n_in != self.layers[k - 2].n_out:
                raise InputError(
                    source,
                    f"layer {k} has {layer.n_in} inputs but layer {k - 1} has "
                    f"{self.layers[k - 2].n_out} outputs: shapes do not chain",
                )
        return self

    def astype(self, dtype: Any) -> Network:
        dt = as_dtype(dtype)
        if dt == self.dtype:
            return self
        layers = [Layer(lay.weight.astype(dt), lay.bias.astype(dt),
                        None if lay.pruned is None else lay.pruned.astype(dt))
                  for lay in self.layers]
        return replace(self, layers=tuple(layers))

    def copy(self) -> Network:
        layers = [Layer(lay.weight.copy(), lay.bias.copy(),
                        None if lay.pruned is None else lay.pruned.copy())
                  for lay in self.layers]
        return replace(self, layers=tuple(layers), extra=dict(self.extra))

    def fingerprint(self) -> str:
        return fingerprint_of(
            self.sizes, ((lay.weight.indptr, lay.weight.indices) for lay in self.layers)
        )


def validate_meta(meta: dict[str, Any], source: str, n_layers: int | None = None) -> None:
    """The activation settings of a bundle's meta: ``activations`` (a list, one per hidden
    layer, of ``n_layers - 1`` when given), or format 1's ``activation`` "relu"."""
    if "activations" in meta:
        acts = meta["activations"]
        if not isinstance(acts, list):
            raise InputError(source, "meta: activations must be a list, one per hidden layer")
        for a in acts:
            try:
                parse(a)
            except ValueError as exc:
                raise InputError(source, f"meta: {exc}") from None
        if n_layers is not None and len(acts) != max(n_layers - 1, 0):
            raise InputError(source, f"meta: {len(acts)} activations for {n_layers - 1} "
                             "hidden layers")
    elif meta.get("activation") != "relu":
        raise InputError(source, "meta: no activations (one per hidden layer) and no "
                         "format-1 activation \"relu\"")
    cap = meta.get("cap")
    if cap is not None and (not isinstance(cap, (int, float)) or not np.isfinite(cap) or cap <= 0):
        raise InputError(source, "meta: cap must be null or a positive number")
    if meta.get("output_activation") not in OUTPUT_ACTIVATIONS:
        raise InputError(source, f"meta: output_activation must be one of {OUTPUT_ACTIVATIONS}")


def activations_of(meta: dict[str, Any], n_layers: int) -> tuple[Activation, ...]:
    """The hidden layers' activations a validated meta gives (format 1: ReLU), with its cap."""
    specs = meta.get("activations", ["relu"] * (n_layers - 1))
    return tuple(parse(a, meta.get("cap")) for a in specs)
