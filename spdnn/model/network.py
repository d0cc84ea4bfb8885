"""The sparse network model shared by every part of spdnn.

Column convention (docs/formats.md): layer k maps X_{k-1} (n_{k-1} x B) to
X_k = h(W_k X_{k-1} + b_k), W_k is CSR with one row per output neuron.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import scipy.sparse as sp

from spdnn.errors import InputError, OptionError
from spdnn.model.activations import Activation, parse, parse_list
from spdnn.model.choices import DTYPE_NAMES

OUTPUT_ACTIVATIONS = ("linear", "relu")
DTYPES = dict(zip(DTYPE_NAMES, (np.float32, np.float64)))


def as_dtype(dtype: Any) -> np.dtype:
    """Normalise a dtype name or object to float32/float64, refusing anything else."""
    dt = np.dtype(DTYPES.get(dtype, dtype) if isinstance(dtype, str) else dtype)
    if dt not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, not {dt}")
    return dt


def cast_values(values: np.ndarray, dtype: Any, source: str, what: str) -> np.ndarray:
    """Values as ``dtype`` (float32 or float64), refused in one line naming ``source`` and
    ``what`` when they are not finite real numbers or pass the type's range (1e39 in float32
    is inf): the one cast of every array of values spdnn reads (layers, data, images)."""
    dt = as_dtype(dtype)
    if values.dtype.kind not in "biuf":
        raise InputError(source, f"{what} must hold real numbers, not {values.dtype}")
    if values.dtype.kind == "f" and not np.all(np.isfinite(values)):
        raise InputError(source, f"{what}: non-finite value (NaN or Inf)")
    with np.errstate(over="ignore"):
        cast = values.astype(dt, copy=False)
    if cast is not values and not np.all(np.isfinite(cast)):
        raise InputError(source, f"{what}: values beyond the {dt} range (use float64)")
    return cast


# Entries checked per block (bounds the int64 temporaries of a check to 8 MB).
CHECK_BLOCK = 1 << 20


def check_indptr(indptr: np.ndarray, n_rows: int, nnz: int, source: str, what: str
                 ) -> np.ndarray:
    """Row pointers of a CSR matrix: 1-D integers, n_rows + 1 of them, from 0 to nnz, never
    decreasing (checked before anything is sized or sliced by them). Returns them as int64:
    differences of unsigned or narrow integers wrap (a decreasing uint64 pointer has a huge
    positive difference), so they are compared only after the cast."""
    if indptr.ndim != 1 or not np.issubdtype(indptr.dtype, np.integer):
        raise InputError(source, f"{what}: indptr must be a 1-D integer array")
    if len(indptr) != n_rows + 1:
        raise InputError(source, f"{what}: indptr has length {len(indptr)}, expected {n_rows + 1}")
    if indptr.dtype.kind == "u" and len(indptr) and int(indptr.max()) >= 2**63:
        raise InputError(source, f"{what}: indptr holds values beyond 2**63")
    indptr = indptr.astype(np.int64, copy=False)
    if indptr[0] != 0 or indptr[-1] != nnz:
        raise InputError(source, f"{what}: indptr, indices and data lengths do not agree")
    if np.any(np.diff(indptr) < 0):
        raise InputError(source, f"{what}: indptr is not non-decreasing")
    return indptr


def check_pattern(
    indptr: np.ndarray,
    indices: np.ndarray,
    shape: tuple[int, int],
    source: str,
    what: str,
    min_rows: int = 1,
) -> np.ndarray:
    """Validate a CSR sparsity pattern: chained pointers, sorted unique in-range indices.
    ``min_rows=0`` accepts the empty slice a rank may own of a layer. Returns the pointers as
    int64 (``check_indptr``)."""
    n_rows, n_cols = shape
    if n_rows < min_rows or n_cols < 1:
        raise InputError(source, f"{what}: shape {shape} must be positive")
    if indices.ndim != 1:
        raise InputError(source, f"{what}: indices must be a 1-D array, not {indices.shape}")
    if not np.issubdtype(indices.dtype, np.integer):
        raise InputError(source, f"{what}: indptr and indices must be integer arrays")
    nnz = len(indices)
    indptr = check_indptr(indptr, n_rows, nnz, source, what)
    if nnz:
        lo, hi = int(indices.min()), int(indices.max())
        if lo < 0 or hi >= n_cols:
            bad = lo if lo < 0 else hi
            raise InputError(source, f"{what}: column index {bad} out of range [0, {n_cols})")
        # Within a row, indices must strictly increase (sorted, no duplicate entries). In
        # blocks of entries: the int64 steps of a whole layer would be 8 bytes an entry.
        starts = indptr[:-1][np.diff(indptr) > 0]
        for lo in range(0, nnz - 1, CHECK_BLOCK):
            hi = min(nnz, lo + CHECK_BLOCK + 1)
            step = np.diff(indices[lo:hi].astype(np.int64))  # entry e + 1 against e
            row_start = np.zeros(hi - lo, dtype=bool)  # entries lo..hi-1
            row_start[starts[np.searchsorted(starts, lo):np.searchsorted(starts, hi)] - lo] = True
            bad = (step <= 0) & ~row_start[1:]
            if np.any(bad):
                pos = lo + int(np.argmax(bad)) + 1
                row = int(np.searchsorted(indptr, pos, side="right")) - 1
                kind = "duplicate" if step[pos - lo - 1] == 0 else "unsorted"
                raise InputError(source, f"{what}: {kind} column index in row {row}")
    return indptr


def check_csr(
    indptr: np.ndarray,
    indices: np.ndarray,
    data: np.ndarray,
    shape: tuple[int, int],
    source: str,
    what: str,
    min_rows: int = 1,
) -> None:
    """Validate raw CSR arrays: a valid pattern (``check_pattern``) and finite values."""
    if data.ndim != 1 or len(data) != len(indices):
        raise InputError(source, f"{what}: indptr, indices and data lengths do not agree")
    check_pattern(indptr, indices, shape, source, what, min_rows)
    if not np.issubdtype(data.dtype, np.floating):
        raise InputError(source, f"{what}: values must be floating point, not {data.dtype}")
    if not np.all(np.isfinite(data)):
        raise InputError(source, f"{what}: non-finite value (NaN or Inf)")


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

    def hidden(self, k: int) -> Activation:
        """The activation of hidden layer k (1-based, k < n_layers), with the network's cap."""
        return parse(self.activations[k - 1], self.cap)

    @property
    def relu_only(self) -> bool:
        """Every hidden layer ReLU: what the exact-zero paths need."""
        return all(a == "relu" for a in self.activations)

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


