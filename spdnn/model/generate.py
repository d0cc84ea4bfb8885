"""Network generators: RadiX-Net (Graph Challenge style), random fixed fan-in, locally connected
layers over an image, magnitude pruning.

Every generator takes a ``seed``; the same seed gives the same network.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from spdnn.errors import OptionError
from spdnn.model.csr import as_dtype
from spdnn.model.network import Layer, Network

RADIX_SIZES = (1024, 4096, 16384, 65536)
RADIX_BLOCK = 16  # kron(ones(16, 16), .): each neuron feeds 16 copies of its group


def _rng(seed: int | np.random.Generator | None) -> np.random.Generator:
    """Normalise a seed argument (one place for every generator)."""
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng(0 if seed is None else seed)


def radixnet_base(n: int, p: int) -> sp.csr_matrix:
    """kron(ones(16,16), I + S^p) / 16 with S the (n/16)-cyclic shift, S[i, i+1] = 1."""
    m = n // RADIX_BLOCK
    eye = sp.identity(m, format="csr")
    shift = sp.csr_matrix((np.ones(m), (np.arange(m), (np.arange(m) + p) % m)), shape=(m, m))
    w = sp.kron(np.ones((RADIX_BLOCK, RADIX_BLOCK)), eye + shift, format="csr") / RADIX_BLOCK
    w.sort_indices()
    return w


def radixnet(
    n: int,
    n_layers: int,
    *,
    seed: int | None = 0,
    bias: float = -0.3,
    cap: float | None = 32.0,
    dtype: Any = "float32",
) -> Network:
    """Graph-Challenge-style RadiX-Net: N neurons per layer, 32 nonzeros per row and column.

    The first log2(N/16) layers are kron(ones(16,16), I + S^p)/16, p = 1, 2, 4, ..., N/32
    (for N = 1024: exactly the official layers 1-6). Layer l beyond them is base layer
    ((l-1) mod cycle)+1 with independent random row and column permutations.
    """
    layers = tuple(radixnet_layers(n, n_layers, seed=seed, bias=bias, dtype=dtype))
    return Network(layers=layers, cap=cap, output_activation="relu",
                   extra={"generator": "radixnet", "seed": seed})


def radixnet_layers(n: int, n_layers: int, *, seed: int | None = 0, bias: float = -0.3,
                    dtype: Any = "float32", head: int | None = None) -> Iterator[Layer]:
    """``radixnet``'s layers one at a time (``spdnn.io.bundle.write_network`` writes a network
    larger than memory from them), then ``add_head``'s layer when ``head`` is given. The
    arguments are checked now, the layers made as they are taken."""
    if n not in RADIX_SIZES:
        raise ValueError(f"radixnet size must be one of {RADIX_SIZES}, not {n}")
    if n_layers < 1:
        raise ValueError("radixnet needs at least one layer")
    return _radixnet_layers(n, n_layers, seed, bias, as_dtype(dtype), head)


def _radixnet_layers(n: int, n_layers: int, seed: int | None, bias: float, dt: np.dtype,
                     head: int | None) -> Iterator[Layer]:
    m = n // RADIX_BLOCK
    cycle = int(np.log2(m))
    bases = [radixnet_base(n, 2**j).astype(dt) for j in range(cycle)]
    rng = _rng(seed)
    for layer in range(n_layers):
        w = bases[layer % cycle]
        if layer >= cycle:
            rows, cols = rng.permutation(n), rng.permutation(n)
            w = w[rows][:, cols]
            w.sort_indices()
        yield Layer(w, np.full(n, bias, dtype=dt))
    if head:
        yield dense_head(head, n, _rng(seed), dt)


def fixed_fan_in(n_out: int, n_in: int, fan_in: int, rng: np.random.Generator,
                 dtype: Any = "float32") -> sp.csr_matrix:
    """n_out x n_in CSR with exactly min(fan_in, n_in) distinct random columns per row.

    Values are He-initialised for ReLU: N(0, 2 / fan_in).
    """
    k = min(fan_in, n_in)
    cols = np.empty((n_out, k), dtype=np.int64)
    for i in range(n_out):
        cols[i] = rng.choice(n_in, k, replace=False)
    cols.sort(axis=1)
    vals = rng.standard_normal(n_out * k) * np.sqrt(2.0 / k)
    indptr = np.arange(0, n_out * k + 1, k)
    return sp.csr_matrix((vals.astype(as_dtype(dtype)), cols.ravel(), indptr), shape=(n_out, n_in))


def dense_head(outputs: int, n_in: int, rng: np.random.Generator,
               dtype: Any = "float32") -> Layer:
    """A fully connected classifier layer (stored as CSR), PyTorch-style uniform init."""
    bound = 1.0 / np.sqrt(n_in)
    w = rng.uniform(-bound, bound, size=(outputs, n_in)).astype(as_dtype(dtype))
    return Layer(sp.csr_matrix(w), np.zeros(outputs, dtype=as_dtype(dtype)))


def random_network(
    sizes: Sequence[int],
    fan_in: int | Sequence[int],
    *,
    seed: int | None = 0,
    head: int | None = None,
    cap: float | None = None,
    dtype: Any = "float32",
    activations: str | Sequence[str] = "relu",
) -> Network:
    """Random fixed fan-in layers n_0 -> n_1 -> ... -> n_L, topped by a dense classifier of
    ``head`` outputs when given (``--head``); ``activations``: the hidden layers', one for all
    or one per layer (spdnn.model.activations);
    ``fan_in``: one for every layer, or one per layer; a fan-in above a layer's inputs reads
    all of them (the command line refuses it instead: ``--fan-in`` larger than a layer is
    more likely a typo than a dense layer asked for).

    Without a head the last layer is linear (a regression/MSE output).
    """
    if len(sizes) < 2 or any(s < 1 for s in sizes):
        raise OptionError("sizes", "must hold at least two positive layer sizes")
    fans = [fan_in] * (len(sizes) - 1) if isinstance(fan_in, int) else list(fan_in)
    if len(fans) != len(sizes) - 1:
        raise OptionError("fan_in", f"lists {len(fans)} counts for {len(sizes) - 1} layers")
    if min(fans) < 1:
        raise OptionError("fan_in", f"must be at least 1, not {min(fans)}")
    rng = _rng(seed)
    dt = as_dtype(dtype)
    layers = [Layer(fixed_fan_in(n_out, n_in, f, rng, dt), np.zeros(n_out, dtype=dt))
              for n_in, n_out, f in zip(sizes[:-1], sizes[1:], fans)]
    if head:
        layers.append(dense_head(head, sizes[-1], rng, dt))
    return Network(layers=tuple(layers), cap=cap, output_activation="linear",
                   extra={"generator": "random", "seed": seed,
                          "fan_in": fan_in if isinstance(fan_in, int) else fans}
                   ).with_activations(activations)


def _grid(text: str | Sequence[int]) -> tuple[int, int]:
    try:
        h, w = (int(v) for v in (text.lower().split("x") if isinstance(text, str) else text))
    except ValueError:
        raise ValueError(f"grid {text!r}: expected HxW, for instance 16x16") from None
    if h < 1 or w < 1:
        raise ValueError(f"grid {text!r}: both sides must be positive")
    return h, w


def local_layer(inner: tuple[int, int], outer: tuple[int, int], radius: int,
                rng: np.random.Generator, dtype: Any = "float32") -> sp.csr_matrix:
    """Neuron (r, c) of an ``outer`` grid (row-major) reads the cells of the ``inner`` grid
    within ``radius`` (Chebyshev) of the cell under its centre; He-initialised values."""
    (hi, wi), (ho, wo) = inner, outer
    rows, cols = [], []
    for r in range(ho):
        cr = min(int((r + 0.5) * hi / ho), hi - 1)
        for c in range(wo):
            cc = min(int((c + 0.5) * wi / wo), wi - 1)
            for i in range(max(cr - radius, 0), min(cr + radius, hi - 1) + 1):
                for j in range(max(cc - radius, 0), min(cc + radius, wi - 1) + 1):
                    rows.append(r * wo + c)
                    cols.append(i * wi + j)
    rows_a, cols_a = np.array(rows), np.array(cols)
    fan_in = np.bincount(rows_a, minlength=ho * wo)
    vals = rng.standard_normal(len(rows_a)) * np.sqrt(2.0 / fan_in[rows_a])
    w = sp.csr_matrix((vals.astype(as_dtype(dtype)), (rows_a, cols_a)), shape=(ho * wo, hi * wi))
    w.sort_indices()
    return w


def local_network(
    image: str | Sequence[int],
    hidden: Sequence[str | Sequence[int]],
    *,
    radius: int = 1,
    seed: int | None = 0,
    head: int | None = None,
    shuffle: bool = True,
    cap: float | None = None,
    dtype: Any = "float32",
) -> Network:
    """Locally connected layers over an image (a convolution without weight sharing): the
    input is the image's pixels, row-major; each hidden layer is a grid of neurons reading a
    (2 radius + 1)^2 window of the grid below. With ``shuffle`` the hidden neurons are numbered
    in a random order (seeded), as the neurons of a pruned network carry no spatial order: a
    block partition then cuts about half the connections, and only a partitioner that reads
    the structure finds the spatial one. ``head``: a dense classifier of that many outputs on
    top (``--head``)."""
    if radius < 0:
        raise ValueError("radius must be >= 0")
    if not hidden:
        raise ValueError("local network needs at least one hidden grid")
    # Values and numbering from separate streams: shuffled or not, the same function.
    values, numbering = _rng(seed).spawn(2)
    dt = as_dtype(dtype)
    grids = [_grid(image), *(_grid(g) for g in hidden)]
    # below[i]: the spatial index of neuron i of the layer below (pixels keep their order).
    layers, below = [], np.arange(grids[0][0] * grids[0][1])
    for inner, outer in zip(grids[:-1], grids[1:]):
        n = outer[0] * outer[1]
        perm = numbering.permutation(n) if shuffle else np.arange(n)
        # Neuron i is spatial neuron perm[i]; its inputs are numbered as the layer below is.
        w = local_layer(inner, outer, radius, values, dt)[perm][:, below].tocsr()
        w.sort_indices()
        layers.append(Layer(w, np.zeros(n, dtype=dt)))
        below = perm
    if head:
        top = dense_head(head, layers[-1].n_out, values, dt)
        layers.append(Layer(sp.csr_matrix(top.weight.toarray()[:, below]), top.bias))
    return Network(layers=tuple(layers), cap=cap, output_activation="linear",
                   extra={"generator": "local", "radius": radius, "shuffle": shuffle,
                          "seed": seed})


def prune_dense(weights: Sequence[np.ndarray], biases: Sequence[np.ndarray | None],
                density: float, prune_last: bool = True) -> list[Layer]:
    """Magnitude pruning: keep the round(density * size) largest |w| of each layer (at least one
    per row so no neuron is cut off); ``prune_last=False`` keeps the last layer dense."""
    if not 0 < density <= 1:
        raise ValueError("density must be in (0, 1]")
    layers = []
    for k, (w, b) in enumerate(zip(weights, biases), start=1):
        w = np.asarray(w, dtype=np.float64)
        keep = np.ones(w.shape, dtype=bool)
        if prune_last or k < len(weights):
            n_keep = max(1, int(round(density * w.size)))
            flat = np.abs(w).ravel()
            # Stable order: ties go to the earlier entry.
            order = np.argsort(-flat, kind="stable")[:n_keep]
            keep = np.zeros(w.size, dtype=bool)
            keep[order] = True
            keep = keep.reshape(w.shape)
            keep[np.arange(w.shape[0]), np.argmax(np.abs(w), axis=1)] = True
        # Built from the mask so that a selected entry equal to zero stays in the pattern.
        r, c = np.nonzero(keep)
        m = sp.csr_matrix((w[r, c], (r, c)), shape=w.shape)
        m.sort_indices()
        bias = np.zeros(w.shape[0]) if b is None else np.asarray(b, dtype=np.float64)
        layers.append(Layer(m, bias))
    return layers


def add_head(network: Network, head: int, *, seed: int | None = 0) -> Network:
    """Top a network with a dense classifier of ``head`` outputs (``--head``); the output becomes
    linear."""
    top = dense_head(head, network.sizes[-1], _rng(seed), network.dtype)
    return Network(layers=(*network.layers, top), activations=(*network.activations, "relu"),
                   cap=network.cap, output_activation="linear",
                   extra={**network.extra, "head": head})
