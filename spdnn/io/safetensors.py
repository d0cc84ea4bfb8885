"""PyTorch interop: a sequence of linear layers to and from a ``.safetensors`` file.

The format (https://huggingface.co/docs/safetensors): 8 bytes of little-endian header length N,
N bytes of JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
{...}}``, then the tensors' bytes (C order, little-endian). It is read and written here directly:
the header is validated (sizes, offsets, dtypes, overlaps) before any tensor is allocated, so a
damaged or hostile file is one line of error, and spdnn needs no extra package. Files written
here load with ``safetensors.torch.load_file`` (tests check it when the package is installed).

Layers follow ``nn.Linear``: ``NAME.weight`` [out, in] and ``NAME.bias`` [out] (absent: zero).
The sparsity is ``NAME.weight_mask`` when present (``torch.nn.utils.prune`` stores it beside
``NAME.weight_orig``), else the nonzeros of ``NAME.weight``.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from spdnn.errors import InputError
from spdnn.io.atomic import atomic_path
from spdnn.io.bundle import BFLOAT16, VALUES_KEY, as_bfloat16, stores_bfloat16
from spdnn.io.jsonread import decode
from spdnn.io.paths import check_input_file
from spdnn.kernels import bfloat16
from spdnn.model.activations import ACTIVATIONS, parse_list
from spdnn.model.network import OUTPUT_ACTIVATIONS, Layer, Network

DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
          "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
          "BOOL": np.bool_}
MAX_HEADER = 100 << 20  # the reference implementation's limit


def _natural(name: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


class SafetensorsFile:
    """The validated header of one file; tensors are read on demand."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = check_input_file(path, "safetensors file")
        size = os.path.getsize(self.path)
        with open(self.path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise InputError(self.path, "not a safetensors file (shorter than 8 bytes)")
            (n,) = struct.unpack("<Q", head)
            if n > min(MAX_HEADER, size - 8):
                raise InputError(self.path, f"not a safetensors file (header of {n:,} bytes in "
                                            f"a file of {size:,})")
            raw = f.read(n)
        try:
            header = decode(raw, self.path, unique_keys=True)
        except InputError as exc:
            raise InputError(self.path, f"not a safetensors file (header: "
                                        f"{exc.problem})") from None
        if not isinstance(header, dict):
            raise InputError(self.path, "not a safetensors file (header is not a JSON object)")
        meta = header.pop("__metadata__", None)
        if meta is not None and not (isinstance(meta, dict) and all(
                isinstance(v, str) for v in meta.values())):
            raise InputError(self.path, "__metadata__ must be an object of strings (as the "
                                        "safetensors format defines it)")
        self.metadata: dict[str, str] = meta or {}
        self.data_start, data_len = 8 + n, size - 8 - n
        self.tensors: dict[str, tuple[np.dtype, tuple[int, ...], int, int]] = {}
        spans = []
        for name, entry in header.items():
            self.tensors[name] = self._entry(name, entry, data_len)
            spans.append(self.tensors[name][2:])
        spans.sort()
        for (_, e0), (b1, _) in zip(spans, spans[1:]):
            if b1 < e0:
                raise InputError(self.path, "tensors overlap in the data section")

    def _entry(self, name: str, entry: Any, data_len: int
               ) -> tuple[np.dtype, tuple[int, ...], int, int]:
        bad = InputError(self.path, f"tensor '{name}': malformed header entry")
        if not isinstance(entry, dict):
            raise bad
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in DTYPES:
            raise InputError(self.path, f"tensor '{name}': unsupported dtype {dtype!r}")
        if not (isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool)
                                                and 0 <= d < 2**40 for d in shape)):
            raise bad
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
            raise bad
        begin, end = offsets
        dt = np.dtype(DTYPES[dtype])
        count = int(np.prod(shape, dtype=object))
        if not 0 <= begin <= end <= data_len or end - begin != count * dt.itemsize:
            raise InputError(self.path, f"tensor '{name}': offsets {begin}..{end} do not hold "
                                        f"{count:,} {dtype} values in {data_len:,} data bytes")
        return dt if dtype != "BF16" else np.dtype("V2"), tuple(shape), begin, end

    def read(self, name: str) -> np.ndarray:
        """One tensor as a float64 (floating dtypes, BF16 included) or native array."""
        if name not in self.tensors:
            raise InputError(self.path, f"no tensor '{name}'")
        dt, shape, begin, end = self.tensors[name]
        with open(self.path, "rb") as f:
            f.seek(self.data_start + begin)
            raw = f.read(end - begin)
        if dt == np.dtype("V2"):  # bfloat16: the upper half of a float32
            bits = np.frombuffer(raw, "<u2").astype(np.uint32) << 16
            return bits.view(np.float32).reshape(shape)
        return np.frombuffer(raw, dt.newbyteorder("<")).reshape(shape).astype(dt.newbyteorder("="))


