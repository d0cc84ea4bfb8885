"""The hypergraph over the neurons of all layers (docs/partitioner.md).

Vertices: every neuron of layers 0..L, numbered layer after layer (``offsets[k] + i``).
Vertex weight of neuron i of layer k >= 1: nnz(W_k[i, :]); layer 0 carries no work (weight 0).
Nets: for every neuron j of layer k-1 (k = 1..L) one net {j} U {i : W_k[i, j] != 0}. Net weights
follow the objective: ``train`` weighs 1 for k = 1 (forward only) and 2 for k >= 2 (forward expand
+ backward fold); ``infer`` weighs every net 1 (forward only). Either way the connectivity-1
metric of a partition equals the runtime's volume in rows exactly (training step or inference).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from spdnn.errors import InputError, SpdnnError
from spdnn.io.atomic import write_text
from spdnn.model.plan import Pattern

from ._kernels import connectivity, contract_nets


@dataclass(frozen=True, kw_only=True)
class Hypergraph:
    offsets: np.ndarray  # offsets[k] = first vertex of layer k; offsets[-1] = n_vertices
    vertex_weights: np.ndarray  # int64, 0 for layer 0
    net_indptr: np.ndarray  # CSR of nets -> pins (pins sorted, the source neuron first)
    net_pins: np.ndarray
    net_weights: np.ndarray  # int64
    net_layer: np.ndarray  # k-1: the layer of the net's source neuron

    @property
    def n_vertices(self) -> int:
        return int(self.offsets[-1])

    @property
    def n_nets(self) -> int:
        return len(self.net_indptr) - 1

    @property
    def n_layers(self) -> int:
        """L: the number of weight layers (vertex layers are 0..L)."""
        return len(self.offsets) - 2

    def layer_of(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.offsets) - 1), np.diff(self.offsets))

    def incidence(self) -> sp.csr_matrix:
        """Vertices x nets, 1 where the vertex is a pin of the net."""
        rows = np.repeat(np.arange(self.n_nets), np.diff(self.net_indptr))
        m = sp.csr_matrix((np.ones(len(self.net_pins), dtype=np.int64), (rows, self.net_pins)),
                          shape=(self.n_nets, self.n_vertices))
        return m.T.tocsr()

    def split(self, parts: np.ndarray) -> list[np.ndarray]:
        """A global part vector as one owner array per layer."""
        return [parts[self.offsets[k]:self.offsets[k + 1]].astype(np.int32)
                for k in range(len(self.offsets) - 1)]


OBJECTIVES = ("train", "infer")


def check_objective(objective: str) -> None:
    if objective not in OBJECTIVES:
        raise SpdnnError(f"unknown objective '{objective}' (choose from {', '.join(OBJECTIVES)})")


def build_hypergraph(patterns: Sequence[Pattern], *, objective: str = "train",
                     first_layer: int = 1) -> Hypergraph:
    """Vectorised construction from the layers' CSR patterns; ``objective`` sets net weights.
    ``first_layer``: the network's number of ``patterns[0]`` (a window of a larger network
    starting past layer 1 weighs its first nets as a later layer's)."""
    check_objective(objective)
    fold = 1 if objective == "train" else 0
    sizes = [patterns[0][2][1]] + [shape[0] for _, _, shape in patterns]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    weights = [np.zeros(sizes[0], dtype=np.int64)]
    ptr_parts, pin_parts, netw, netl = [np.zeros(1, dtype=np.int64)], [], [], []
    total = 0
    for k, (indptr, indices, shape) in enumerate(patterns, start=1):
        weights.append(np.diff(indptr).astype(np.int64))
        n_in = shape[1]
        # Column j's users: the rows of W_k^T.
        wt = sp.csr_matrix((np.ones(len(indices), dtype=np.int8), indices, indptr),
                           shape=shape).T.tocsr()
        wt.sort_indices()
        users = np.diff(wt.indptr)
        sizes_k = users + 1
        # Pins: source neuron first, then its users in layer k.
        starts = np.concatenate([[0], np.cumsum(sizes_k)])
        pins = np.empty(int(starts[-1]), dtype=np.int64)
        pins[starts[:-1]] = offsets[k - 1] + np.arange(n_in)
        mask = np.ones(len(pins), dtype=bool)
        mask[starts[:-1]] = False
        pins[mask] = offsets[k] + wt.indices
        ptr_parts.append(total + starts[1:])
        total += int(starts[-1])
        pin_parts.append(pins)
        netw.append(np.full(n_in, 1 if k + first_layer - 1 == 1 else 1 + fold, dtype=np.int64))
        netl.append(np.full(n_in, k - 1, dtype=np.int32))
    return Hypergraph(offsets=offsets, vertex_weights=np.concatenate(weights),
                      net_indptr=np.concatenate(ptr_parts),
                      net_pins=np.concatenate(pin_parts), net_weights=np.concatenate(netw),
                          net_layer=np.concatenate(netl))


