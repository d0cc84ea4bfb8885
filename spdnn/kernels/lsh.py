"""Locality-sensitive hashing of a layer's neurons (SLIDE: Chen et al., MLSys 2020): what
``--lsh`` asks for, the rebuild schedule, and the active sets built around the tables'
retrieval (the cap, the random fill, the neurons of largest bias, the labels). The hash
functions and the tables: spdnn.kernels.hashing. No MPI.

``--lsh LAYER:K:L[:dwta|simhash]`` puts L tables of K functions each on a layer. The tables
are rebuilt from the current weights at step 0, then after 1, 2, 4, ... steps (the period
doubling up to ``--rehash N``: the first steps move the weights most), then after periods of
N steps each 10% longer than the one before (SLIDE's exponentially growing period), and at
every checkpoint step, so that a resumed run rebuilds exactly what an uninterrupted one does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from spdnn.kernels.ranges import segment_ids
from spdnn.model.labels import MultiLabels

KINDS = ("dwta", "simhash")
REHASH_GROWTH_DIVISOR = 10  # each rebuild period is 1/10 longer than the last


@dataclass(frozen=True, kw_only=True)
class LshSpec:
    """What ``--lsh`` asked for: L tables of K functions on layer ``layer`` (from 1)."""

    layer: int
    k: int
    tables: int
    kind: Literal["dwta", "simhash"] = "dwta"
    max_active: int | None = None  # --lsh-max-active: retrieved neurons kept per sample
    random: int = 0  # --lsh-random: random output neurons added per sample in training
    top_bias: int = 0  # --lsh-top-bias: the neurons of largest bias, added to every sample
    estimate_tail: bool = False  # --lsh-estimate-tail: the random neurons stand for the rest

    def text(self) -> str:
        cap = f", at most {self.max_active} per sample" if self.max_active else ""
        fill = f", {self.random} random" if self.random else ""
        tail = " standing for the rest" if self.estimate_tail else ""
        top = f", the {self.top_bias} largest biases" if self.top_bias else ""
        return f"{self.layer}:{self.k}:{self.tables}:{self.kind}{cap}{fill}{tail}{top}"


def parse_lsh(text: str, max_active: int | None = None, random: int = 0,
              top_bias: int = 0, estimate_tail: bool = False) -> LshSpec:
    """``LAYER:K:L[:dwta|simhash]`` (and ``--lsh-max-active``, ``--lsh-random``,
    ``--lsh-top-bias``, ``--lsh-estimate-tail``)."""
    parts = text.strip().split(":")
    if len(parts) not in (3, 4):
        raise ValueError(f"{text!r}: write LAYER:K:L[:dwta|simhash], e.g. 2:6:50")
    try:
        layer, k, tables = (int(p) for p in parts[:3])
    except ValueError:
        raise ValueError(f"{text!r}: LAYER, K and L must be integers") from None
    kind = parts[3].lower() if len(parts) == 4 else "dwta"
    if kind not in KINDS:
        raise ValueError(f"{text!r}: unknown hash {parts[3]!r}; choose dwta or simhash")
    top = 20 if kind == "dwta" else 62  # the bucket id must fit 62 bits
    if not 1 <= k <= top:
        raise ValueError(f"{text!r}: K must lie in [1, {top}] for {kind}, not {k}")
    if not 1 <= tables <= 1000:
        raise ValueError(f"{text!r}: L must lie in [1, 1000], not {tables}")
    if layer < 1:
        raise ValueError(f"{text!r}: layers count from 1")
    if max_active is not None and not 1 <= max_active < 2**31:
        raise ValueError(f"the cap on active neurons must be a positive count, not {max_active}")
    if not 0 <= random < 2**31:
        raise ValueError(f"the random neurons per sample must be a count >= 0, not {random}")
    if not 0 <= top_bias < 2**31:
        raise ValueError(f"the neurons of largest bias must be a count >= 0, not {top_bias}")
    if estimate_tail and not random:
        raise ValueError("the tail's estimate needs random neurons (--lsh-random N > 0): "
                         "they are its sample of the outputs not retrieved")
    return LshSpec(layer=layer, k=k, tables=tables, kind=kind, max_active=max_active,
                   random=random, top_bias=top_bias, estimate_tail=estimate_tail)


def check_lsh_layer(spec: LshSpec | None, sizes: tuple[int, ...], *,
                    loss: str = "cross_entropy", activations: tuple[str, ...] = ()) -> None:
    """LSH selects neurons of one layer of the network (layers count from 1); the labels, the
    random top-up and the largest biases join the output layer's only, and draw at most as
    many neurons as it has. A sampled output layer trains with softmax cross-entropy over its
    active neurons; above a sampled hidden layer the network's own ``loss`` applies. A sampled
    hidden layer is ReLU (its neurons left out give exact zeros): ``activations``, per hidden
    layer."""
    from spdnn.errors import SpdnnError

    n_layers = len(sizes) - 1
    if spec is not None and spec.layer > n_layers:
        raise SpdnnError(f"--lsh {spec.text()}: layer {spec.layer} is beyond the network's "
                         f"{n_layers} layers")
    if spec is not None and spec.layer == n_layers and loss != "cross_entropy":
        raise SpdnnError(f"--lsh {spec.text()} samples the output layer, which trains with "
                         f"the cross_entropy loss (softmax over the active outputs), not {loss}")
    if spec is not None and spec.layer < n_layers and spec.layer <= len(activations) and \
            activations[spec.layer - 1] != "relu":
        raise SpdnnError(f"--lsh {spec.text()}: layer {spec.layer} computes "
                         f"{activations[spec.layer - 1]}; a sampled hidden layer is ReLU (the "
                         "neurons it leaves out must give exact zeros)")
    if spec is not None and spec.layer < n_layers and (
            spec.random or spec.top_bias or spec.estimate_tail):
        raise SpdnnError(f"--lsh {spec.text()}: layer {spec.layer} is hidden; --lsh-random, "
                         "--lsh-top-bias and --lsh-estimate-tail apply to the output layer")
    if spec is not None and spec.random > sizes[-1]:
        raise SpdnnError(f"--lsh-random {spec.random} is more than the output layer's "
                         f"{sizes[-1]} neurons")
    if spec is not None and spec.top_bias > sizes[-1]:
        raise SpdnnError(f"--lsh-top-bias {spec.top_bias} is more than the output layer's "
                         f"{sizes[-1]} neurons")


def is_rebuild_step(step: int, first: int, checkpoint_every: int | None = None) -> bool:
    """Whether the tables are rebuilt before step ``step`` (0-based): at 0; after periods of
    1, 2, 4, ... steps, doubling until ``first`` (``--rehash``); then after ``first`` steps and
    each period 10% longer than the last; and at every checkpoint step. Tables built from the
    initial weights and kept ``first`` steps killed most of the hidden layer at high learning
    rates (the first steps move the weights most, and the retrieved neurons were those of the
    weights at step 0)."""
    if step == 0 or (checkpoint_every and step % checkpoint_every == 0):
        return True
    at, period = 0, 1
    while at < step:
        at += period
        if period < first:
            period = min(2 * period, first)
        else:
            period += -(-period // REHASH_GROWTH_DIVISOR)  # 10% longer, rounded up, in integers
    return at == step


def cap_keys(hits: np.ndarray, global_rows: np.ndarray, n_out: int, seed: int,
             layer: int) -> np.ndarray:
    """The order in which ``--lsh-max-active`` keeps a sample's retrieved neurons: more tables
    first, then a seeded random order of the neurons (the same on every grid); larger first."""
    priority = np.random.default_rng([seed, 0xCA9, layer]).permutation(n_out)
    return hits * n_out + priority[global_rows]


def cap_threshold(keys: np.ndarray, samples: np.ndarray, batch: int, cap: int
                  ) -> np.ndarray:
    """Per sample, the cap-th largest of its keys (-1 when it has at most ``cap``), from
    ``keys`` of (sample, key) pairs: also how the ranks' candidates merge."""
    order = np.lexsort((-keys, samples))
    start = np.searchsorted(samples[order], np.arange(batch))
    rank = np.arange(len(order)) - start[samples[order]]
    out = np.full(batch, -1, dtype=np.int64)
    at = order[rank == cap - 1]
    out[samples[at]] = keys[at]
    return out