def _layer_names(st: SafetensorsFile, names: Sequence[str] | None) -> list[str]:
    found = sorted({n.rsplit(".", 1)[0] for n in st.tensors
                    if n.endswith((".weight", ".weight_orig"))}, key=_natural)
    if names is None:
        if not found:
            raise InputError(st.path, "no linear layers (no tensor named NAME.weight or "
                                      "NAME.weight_orig)")
        return found
    twice = [n for n in names if list(names).count(n) > 1]
    if twice:
        raise InputError(st.path, f"--layers names {twice[0]!r} twice")
    missing = [n for n in names if n not in found]
    if missing:
        raise InputError(st.path, f"no layer named {missing[0]!r} (layers: "
                                  f"{', '.join(found) or 'none'})")
    return list(names)


# What the hidden layers compute, as spdnn's export writes it in the file's metadata.
ACTIVATIONS_KEY = "spdnn_activations"


def hidden_activations(path: str, given: str | Sequence[str] | None,
                       metadata: dict[str, Any], hidden: int) -> tuple[str, ...]:
    """The hidden layers' activations, from ``given`` (one name for all, or one per hidden
    layer) or else the file's metadata: refused, never assumed, when neither says, when the
    count is wrong, or when one is not an activation spdnn computes."""
    if given is None and hidden and isinstance(metadata.get(ACTIVATIONS_KEY), str):
        given = metadata[ACTIVATIONS_KEY]
    if hidden == 0:
        return ()
    if given is None:
        raise InputError(path, f"does not say what its {hidden} hidden layer(s) compute: give "
                               f"--activations (one per hidden layer, e.g. "
                               f"{','.join(['relu'] * hidden)}; choose from "
                               f"{', '.join(ACTIVATIONS)})")
    try:
        return tuple(a.spec for a in parse_list(given, hidden))
    except ValueError as exc:
        raise InputError(path, f"--activations: {exc} (the last layer's is "
                               "--output-activation)") from None


# ``cap`` or ``output_activation`` of read_safetensors: the one the file's metadata names (as
# spdnn's export writes it), else uncapped and linear (a torch model's nn.Linear layers).
FROM_FILE = "from the file"


def _from_metadata(path: str, metadata: dict[str, str], cap: Any, output: Any  # noqa: ANN401
                   ) -> tuple[float | None, str]:
    if cap == FROM_FILE:
        text = metadata.get("spdnn_cap", "none")
        try:
            cap = None if text == "none" else float(text)
        except ValueError:
            cap = -1.0
        if cap is not None and not (np.isfinite(cap) and cap > 0):
            raise InputError(path, f"__metadata__: spdnn_cap {text!r} is not a positive "
                                   "number or none")
    if output == FROM_FILE:
        output = metadata.get("spdnn_output_activation", "linear")
        if output not in OUTPUT_ACTIVATIONS:
            raise InputError(path, f"__metadata__: spdnn_output_activation {output!r} is not "
                                   f"one of {', '.join(OUTPUT_ACTIVATIONS)}")
    return cap, output


