"""The network bundle: one ``.npz`` file, format ``spdnn-network/2`` (see docs/formats.md).

Keys: ``format``, ``n_layers``, ``meta`` (JSON string) and for k = 1..L ``W{k}_indptr``,
``W{k}_indices``, ``W{k}_data``, ``W{k}_shape`` (= [n_k, n_{k-1}]) and ``b{k}``. An ``.npz`` is
a zip of ``.npy`` members, so one layer is read without reading the others. Meta ``"values":
"bfloat16"``: the values, biases and pruned values are bfloat16 bits (uint16), read widened to
float32 (exactly) and written rounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib import format as npy

from spdnn.errors import InputError, check_type
from spdnn.io.atomic import atomic_path
from spdnn.io.jsonread import decode
from spdnn.io.npz import RANGE_BLOCK, NpzReader
from spdnn.kernels import bfloat16
from spdnn.model.csr import check_indptr, check_pattern
from spdnn.model.fingerprint import Fingerprint, fingerprint_of
from spdnn.model.network import Layer, Network, validate_meta

# The meta keys a Network's own fields hold (the rest is ``extra``).
ACTIVATION_KEYS = ("activation", "activations", "cap", "output_activation")
# The meta key of a bundle whose values are stored in 16 bits, and its one value.
VALUES_KEY, BFLOAT16 = "values", "bfloat16"


def stores_bfloat16(meta: dict[str, Any]) -> bool:
    """Whether a bundle with this meta stores its values as bfloat16."""
    return meta.get(VALUES_KEY) == BFLOAT16


def as_bfloat16(net: Network) -> Network:
    """``net`` with its values, biases and pruned values rounded to bfloat16 (held in float32)
    and marked so (meta ``values``): a bundle or safetensors file written from it stores 16
    bits. Refuses a value past bfloat16's range."""
    import scipy.sparse as sp

    def rounded(a: np.ndarray) -> np.ndarray:
        out = bfloat16.rounded(a)
        if not np.all(np.isfinite(out)):
            raise ValueError("a value beyond bfloat16's range (about 3.39e38)")
        return out

    layers = tuple(Layer(sp.csr_matrix((rounded(lay.weight.data), lay.weight.indices,
                                        lay.weight.indptr), shape=lay.weight.shape),
                         rounded(lay.bias),
                         None if lay.pruned is None else rounded(lay.pruned))
                   for lay in net.layers)
    extra = {**(net.extra if isinstance(net.extra, dict) else {}), VALUES_KEY: BFLOAT16}
    return Network(layers=layers, activations=net.activations, cap=net.cap,
                   output_activation=net.output_activation, extra=extra)

NETWORK_FORMAT = "spdnn-network/2"
# Format 1 is format 2 with every hidden layer ReLU (meta "activation": "relu").
NETWORK_FORMAT_1 = "spdnn-network/1"