def layer_limits(hg: Hypergraph, nparts: int, epsilon: float) -> np.ndarray:
    """Each layer's most work per block: (1 + epsilon) * average + its heaviest vertex."""
    limits = np.full(len(hg.offsets) - 1, np.inf)
    for k in range(len(limits)):
        w = hg.vertex_weights[hg.offsets[k]:hg.offsets[k + 1]]
        if w.sum() > 0:
            limits[k] = (1 + epsilon) * w.sum() / nparts + w.max()
    return limits


def balanced(hg: Hypergraph, parts: np.ndarray, nparts: int, limits: np.ndarray) -> bool:
    """Whether every layer's blocks are within its limit."""
    for k in range(len(hg.offsets) - 1):
        lo, hi = hg.offsets[k], hg.offsets[k + 1]
        loads = np.bincount(parts[lo:hi], weights=hg.vertex_weights[lo:hi], minlength=nparts)
        if loads.max(initial=0) > limits[k] + 1e-9:
            return False
    return True


def km1(hg: Hypergraph, parts: np.ndarray) -> int:
    """Connectivity-1 of a partition, weighted by net weights."""
    nparts = int(parts.max()) + 1
    lam = connectivity(hg.net_indptr, hg.net_pins, np.ascontiguousarray(parts, np.int64), nparts)
    return int(np.sum((lam.astype(np.int64) - 1).clip(min=0) * hg.net_weights))


def write_hmetis(hg: Hypergraph, path: str | os.PathLike) -> None:
    """hMETIS format (fmt 11: net and vertex weights), 1-based pins.

    Zero vertex weights (layer 0) are written as 1, as hMETIS-family tools require >= 1.
    Nets with a single pin are kept so that net numbering matches this hypergraph.
    """
    lines = [f"{hg.n_nets} {hg.n_vertices} 11"]
    for e in range(hg.n_nets):
        pins = hg.net_pins[hg.net_indptr[e]:hg.net_indptr[e + 1]] + 1
        lines.append(f"{hg.net_weights[e]} " + " ".join(map(str, pins)))
    lines += [str(max(1, int(w))) for w in hg.vertex_weights]
    write_text(path, "\n".join(lines) + "\n")


def read_partition(path: str | os.PathLike, *, n_vertices: int, parts: int) -> np.ndarray:
    """A partition file in the hMETIS convention: one 0-based block id per line, one per vertex."""
    p = os.fspath(path)
    if not os.path.isfile(p):
        raise InputError(p, "no such file")
    ids: list[int] = []
    with open(p, encoding="ascii", errors="strict") as fh:
        try:
            for lineno, line in enumerate(fh, start=1):
                text = line.strip()
                if not text:
                    continue
                if not text.lstrip("-").isdigit():
                    raise InputError(p, f"block id must be an integer, found '{text[:40]}'",
                                     lineno)
                b = int(text)
                if not 0 <= b < parts:
                    raise InputError(p, f"block id {b} out of range [0, {parts})", lineno)
                ids.append(b)
                if len(ids) > n_vertices:  # stop reading: no need to hold a huge file
                    break
        except UnicodeDecodeError as exc:
            raise InputError(p, f"not a text file of block ids ({exc.reason} at byte "
                                f"{exc.start})") from None
    if len(ids) != n_vertices:
        more = "more than " if len(ids) > n_vertices else ""
        raise InputError(p, f"has {more}{len(ids) - bool(more)} block ids, the hypergraph has "
                            f"{n_vertices} vertices")
    return np.array(ids, dtype=np.int32)


def contract(hg: Hypergraph, cluster: np.ndarray) -> tuple[Hypergraph, np.ndarray]:
    """Merge vertices into clusters (never across layers); returns the coarse hypergraph and
    the coarse vertex of every fine vertex. Coarse km1 equals fine km1 of any partition that
    keeps clusters whole. Nets reduced to one pin are dropped, duplicate pins merged."""
    layer = hg.layer_of()
    key = layer.astype(np.int64) * (int(cluster.max()) + 1) + cluster
    uniq, coarse_of = np.unique(key, return_inverse=True)
    coarse_layer = uniq // (int(cluster.max()) + 1)
    n_layers = len(hg.offsets) - 1
    offsets = np.searchsorted(coarse_layer, np.arange(n_layers + 1)).astype(np.int64)
    weights = np.bincount(coarse_of, weights=hg.vertex_weights, minlength=len(uniq))
    indptr, pins, kept = contract_nets(hg.net_indptr, hg.net_pins, coarse_of, len(uniq))
    coarse = Hypergraph(offsets=offsets, vertex_weights=weights.astype(np.int64),
                        net_indptr=indptr, net_pins=pins, net_weights=hg.net_weights[kept],
                        net_layer=hg.net_layer[kept])
    return coarse, coarse_of