def read_safetensors(path: str | os.PathLike, names: Sequence[str] | None = None,
                     dtype: Any = np.float32, cap: Any = FROM_FILE,  # noqa: ANN401
                     output_activation: str = FROM_FILE,
                     activations: str | Sequence[str] | None = None) -> Network:
    """The linear layers ``names`` (default: every NAME.weight, in natural order) as a network;
    the names and the pruning style are kept in its metadata for ``write_safetensors``.
    ``activations``: what the hidden layers compute (one name for all, or one per hidden
    layer; default: the file's metadata, as spdnn writes it, else refused); ``cap`` and
    ``output_activation`` likewise, else uncapped and linear (``FROM_FILE``). ``dtype`` None:
    the type the file declares (float64 when a layer's values or bias are F64; bfloat16 when
    every one is BF16: held in float32, exactly, with meta ``values`` "bfloat16", so that a
    bundle or safetensors file written from it stores BF16 again; else float32, which holds
    F32, F16 and BF16 exactly). ``dtype`` "bfloat16": the values rounded to it, so marked."""
    st = SafetensorsFile(path)
    names = _layer_names(st, names)
    keys = [f"{n}.{t}" for n in names for t in ("weight", "weight_orig", "bias")]
    half = dtype == "bfloat16" or dtype is None and all(
        st.tensors[k][0] == np.dtype("V2") for k in keys if k in st.tensors)
    if dtype is None:
        wide = any(st.tensors[k][0] == np.float64 for k in keys if k in st.tensors)
        dtype = np.float64 if wide else np.float32
    layers, pruned = [], False
    for name in names:
        if f"{name}.weight_orig" in st.tensors and f"{name}.weight" in st.tensors:
            raise InputError(path, f"both '{name}.weight' and '{name}.weight_orig': which is "
                                   "the layer's is not clear (keep one)")
        values_key = f"{name}.weight_orig" if f"{name}.weight_orig" in st.tensors \
            else f"{name}.weight"
        claimed = st.tensors[values_key][1]
        if len(claimed) != 2 or min(claimed) < 1:  # before any array is sized by the claim
            raise InputError(path, f"'{values_key}' is not a 2-D floating point [out, in] "
                                   f"matrix with out and in at least 1 (shape {list(claimed)})")
        values = st.read(values_key)
        if not np.issubdtype(values.dtype, np.floating):
            raise InputError(path, f"'{values_key}' is not a 2-D floating point [out, in] matrix")
        if f"{name}.weight_mask" in st.tensors:
            mask = st.read(f"{name}.weight_mask")
            if mask.shape != values.shape:
                raise InputError(path, f"'{name}.weight_mask' has shape {mask.shape}, the "
                                       f"weight {values.shape}")
            if not np.all((mask == 0) | (mask == 1)):  # torch multiplies by it: 0.5 scales
                raise InputError(path, f"'{name}.weight_mask' holds values other than 0 and "
                                       "1 (torch's pruning masks are 0 or 1)")
            keep, pruned = mask != 0, True
        else:
            keep = values != 0
        if not np.all(np.isfinite(values[keep])):
            raise InputError(path, f"'{values_key}': non-finite value (NaN or Inf)")
        rows, cols = np.nonzero(keep)
        w = sp.csr_matrix((values[rows, cols].astype(np.float64), (rows, cols)),
                          shape=values.shape)
        w.sort_indices()
        bias = st.read(f"{name}.bias") if f"{name}.bias" in st.tensors \
            else np.zeros(values.shape[0])
        if bias.shape != (values.shape[0],) or not np.issubdtype(bias.dtype, np.floating):
            raise InputError(path, f"'{name}.bias' is not {values.shape[0]} floating point "
                                   "values")
        layer = Layer.from_arrays(w.indptr, w.indices, w.data, w.shape,
                                  bias.astype(np.float64), str(path), f"layer '{name}'", dtype,
                                  min_rows=1)
        if values_key.endswith("_orig") and f"{name}.weight_mask" in st.tensors:
            # weight_orig's values outside the mask, kept for the export
            layer = Layer(layer.weight, layer.bias, values[~keep].astype(layer.weight.dtype))
            layer.check_pruned(str(path), f"'{values_key}'")
        layers.append(layer)
    for k in range(1, len(layers)):
        if layers[k].n_in != layers[k - 1].n_out:
            raise InputError(path, f"layer '{names[k]}' takes {layers[k].n_in} inputs but "
                                   f"'{names[k - 1]}' gives {layers[k - 1].n_out} (name the "
                                   "layers in order with --layers)")
    acts = hidden_activations(os.fspath(path), activations, st.metadata, len(names) - 1)
    cap, output_activation = _from_metadata(os.fspath(path), st.metadata, cap,
                                            output_activation)
    extra: dict[str, Any] = {"safetensors": {"names": names, "pruned": pruned}}
    if half:
        extra[VALUES_KEY] = BFLOAT16
    net = Network(layers=tuple(layers), activations=acts, cap=cap,
                  output_activation=output_activation, extra=extra)
    net.validate(str(path))
    return as_bfloat16(net) if half else net


