"""Graph Challenge network directories: ``n{N}-l{k}.tsv`` weight files, 1-based
``row<TAB>col<TAB>value`` where W(i,j) is the edge from input neuron i to output neuron j, so
transposed into spdnn's rows-are-outputs convention (docs/formats.md)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from spdnn.errors import InputError
from spdnn.io.formats import coo_to_csr, read_triples, write_triples
from spdnn.model.csr import as_dtype
from spdnn.model.network import Layer, Network

_GC_NAME = re.compile(r"n(\d+)-l(\d+)\.tsv$")


def graphchallenge_files(directory: str | os.PathLike) -> tuple[int, list[Path]]:
    """The neuron count N and the layer files n{N}-l1.tsv .. n{N}-lL.tsv of a directory."""
    d = Path(directory)
    if not d.is_dir():
        raise InputError(d, "no such directory")
    found: dict[int, dict[int, Path]] = {}
    for f in d.iterdir():
        m = _GC_NAME.match(f.name)
        if m:
            found.setdefault(int(m.group(1)), {})[int(m.group(2))] = f
    if not found:
        raise InputError(d, "no Graph Challenge layer files n{N}-l{k}.tsv")
    if len(found) > 1:
        raise InputError(d, f"layer files for several neuron counts: {sorted(found)}")
    n, files = next(iter(found.items()))
    count = max(files)
    missing = [k for k in range(1, count + 1) if k not in files]
    if missing:
        raise InputError(d, f"missing layer file n{n}-l{missing[0]}.tsv")
    return n, [files[k] for k in range(1, count + 1)]


def read_graphchallenge(
    directory: str | os.PathLike,
    bias: float,
    cap: float | None,
    n_layers: int | None = None,
    dtype: str = "float32",
    progress: Callable[[int, int], None] | None = None,
) -> Network:
    """A Graph Challenge network directory as a Network (weights transposed on the way in)."""
    n, files = graphchallenge_files(directory)
    if n_layers is not None:
        if n_layers > len(files):
            raise InputError(directory, f"asked for {n_layers} layers, found {len(files)}")
        files = files[:n_layers]
    dt = as_dtype(dtype)
    layers = []
    for k, f in enumerate(files, start=1):
        rows, cols, vals, _ = read_triples(f, (n, n))
        # TSV row = input neuron, column = output neuron; spdnn's rows are outputs.
        w = coo_to_csr(os.fspath(f), cols, rows, vals, (n, n))
        layers.append(Layer.from_arrays(w.indptr, w.indices, w.data, w.shape,
                                        np.full(n, float(bias)), os.fspath(f), f"layer {k}", dt))
        if progress:
            progress(k, len(files))
    return Network(layers=tuple(layers), cap=cap, output_activation="relu",
                   extra={"source": "graphchallenge"}).validate(os.fspath(directory))


def write_graphchallenge(network: Network, directory: str | os.PathLike) -> None:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    n = network.sizes[0]
    if any(s != n for s in network.sizes):
        raise InputError(d, "the Graph Challenge format needs square layers of equal size")
    for k, layer in enumerate(network.layers, start=1):
        write_triples(d / f"n{n}-l{k}.tsv", layer.weight.T)
