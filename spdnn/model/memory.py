"""Each rank's memory, predicted from what it will hold: no MPI, no allocation.

A rank holds, per layer, its rows' values and int32 column indices, its bias, the row and
buffer-row maps and the owned/ghost split point of each row (``weights``); in training also
the gradient and momentum of every value and bias and, from layer 2 on, the transpose's
indices and int32 order (``training``); the step's activation blocks (X buffer, Z, ghost
partial sums and owned partial sums of every layer at the batch width), the exchange's message
buffers (shared by the layers: the largest layer's) and the evaluation's ping-pong blocks
(``buffers``); its share of the data (``data``, given); and the process itself: interpreter,
numpy, scipy, MPI and the loaded kernels (``baseline``, given: a job measures its own,
spdnn.runtime.memory_report.measure_baseline). docs/memory.md explains each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# The evaluation batch (spdnn.runtime.inference.eval_batch) keeps its blocks under this many
# bytes (at 65,536 neurons a batch of 1,024 held 0.8 GB, more than a training step's buffers).
EVAL_BLOCK_BYTES = 16 << 20
EVAL_BATCH = 1024
# Graph Challenge inputs per chunk (spdnn.runtime.inference.challenge_chunk): one dense
# activation block of about CHALLENGE_BLOCK_BYTES, and at least CHALLENGE_MIN_CHUNK inputs (the
# best chunks measured were of that block's size, but on the widest layers no fewer inputs than
# the minimum: the live columns must stay wide enough to vectorise).
CHALLENGE_BLOCK_BYTES = 16 << 20
CHALLENGE_MIN_CHUNK = 1024
# Bytes a message's buffer may take beyond its values and bitmaps: the encoded form's 16-byte
# header (spdnn.kernels.encoding), the bitmaps' last partial bytes and the 8-byte alignment.
MESSAGE_SLACK = 32


@dataclass(frozen=True, kw_only=True)
class LayerShape:
    """One rank's part of layer k: what its arrays are sized by."""

    nnz: int
    rows: int  # owned rows of layer k
    prev_rows: int  # owned rows of layer k-1
    ghosts: int  # ghost rows of layer k-1 received
    sent: int  # rows of layer k-1 sent to others

    @property
    def buffer_rows(self) -> int:
        return self.prev_rows + self.ghosts


@dataclass(frozen=True, kw_only=True)
class MemoryPrediction:
    """Bytes of one rank, by what holds them; ``total`` is the predicted peak."""

    weights: int
    training: int
    buffers: int
    data: int
    baseline: int

    @property
    def total(self) -> int:
        return self.weights + self.training + self.buffers + self.data + self.baseline

    def as_dict(self) -> dict[str, int]:
        return {"weights": self.weights, "training": self.training, "buffers": self.buffers,
                "data": self.data, "baseline": self.baseline, "total": self.total}