class NetworkBundle:
    """Reader of a network bundle; ``layer(k)`` loads and validates layer k alone."""

    def __init__(self, path: str | os.PathLike) -> None:
        self._npz = NpzReader(path, "network")
        self.path = self._npz.path
        self._npz.check_headers()
        fmt = self._npz.text("format")
        if fmt not in (NETWORK_FORMAT, NETWORK_FORMAT_1):
            raise InputError(self.path, f"unknown format version '{fmt}' (expected "
                             f"{NETWORK_FORMAT}, or {NETWORK_FORMAT_1})")
        self.n_layers = self._npz.integer("n_layers")
        if self.n_layers < 1:
            raise InputError(self.path, f"n_layers is {self.n_layers}, expected at least 1")
        meta = decode(self._npz.text("meta"), self.path, "meta")
        if not isinstance(meta, dict):
            raise InputError(self.path, "meta must be a JSON object")
        if (fmt == NETWORK_FORMAT) != ("activations" in meta):
            raise InputError(self.path, f"meta: {fmt} " + (
                "names one activation per hidden layer (activations)" if fmt == NETWORK_FORMAT
                else "has no per-layer activations (its hidden layers are ReLU)"))
        validate_meta(meta, self.path, self.n_layers)
        if VALUES_KEY in meta and meta[VALUES_KEY] != BFLOAT16:
            raise InputError(self.path, f"meta: values {meta[VALUES_KEY]!r} is not a stored "
                                        f"value type (only {BFLOAT16!r} is named)")
        self.bfloat16 = stores_bfloat16(meta)
        if fmt == NETWORK_FORMAT_1:  # read as format 2: ReLU on every hidden layer
            meta = {k: v for k, v in meta.items() if k != "activation"}
            meta["activations"] = ["relu"] * (self.n_layers - 1)
        self.meta: dict[str, Any] = meta
        shapes = []
        for k in range(1, self.n_layers + 1):
            shape = self._npz.get(f"W{k}_shape")
            if shape.shape != (2,) or not np.issubdtype(shape.dtype, np.integer):
                raise InputError(self.path, f"W{k}_shape must be two integers")
            if not (1 <= int(shape[0]) < 2**31 and 1 <= int(shape[1]) < 2**31):
                raise InputError(self.path, f"W{k}_shape {shape.tolist()} must be two positive "
                                            "integers below 2**31")
            shapes.append((int(shape[0]), int(shape[1])))
            self._check_members(k, shapes[-1][0])
        for k in range(1, self.n_layers):
            if shapes[k][1] != shapes[k - 1][0]:
                raise InputError(
                    self.path,
                    f"layer {k + 1} has {shapes[k][1]} inputs but layer {k} has "
                    f"{shapes[k - 1][0]} outputs: shapes do not chain",
                )
        self.shapes = tuple(shapes)

    def _check_members(self, k: int, n_out: int) -> None:
        """The members of layer k agree with its claimed shape (headers only, nothing read):
        a header that claims 10**9 rows is refused here, before any rank allocates by it."""
        members = {name: self._npz.header(f"{name}{k}" if name == "b" else f"W{k}_{name}")
                   for name in ("indptr", "indices", "data", "b")}
        for name, (shape, dtype) in members.items():
            if len(shape) != 1:
                raise InputError(self.path, f"layer {k}: {name} must be a 1-D array, not "
                                            f"shape {shape}")
            want_kind = "iu" if name in ("indptr", "indices") else "f"
            if name in ("data", "b") and self.bfloat16:
                if np.dtype(dtype) != bfloat16.BITS:
                    raise InputError(self.path, f"layer {k}: {name} must be bfloat16 bits "
                                                f"(uint16, as meta values says), not "
                                                f"{np.dtype(dtype)}")
                continue
            if np.dtype(dtype).kind not in want_kind:
                kind = "an integer" if want_kind == "iu" else "a floating-point"
                raise InputError(self.path, f"layer {k}: {name} must be {kind} array, not "
                                            f"{np.dtype(dtype)}")
        if members["indptr"][0][0] != n_out + 1:
            raise InputError(self.path, f"layer {k}: indptr has length {members['indptr'][0][0]}"
                                        f", but W{k}_shape claims {n_out} rows")
        if members["b"][0][0] != n_out:
            raise InputError(self.path, f"layer {k}: bias has length {members['b'][0][0]}, "
                                        f"but W{k}_shape claims {n_out} rows")
        if members["indices"][0] != members["data"][0]:
            raise InputError(self.path, f"layer {k}: indptr, indices and data lengths do not "
                                        "agree")

    @property
    def sizes(self) -> tuple[int, ...]:
        return (self.shapes[0][1], *(s[0] for s in self.shapes))

    def pattern(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """indptr and indices of layer k (1-based), without the values, validated (they go on
        to native partitioners)."""
        indptr = self._npz.get(f"W{k}_indptr")
        indices = self._npz.get(f"W{k}_indices")
        indptr = check_pattern(indptr, indices, self.shapes[k - 1], self.path, f"layer {k}")
        # Native partitioners get one index type, whatever integer type the file stored.
        return indptr, indices.astype(np.int32 if len(indices) < 2**31 else np.int64, copy=False)

    def row_nnz(self, k: int) -> np.ndarray:
        """Nonzeros of each row of layer k, from its row pointers alone (checked)."""
        indptr = check_indptr(self._npz.get(f"W{k}_indptr"), self.shapes[k - 1][0],
                              self.nnz(k), self.path, f"layer {k}")
        return np.diff(indptr)

    def nnz(self, k: int) -> int:
        """Stored nonzeros of layer k, from the member header alone."""
        shape, _ = self._npz.header(f"W{k}_indices")
        return shape[0] if len(shape) == 1 else -1

    def row_indices(self, k: int, rows: np.ndarray) -> Iterator[np.ndarray]:
        """The column indices of rows ``rows`` (ascending) of layer k, in groups of at most
        RANGE_BLOCK entries (a longer row alone), each checked in range: what a rank will
        read, counted before it is loaded (``spdnn.runtime.memory_budget``)."""
        n_out, n_in = self.shapes[k - 1]
        nnz = self.nnz(k)
        if nnz < 0:
            raise InputError(self.path, f"layer {k}: indices must be a 1-D array")
        indptr = check_indptr(self._npz.get(f"W{k}_indptr"), n_out, nnz, self.path,
                              f"layer {k}")
        counts, starts = np.diff(indptr)[rows], indptr[:-1][rows]
        ends = np.cumsum(counts)
        g0 = 0
        while g0 < len(rows):
            done = int(ends[g0 - 1]) if g0 else 0
            g1 = max(g0 + 1, int(np.searchsorted(ends, done + RANGE_BLOCK, side="right")))
            part = self._npz.ranges(f"W{k}_indices", starts[g0:g1], counts[g0:g1])
            lo, hi = (int(part.min()), int(part.max())) if len(part) else (0, 0)
            if lo < 0 or hi >= n_in:  # as check_pattern says it
                raise InputError(self.path, f"layer {k}: column index {lo if lo < 0 else hi} "
                                            f"out of range [0, {n_in})")
            yield part
            g0 = g1

    def rows(self, k: int, rows: np.ndarray, dtype: Any = None,
             fingerprint: Fingerprint | None = None) -> Layer:
        """Rows ``rows`` (ascending) of layer k, validated, without reading the other rows'
        indices and values; with ``fingerprint``, the whole pattern is read once and added to
        it (the rank that computes the network's fingerprint)."""
        n_out, n_in = self.shapes[k - 1]
        what = f"layer {k}"
        nnz = self.nnz(k)
        if nnz < 0:
            raise InputError(self.path, f"{what}: indices must be a 1-D array")
        indptr = self._npz.get(f"W{k}_indptr")
        indptr = check_indptr(indptr, n_out, nnz, self.path, what)
        data_shape, _ = self._npz.header(f"W{k}_data")
        if data_shape != (nnz,):
            raise InputError(self.path, f"{what}: indptr, indices and data lengths do not agree")
        counts = np.diff(indptr)[rows]
        starts = indptr[:-1][rows]
        if fingerprint is not None:  # the whole pattern, streamed through the hash
            fingerprint.add_indices(indptr)
            for start in range(0, nnz, RANGE_BLOCK):
                fingerprint.add_indices(self._npz.span(f"W{k}_indices", start,
                                                       min(RANGE_BLOCK, nnz - start)))
        mine = self._npz.ranges(f"W{k}_indices", starts, counts)
        data = self._values(self._npz.ranges(f"W{k}_data", starts, counts))
        bias = self.bias(k)
        local_indptr = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        return Layer.from_arrays(local_indptr, mine, data, (len(rows), n_in), bias[rows],
                                 self.path, what, dtype, min_rows=0)

    def bias(self, k: int) -> np.ndarray:
        """Layer k's bias as stored (its values are checked where the rows are built)."""
        n_out = self.shapes[k - 1][0]
        bias = self._npz.get(f"b{k}")
        if bias.shape != (n_out,):
            raise InputError(self.path, f"layer {k}: bias has shape {bias.shape}, expected "
                                        f"({n_out},)")
        return self._values(bias)

    def _values(self, stored: np.ndarray) -> np.ndarray:
        """Values as stored, bfloat16 bits widened to float32 (exact)."""
        return bfloat16.widen(stored) if self.bfloat16 else stored

    def layer(self, k: int, dtype: Any = None) -> Layer:
        if not 1 <= k <= self.n_layers:
            raise IndexError(k)
        indptr, indices = self.pattern(k)
        data = self._values(self._npz.get(f"W{k}_data"))
        bias = self.bias(k)
        layer = Layer.from_arrays(indptr, indices, data, self.shapes[k - 1], bias, self.path,
                                  f"layer {k}", dtype)
        if f"W{k}_pruned" not in self._npz.keys:
            return layer
        n_out, n_in = self.shapes[k - 1]
        shape, kind = self._npz.header(f"W{k}_pruned")  # checked before it is read
        stored = bfloat16.BITS if self.bfloat16 else None
        if shape != (n_out * n_in - layer.nnz,) or \
                (kind != stored if stored is not None else kind.kind != "f"):
            raise InputError(self.path, f"layer {k}: W{k}_pruned must be "
                             f"{n_out * n_in - layer.nnz} floats (one per position outside "
                             "the pattern)")
        pruned = self._values(self._npz.get(f"W{k}_pruned")).astype(layer.weight.dtype)
        layer = Layer(layer.weight, layer.bias, pruned)
        layer.check_pruned(self.path, f"layer {k}")
        return layer

    def validate(self) -> None:
        """Read and check every layer (one at a time), as loading the network would."""
        for k in range(1, self.n_layers + 1):
            self.layer(k)

    def layers(self, dtype: Any = None) -> Iterator[Layer]:
        for k in range(1, self.n_layers + 1):
            yield self.layer(k, dtype)

    def patterns(self) -> BundlePatterns:
        """Every layer's (indptr, indices, shape), each read from the file when asked."""
        return BundlePatterns(self)

    def fingerprint(self) -> str:
        return fingerprint_of(self.sizes, (self.pattern(k) for k in range(1, self.n_layers + 1)))

    def network(self, dtype: Any = None) -> Network:
        extra = {k: v for k, v in self.meta.items() if k not in ACTIVATION_KEYS}
        return Network(
            layers=tuple(self.layers(dtype)),
            activations=tuple(self.meta["activations"]),
            cap=None if self.meta["cap"] is None else float(self.meta["cap"]),
            output_activation=self.meta["output_activation"],
            extra=extra,
        )

    def check_unchanged(self) -> None:
        self._npz.check_unchanged()

    def close(self) -> None:
        self._npz.close()

    def __enter__(self) -> NetworkBundle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BundlePatterns(Sequence):
    """A bundle's layer patterns (index i: layer i+1), read when asked; the last one read is
    kept, so that several readers going through the layers together read each once (the
    cost model's streamed replays of a network larger than memory)."""

    def __init__(self, bundle: NetworkBundle) -> None:
        self.bundle = bundle
        self._last: tuple[int, tuple] | None = None

    def __len__(self) -> int:
        return self.bundle.n_layers

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
        if not 0 <= i < len(self):
            raise IndexError(i)
        if self._last is None or self._last[0] != i:
            self._last = (i, (*self.bundle.pattern(i + 1), self.bundle.shapes[i]))
        return self._last[1]


def load_network(path: str | os.PathLike, dtype: Any = None) -> Network:
    """Load and validate a whole network bundle."""
    with NetworkBundle(path) as bundle:
        return bundle.network(dtype)


def save_network(network: Network, path: str | os.PathLike) -> None:
    """Write a network bundle atomically (temporary name, then rename)."""
    check_type("network", network, Network, "a spdnn.Network")
    network.validate(os.fspath(path))
    write_network(path, network.sizes, network.layers, network.meta())


def write_network(path: str | os.PathLike, sizes: Sequence[int], layers: Iterable[Layer],
                  meta: dict[str, Any]) -> str:
    """Write a bundle one layer at a time, as ``layers`` yields them (a network larger than
    memory need never be whole). Returns the network's fingerprint."""
    writer = NetworkWriter(path, sizes, meta)
    try:
        for layer in layers:
            writer.add(layer)
        return writer.close()
    finally:
        writer.abort()


class NetworkWriter:
    """A bundle written layer by layer (``add``), each layer checked on the way, under a
    temporary name that ``close`` renames into place; ``abort`` (or a failure) leaves nothing
    behind."""

    def __init__(self, path: str | os.PathLike, sizes: Sequence[int],
                 meta: dict[str, Any]) -> None:
        self.path = os.fspath(path)
        if "activations" not in meta:
            raise ValueError("a bundle's meta names its activations (Network.meta)")
        validate_meta(meta, self.path, len(sizes) - 1)
        self.bfloat16 = stores_bfloat16(meta)  # the values rounded as they are written
        self.sizes = tuple(int(n) for n in sizes)
        self._fp = Fingerprint(self.sizes)
        self._k = 0
        self._stack = contextlib.ExitStack()
        tmp = self._stack.enter_context(atomic_path(Path(path)))
        self._zf = self._stack.enter_context(zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED))
        self._put("format", np.array(NETWORK_FORMAT))
        self._put("n_layers", np.array(len(self.sizes) - 1, dtype=np.int64))
        self._put("meta", np.array(json.dumps(meta, sort_keys=True)))

    def _put(self, key: str, value: np.ndarray) -> None:
        try:
            with self._zf.open(key + ".npy", "w", force_zip64=True) as fh:  # as np.savez
                npy.write_array(fh, np.asanyarray(value), allow_pickle=False)
        except OSError as exc:
            self.abort()
            raise InputError(self.path, f"cannot write the network ({exc.strerror or exc})"
                             ) from None

    def add(self, layer: Layer) -> None:
        k, w = self._k + 1, layer.weight
        if k >= len(self.sizes) or w.shape != (self.sizes[k], self.sizes[k - 1]):
            self.abort()
            raise InputError(self.path, f"layer {k} has shape {w.shape}, the sizes "
                                        f"{list(self.sizes)} do not agree")
        Layer.from_arrays(w.indptr, w.indices, w.data, w.shape, layer.bias, self.path,
                          f"layer {k}")
        self._fp.add(w.indptr, w.indices)
        stored = self._stored
        for name, value in (("indptr", w.indptr), ("indices", w.indices),
                            ("data", stored(w.data)),
                            ("shape", np.array(w.shape, dtype=np.int64))):
            self._put(f"W{k}_{name}", value)
        self._put(f"b{k}", stored(layer.bias))
        if layer.pruned is not None:
            layer.check_pruned(self.path, f"layer {k}")
            self._put(f"W{k}_pruned", stored(layer.pruned))
        self._k = k

    def _stored(self, values: np.ndarray) -> np.ndarray:
        """Values as the bundle stores them: as they are, or rounded to bfloat16 (a value past
        bfloat16's range is refused: it would be stored as infinite)."""
        if not self.bfloat16:
            return values
        bits = bfloat16.narrow(values)
        if not np.all(np.isfinite(bfloat16.widen(bits))):
            self.abort()
            raise InputError(self.path, "a value beyond bfloat16's range (about 3.39e38) "
                                        "cannot be stored as bfloat16")
        return bits

    def close(self) -> str:
        """Rename the complete bundle into place; its fingerprint."""
        if self._k != len(self.sizes) - 1:
            self.abort()
            raise InputError(self.path, f"{self._k} layers written, the sizes "
                                        f"{list(self.sizes)} need {len(self.sizes) - 1}")
        self._stack.close()
        return self._fp.hexdigest()

    def abort(self) -> None:
        """Remove the temporary file (nothing once closed)."""
        self._stack.__exit__(InputError, InputError(self.path, "aborted"), None)