def write_safetensors(net: Network, path: str | os.PathLike,
                      names: Sequence[str] | None = None, pruned: bool | None = None) -> None:
    """Each layer as dense ``NAME.weight`` [out, in] and ``NAME.bias`` (float32), or, when
    ``pruned``, as ``NAME.weight_orig`` and ``NAME.weight_mask`` (what a module under
    ``torch.nn.utils.prune`` loads; weight_orig's values outside the mask as they were read,
    when they were, else 0). Names and style default to those the network was read with, else
    fc1, fc2, ... and plain weights."""
    known = net.extra.get("safetensors", {}) if isinstance(net.extra, dict) else {}
    names = list(names or known.get("names") or
                 [f"fc{k}" for k in range(1, net.n_layers + 1)])
    if len(names) != net.n_layers:
        raise InputError(path, f"{len(names)} layer names for {net.n_layers} layers")
    if len(set(names)) != len(names):
        raise InputError(path, f"the layer names {','.join(names)} name one layer twice")
    pruned = bool(known.get("pruned", False)) if pruned is None else pruned
    tensors: list[tuple[str, np.ndarray]] = []
    dt, code = (np.float64, "F64") if net.dtype == np.float64 else (np.float32, "F32")
    if stores_bfloat16(net.meta()):  # values read from BF16, or rounded to it on request
        code = "BF16"
    for name, layer in zip(names, net.layers):
        dense = layer.weight.astype(dt).toarray()
        if pruned:
            outside = layer.outside()  # the pattern's complement, stored zeros inside
            if layer.pruned is not None:  # weight_orig as it was read
                dense[outside] = layer.pruned
            tensors += [(f"{name}.weight_orig", dense),
                        (f"{name}.weight_mask", (~outside).astype(dt))]
        else:
            tensors.append((f"{name}.weight", dense))
        tensors.append((f"{name}.bias", layer.bias.astype(dt)))
    meta = {"format": "pt", "written_by": "spdnn",
            ACTIVATIONS_KEY: ",".join(net.activations),
            "spdnn_output_activation": net.output_activation,
            "spdnn_cap": "none" if net.cap is None else repr(float(net.cap))}
    header: dict[str, Any] = {"__metadata__": meta}
    offset = 0
    item = 2 if code == "BF16" else np.dtype(dt).itemsize
    for name, a in tensors:
        header[name] = {"dtype": code, "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.size * item]}
        offset += a.size * item
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for _, a in tensors:
            if code == "BF16":
                f.write(bfloat16.narrow(a).astype("<u2").tobytes())
            else:
                f.write(np.ascontiguousarray(a, "<f8" if code == "F64" else "<f4").tobytes())