def replica_batch(batch: int, replicas: int) -> int:
    """The samples of a step that the largest replica computes (``Grid.share``)."""
    return -(-batch // max(1, replicas))


def eval_batch(layers: Sequence[LayerShape], itemsize: int) -> int:
    """The evaluation batch of one rank (``spdnn.runtime.inference.eval_batch``)."""
    widest = max(max(s.buffer_rows, s.rows) for s in layers)
    return max(1, min(EVAL_BATCH, EVAL_BLOCK_BYTES // (3 * max(widest, 1) * itemsize)))


def challenge_chunk(layers: Sequence[LayerShape], itemsize: int) -> int:
    """The Graph Challenge chunk of one rank (every rank takes the smallest of theirs)."""
    widest = max(max(s.buffer_rows, s.rows) for s in layers)
    return max(CHALLENGE_MIN_CHUNK, CHALLENGE_BLOCK_BYTES // (max(widest, 1) * itemsize))


def predict(layers: Sequence[LayerShape], *, batch: int, itemsize: int, training: bool,
            baseline: int, data_bytes: int = 0,
            challenge: bool = False, lsh_tables: int = 0, lsh_layer: int = -1,
            optimizer_arrays: int = 1, dropout: bool = False,
            stored: int | None = None, relu: bool = True) -> MemoryPrediction:
    """The peak of one rank running ``layers`` at ``batch`` in ``itemsize``-byte values:
    everything it holds at once (the training state, the step's blocks and an evaluation's
    blocks coexist at the end of an epoch). ``challenge``: inference in the Graph Challenge's
    chunks (their dense input block and last activations too) instead of evaluation
    batches. ``baseline``: the process's own bytes (measured by the job).
    ``lsh_tables``: L hash tables over the rows of layer ``lsh_layer`` (from 0; -1: the
    output layer), ``--lsh``. ``optimizer_arrays``: the optimizer's state arrays per value
    (SGD's momentum 1, Adam's moments 2: spdnn.optim.state_arrays); ``dropout``: each
    hidden layer's mask of the step (rows x batch values) and, while one is drawn, its
    64-bit counters (two blocks of the widest layer). ``stored``: the bytes of a value the
    products gather and the exchanges send, when not ``itemsize`` (bfloat16's 2 beside its
    float32 sums and master weights: the weights' 16-bit copy, the X blocks and one error
    block). ``relu``: every hidden layer is ReLU, whose slope the backward products apply
    as they write the next error block (another's applies to the owned partial sums)."""
    stored = itemsize if stored is None else stored
    copy = stored if stored != itemsize else 0  # the products' copy of the values
    weights = sum(s.nnz * (itemsize + copy + 4)  # values, int32 indices
                  + (s.rows + 1) * 4 + s.rows * 4  # row pointers, split points (int32)
                  + s.rows * (itemsize + 8)  # bias, global row ids
                  + s.buffer_rows * 8  # global id of each buffer row
                  + s.sent * 8 for s in layers)  # the exchange's send list (int64)
    # LSH: each table's int32 keys and rows; while they are rebuilt, every row's codes (int64)
    lsh = lsh_tables * layers[lsh_layer].rows * 8
    weights += lsh
    state = 0
    step = 0
    if training:
        # A sampled layer (LSH) keeps no transpose (its pairs' products run on W's rows) and,
        # as the output layer, no full Z; a compact gradient of the rows active in the step
        # (at most every row: counted as the full one) and its inputs' partial sums (samples x
        # buffer rows).
        sampled = layers[lsh_layer] if lsh_tables else None
        per_value = (1 + optimizer_arrays) * itemsize  # the gradient and the optimizer's state
        state = sum((s.nnz + s.rows) * per_value for s in layers)
        # the transposes (index, order, row pointers) of the layers that fold a
        # gradient back: not the first (no gradient with respect to the inputs)
        state += sum(s.nnz * 8 + (s.buffer_rows + 1) * 4 for s in layers[1:] if s is not sampled)
        state += sum(s.ghosts * 8 for s in layers[1:])  # the fold's index of ghost rows
        # Z of every layer and the ghost partial sums; under bfloat16 (no Z read backward)
        # one block: a layer's Z with its ghost rows' encoded arrivals after it (forward),
        # or the ghost partial sums (backward)
        ghosts = max(s.ghosts for s in layers)
        zs_ghosts = sum(s.rows for s in layers) + ghosts if not copy else \
            max(ghosts, max(s.rows + s.ghosts * (stored + 0.25 + MESSAGE_SLACK / batch)
                            / itemsize for s in layers))
        # owned partial sums: under bfloat16 only where partials are folded in or a slope
        # other than ReLU's applies to them (else the products write the next error block
        # rounded, and the blocks stay untouched), in one block (the error each layer
        # gathers is rounded into a block of its own); else two, taken in turn
        owned = [0 if copy and (i == 0 or (relu and s.sent == 0)) else s.prev_rows
                 for i, s in enumerate(layers)]
        blocks = 1 if copy else 2
        step = batch * itemsize * (
            zs_ghosts + sum(max([r for i, r in enumerate(owned) if i % blocks == b], default=0)
                            for b in range(blocks))) \
            + (1 + blocks) * itemsize  # each block's spare value
        step += batch * stored * sum(s.buffer_rows for s in layers)
        # the step's block of input samples, in the data's type (the rank's features x batch),
        # held through the step beside the X buffer it is copied into
        step += batch * itemsize * layers[0].prev_rows
        if copy:  # two error blocks rounded for the products, taken in turn
            step += 2 * batch * copy * max(s.rows for s in layers)
        if dropout:
            step += batch * (itemsize * sum(s.rows for s in layers[:-1])
                             + 16 * max(s.rows for s in layers))
        if sampled is not None:
            step += batch * itemsize * (sampled.buffer_rows
                                        - (sampled.rows if sampled is layers[-1] else 0))
    passes = challenge_chunk(layers, itemsize) if challenge else eval_batch(layers, itemsize)
    width = max(batch, passes) if training else passes
    # the message buffers (spdnn.runtime.halo): one for the rows sent, one for the ghost
    # rows, each the largest layer's. The rows sent: forward in ``stored`` bytes and two
    # bitmaps (the encoded form), backward the partial sums received in ``itemsize``. The
    # ghost rows: forward only (the partial sums go packed in place), and under bfloat16
    # a training step's arrivals are in its block (above): evaluation's alone. A message's
    # slack beyond them (at most a message per row).
    sent = max((s.sent for s in layers), default=0)
    ghosts = max((s.ghosts for s in layers), default=0)
    arrivals = passes if training and copy else width
    messages = int(width * sent * max(itemsize, stored + 0.25)
                   + arrivals * ghosts * (stored + 0.25)) + (sent + ghosts) * MESSAGE_SLACK
    evaluation = passes * (
        2 * stored * max(s.buffer_rows for s in layers) + itemsize * max(s.rows for s in layers)
        + itemsize * (layers[0].prev_rows + layers[-1].rows if challenge else 0))
    # LSH: the codes kept between rebuilds (as many bytes as the tables); each table's
    # directory (an int32 per 16 rows: hashing.DIRECTORY_SPAN) and a rebuild's log of changed
    # codes (32 bytes for each of 1 code in 100: hashing.REFRESH_SHARE)
    lsh += lsh_tables * layers[lsh_layer].rows * (4 / 16 + 32 / 100)
    buffers = step + messages + evaluation + lsh
    return MemoryPrediction(weights=int(weights), training=int(state), buffers=int(buffers),
                            data=int(data_bytes), baseline=int(baseline))


def shapes_of(work: object, part: int) -> list[LayerShape]:
    """One part's ``LayerShape``s from a ``spdnn.cost.workload.Workload`` (offline: from the
    network's patterns and the plan, no job)."""
    out = []
    for lw in work.layers:  # type: ignore[attr-defined]
        out.append(LayerShape(nnz=int(lw.nnz[part]), rows=int(lw.rows[part]),
                              prev_rows=int(lw.prev_rows[part]), ghosts=int(lw.ghosts[part]),
                              sent=int(lw.sent[part])))
    return out


def format_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"