def local_candidates(samples: np.ndarray, joined: np.ndarray, keys: np.ndarray, cap: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(sample, key) of each sample's ``cap`` best retrieved pairs here, not those that joined
    (what a rank offers to the merge); ``samples``: the sample of each pair, ascending."""
    cand = np.flatnonzero(~joined)
    order = cand[np.lexsort((-keys[cand], samples[cand]))]
    s = samples[order]
    first = np.searchsorted(s, s)  # where each sample's run starts
    keep = order[np.arange(len(order)) - first < cap]
    return samples[keep], keys[keep]


def apply_cap(ptr: np.ndarray, act: np.ndarray, mass: np.ndarray, hits: np.ndarray,
              global_rows: np.ndarray, spec: LshSpec, n_out: int, seed: int,
              gather: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """At most ``spec.max_active`` retrieved neurons per sample (the labels, random and
    top-bias neurons kept besides them: ``retrieve`` counts them in more hits than there are
    tables; the others when their key reaches the sample's threshold), the same ones on every
    grid: ``gather`` merges every rank's candidates (identity on one)."""
    cap = int(spec.max_active or 0)
    batch = len(ptr) - 1
    samples = segment_ids(ptr)
    joined = hits > spec.tables
    keys = cap_keys(hits, global_rows, n_out, seed, spec.layer)
    cand_samples, cand = gather(*local_candidates(samples, joined, keys, cap))
    threshold = cap_threshold(cand, cand_samples, batch, cap)
    keep = joined | (keys >= threshold[samples])
    new_ptr = np.zeros(batch + 1, dtype=np.int64)
    np.cumsum(np.bincount(samples[keep], minlength=batch), out=new_ptr[1:])
    return new_ptr, act[keep], mass[keep], hits[keep]


def tail_pairs(hits: np.ndarray, mass: np.ndarray, global_rows: np.ndarray, top: np.ndarray,
               tables: int) -> np.ndarray:
    """The active pairs that joined as random neurons only: no table retrieved them
    (``retrieve`` gives a joined row one hit more than the tables, plus its tables' hits),
    not a label (no target mass), not a neuron of largest bias (``top``, global rows)."""
    return (hits == tables + 1) & (mass == 0) & ~np.isin(global_rows, top)


def tail_weights(others: np.ndarray, randoms: np.ndarray, n_out: int) -> np.ndarray:
    """Per sample, the weight of each of its random pairs in the softmax: the outputs outside
    its other active pairs over its random ones (both counted over every rank), so that the
    random pairs' terms estimate the sum over every output not retrieved, as sampled
    softmax does with a uniform proposal (Bengio and Senecal 2008); 0 without random pairs."""
    return np.where(randoms > 0, (n_out - others) / np.maximum(randoms, 1), 0.0)


def fill_rows(seed: int, step: int, batch: int, count: int, n_out: int) -> np.ndarray:
    """The random output neurons (global ids) that join each sample's active set at this step
    (SLIDE tops its retrieved sets up with random neurons): (batch x count), drawn for the whole
    minibatch from (seed, step), so that every grid draws the same for a sample."""
    return np.random.default_rng([seed, 0xF111, step]).integers(0, n_out, (batch, count))


def top_bias_rows(bias: np.ndarray, rows: np.ndarray, count: int,
                  gather: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
                  ) -> np.ndarray:
    """The global rows of the ``count`` largest biases of the layer (ties: the lower row),
    ascending, from each rank's own best (``bias`` of its ``rows``) merged by ``gather``
    (identity on one). Training pushes the biases of frequent labels up at every sample that
    carries them; these neurons join every sample's active set so that the others push them
    down as well, as exact training does."""
    mine = np.arange(len(bias))
    if 0 < count < len(bias):  # the candidates: at least the count-th largest (a partition,
        cut = np.partition(bias, len(bias) - count)[len(bias) - count]  # not a full sort)
        if np.isfinite(cut):
            mine = np.flatnonzero(bias >= cut)
    mine = mine[np.lexsort((rows[mine], -bias[mine]))[:count]]
    values, ids = gather(bias[mine].astype(np.float64), rows[mine].astype(np.int64))
    return np.sort(ids[np.lexsort((ids, -values))[:count]])


def forced(labels: MultiLabels | None, fill: np.ndarray | None, dtype: np.dtype,
           batch: int, top: np.ndarray | None = None
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The neurons that join the active sets besides the retrieved ones, as CSR over the
    samples: (ptr, global rows, target mass): the labels (their mass), the random fill (0) and
    the ``top`` rows (0, every sample)."""
    parts = []
    if labels is not None:
        parts.append((labels.samples(), labels.indices, labels.weights(dtype)))
    if fill is not None and fill.size:
        parts.append((np.repeat(np.arange(batch), fill.shape[1]), fill.ravel(),
                      np.zeros(fill.size, dtype)))
    if top is not None and top.size:
        parts.append((np.repeat(np.arange(batch), len(top)), np.tile(top, batch),
                      np.zeros(batch * len(top), dtype)))
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, dtype)
    samples, rows, mass = (np.concatenate(a) for a in zip(*parts))
    order = np.argsort(samples, kind="stable")
    ptr = np.zeros(batch + 1, dtype=np.int64)
    np.cumsum(np.bincount(samples, minlength=batch), out=ptr[1:])
    return ptr, rows[order].astype(np.int64), mass[order].astype(dtype)
