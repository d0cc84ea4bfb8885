"""The Extreme Classification Repository's sparse text format (``--data xc:DIR``).

A header line ``N D L`` (samples, features, labels), then one line per sample::

    label,label,... feature:value feature:value ...

with 0-based labels and features; a sample with no labels starts with a space (an empty line
is a sample with neither). The reader
streams the file in chunks of lines (the real sets run to gigabytes), parses each chunk with
numpy, and only when a chunk does not parse goes line by line to name the first bad line.
Features of a line must be distinct (labels are sorted and must be distinct too); values
finite. The result is a CSR matrix of the features and the label sets (spdnn.model.labels).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from spdnn.errors import InputError
from spdnn.io.atomic import atomic_path
from spdnn.io.paths import check_input_file
from spdnn.model.batching import share_of
from spdnn.model.labels import MultiLabels

# Lines parsed at a time: the parse holds each token as a numpy string (about 60 bytes), so a
# chunk's memory grows with its lines while the time to read a file does not fall: a chunk ten
# times larger held three times the memory and read no faster.
CHUNK_LINES = 2_000
MAX_SIZE = 2**31 - 1  # features and labels are int32 indices


def _header(path: Path, line: str) -> tuple[int, int, int]:
    parts = line.split()
    try:
        n, d, labels = (int(p) for p in parts) if len(parts) == 3 else (None, None, None)
    except ValueError:
        n = d = labels = None
    if n is None or d is None or labels is None:
        raise InputError(path, "the first line must be the header 'N D L' (samples, features, "
                               f"labels), not {line.strip()[:60]!r}", 1)
    for name, v in (("samples", n), ("features", d), ("labels", labels)):
        if not 1 <= v <= MAX_SIZE:
            raise InputError(path, f"header: {name} must lie in [1, {MAX_SIZE}], not {v}", 1)
    return n, d, labels


def _line_error(line: str, d: int, n_labels: int) -> str:
    """What is wrong with one line (the slow path, only after a chunk failed)."""
    head, _, rest = line.partition(" ") if not line.startswith(" ") else ("", "", line)
    labels: list[int] = []
    for tok in head.split(",") if head else []:
        try:
            labels.append(int(tok))
        except ValueError:
            return f"label {tok[:20]!r} is not an integer"
        if not 0 <= labels[-1] < n_labels:
            return f"label {labels[-1]} outside [0, {n_labels})"
    if len(set(labels)) != len(labels):
        return "a label is repeated"
    seen: set[int] = set()
    for tok in rest.split():
        f, colon, v = tok.partition(":")
        if not colon or ":" in v:
            return f"{tok[:30]!r} is not feature:value"
        try:
            fi, fv = int(f), float(v)
        except ValueError:
            return f"{tok[:30]!r} is not integer:number"
        if not 0 <= fi < d:
            return f"feature {fi} outside [0, {d})"
        if not np.isfinite(fv):
            return f"feature {fi} has the value {v}"
        if fi in seen:
            return f"feature {fi} is repeated"
        seen.add(fi)
    return "does not parse"


def _parse_chunk(lines: list[str], d: int, n_labels: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """Label counts, labels, feature counts, features, values of a chunk; the last element is
    the index of the first bad line (-1: none)."""
    heads, rests = [], []
    for line in lines:
        if line.startswith(" "):
            heads.append("")
            rests.append(line)
        else:
            h, _, r = line.partition(" ")
            heads.append(h)
            rests.append(r)
    empty = np.zeros(0, dtype=np.int64)
    bad = (empty, empty, empty, empty, np.zeros(0), 0)
    try:
        n_lab = np.array([h.count(",") + 1 if h else 0 for h in heads], dtype=np.int64)
        labels = np.array(",".join(h for h in heads if h).split(","), dtype=np.int64) \
            if n_lab.sum() else empty
        n_feat = np.array([r.count(":") for r in rests], dtype=np.int64)
        toks = np.array(" ".join(rests).split())
        if len(toks) != n_feat.sum() or (len(toks) and np.any(np.char.count(toks, ":") != 1)):
            return bad
        pairs = np.char.partition(toks, ":") if len(toks) else np.zeros((0, 3), dtype=str)
        features = pairs[:, 0].astype(np.int64)
        values = pairs[:, 2].astype(np.float64)
    except ValueError:
        return bad
    return n_lab, labels, n_feat, features, values, -1


def _first_bad(path: Path, lines: list[str], first: int, d: int, n_labels: int) -> InputError:
    for i, line in enumerate(lines):
        problem = _line_error(line, d, n_labels)
        if problem != "does not parse":
            return InputError(path, problem, first + i)
    return InputError(path, "does not parse", first)


def _sorted_rows(indptr: np.ndarray, cols: np.ndarray, *vals: np.ndarray) -> tuple:
    """Sort each row's entries by column; also the position of the first repeated one (-1)."""
    rows = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    order = np.lexsort((cols, rows))
    cols = cols[order]
    same = np.flatnonzero((cols[1:] == cols[:-1]) & (rows[order][1:] == rows[order][:-1]))
    return (cols, *(v[order] for v in vals), int(rows[order][same[0]]) if len(same) else -1)