HASH_BLOCK = 1 << 20


class Fingerprint:
    """A stable hash of the layer sizes and sparsity patterns (not the values), fed layer by
    layer. Index dtype and byte order do not change it: everything is hashed as little-endian
    int64."""

    def __init__(self, sizes: Sequence[int]) -> None:
        self._h = hashlib.sha256(json.dumps([int(n) for n in sizes]).encode())

    def add(self, indptr: np.ndarray, indices: np.ndarray) -> None:
        self.add_indices(indptr)
        self.add_indices(indices)

    def add_indices(self, values: np.ndarray) -> None:
        """Hash ``values`` after what was added before (a layer's indices may come in
        consecutive parts: the digest is that of their concatenation). Blocks of
        HASH_BLOCK values bound the int64 temporary."""
        for start in range(0, len(values), HASH_BLOCK):
            self._h.update(np.asarray(values[start:start + HASH_BLOCK], dtype="<i8").data)

    def hexdigest(self) -> str:
        return "sha256:" + self._h.hexdigest()[:32]


def fingerprint_of(
    sizes: Sequence[int], patterns: Iterable[tuple[np.ndarray, np.ndarray]]
) -> str:
    """The fingerprint of a whole network given as (indptr, indices) per layer."""
    f = Fingerprint(sizes)
    for indptr, indices in patterns:
        f.add(indptr, indices)
    return f.hexdigest()