def read_xc(path: str | os.PathLike, dtype: np.dtype | str = "float32", *,
            share: tuple[int, int] | None = None) -> tuple[sp.csr_matrix, MultiLabels]:
    """Features (samples x D, CSR) and label sets of one file. ``share`` = (replica,
    replicas): the features of that share of the samples alone (``share_of``; every line is
    still checked, chunk by chunk, and the label sets stay whole)."""
    path = Path(check_input_file(path, "data file"))
    parts: list[tuple] = []
    try:
        with open(path, encoding="utf-8", newline=None) as fh:
            n, d, n_labels = _header(path, fh.readline())
            keep = slice(0, n) if share is None else share_of(n, *share)
            line_no = 2
            while True:
                lines = [ln.rstrip("\n") for ln in itertools.islice(fh, CHUNK_LINES)]
                if not lines:
                    break
                if line_no - 2 + len(lines) > n:
                    raise InputError(path, f"more samples than the header's {n}",
                                     n + 2)
                *arrays, failed = _parse_chunk(lines, d, n_labels)
                n_lab, labels, n_feat, features, values = arrays
                if failed < 0:
                    problem = None
                    for what, v, top in (("label", labels, n_labels), ("feature", features, d)):
                        out = np.flatnonzero((v < 0) | (v >= top))
                        if len(out):
                            problem = f"{what} {v[out[0]]} outside [0, {top})"
                            counts = n_lab if what == "label" else n_feat
                            failed = int(np.searchsorted(np.cumsum(counts), out[0], "right"))
                            break
                    if problem is None and not np.all(np.isfinite(values)):
                        at = int(np.flatnonzero(~np.isfinite(values))[0])
                        failed = int(np.searchsorted(np.cumsum(n_feat), at, "right"))
                        problem = f"feature {features[at]} has the value {values[at]}"
                    if problem is not None:
                        raise InputError(path, problem, line_no + failed)
                    lab_ptr = np.concatenate([[0], np.cumsum(n_lab)])
                    feat_ptr = np.concatenate([[0], np.cumsum(n_feat)])
                    labels, rep_l = _sorted_rows(lab_ptr, labels)
                    features, values, rep_f = _sorted_rows(feat_ptr, features, values)
                    if rep_l >= 0 or rep_f >= 0:
                        row = min(r for r in (rep_l, rep_f) if r >= 0)
                        what = "a label" if row == rep_l else "a feature"
                        raise InputError(path, f"{what} is repeated", line_no + row)
                    # the samples of this chunk in the share: [a, b) of its lines
                    first = line_no - 2
                    a = min(max(keep.start - first, 0), len(lines))
                    b = max(min(keep.stop - first, len(lines)), a)
                    f0, f1 = feat_ptr[a], feat_ptr[b]
                    parts.append((n_lab, labels.astype(np.int64), n_feat[a:b],
                                  features[f0:f1].astype(np.int32), values[f0:f1].astype(dtype)))
                else:
                    raise _first_bad(path, lines, line_no, d, n_labels)
                line_no += len(lines)
    except UnicodeDecodeError:
        raise InputError(path, "is not a UTF-8 text file") from None
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    found = line_no - 2
    if found != n:
        raise InputError(path, f"the header says {n} samples but the file has {found}")
    lab_ptr = np.concatenate([[0], np.cumsum(np.concatenate([p[0] for p in parts]))])
    feat_ptr = np.concatenate([[0], np.cumsum(np.concatenate([p[2] for p in parts]))])
    x = sp.csr_matrix((np.concatenate([p[4] for p in parts]),
                       np.concatenate([p[3] for p in parts]), feat_ptr),
                      shape=(keep.stop - keep.start, d))
    return x, MultiLabels(lab_ptr.astype(np.int64), np.concatenate([p[1] for p in parts]),
                          n_labels)


def write_xc(path: str | os.PathLike, x: sp.csr_matrix, labels: MultiLabels) -> None:
    """Write features and label sets in the repository's format (atomically)."""
    x = sp.csr_matrix(x, copy=True)
    x.sort_indices()
    with atomic_path(path, "the data file") as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(f"{x.shape[0]} {x.shape[1]} {labels.n_labels}\n")
        for start in range(0, x.shape[0], CHUNK_LINES):
            rows = []
            for i in range(start, min(start + CHUNK_LINES, x.shape[0])):
                lab = ",".join(map(str, labels.indices[labels.indptr[i]:labels.indptr[i + 1]]))
                lo, hi = x.indptr[i], x.indptr[i + 1]
                feats = " ".join(f"{f}:{v:.6g}" for f, v in zip(x.indices[lo:hi].tolist(),
                                                                 x.data[lo:hi].tolist()))
                rows.append(f"{lab} {feats}".rstrip() if feats else lab)
            fh.write("\n".join(rows) + "\n")
