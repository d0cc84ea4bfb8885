"""Graph Challenge input images: a binary ``.npz`` form (a sparse pattern, read in seconds where
a 60,000-image Matrix Market file takes minutes) and challenge-shaped images made from MNIST.

The challenge's inputs are the 60,000 MNIST training images resized to 32x32, 64x64, 128x128 or
256x256 and made binary, flattened column by column (pixel (r, c) is feature c * size + r).
The resize here is bicubic (Keys, a = -0.5, pixel-area aligned, edges replicated: what MATLAB's
``imresize`` does when enlarging) and a pixel is on when its resized grey level exceeds
``CHALLENGE_THRESHOLD``, the level at which the 32x32 images of the first 1,200 MNIST images
have the density of the official subset.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from spdnn.errors import InputError
from spdnn.io.atomic import atomic_path
from spdnn.io.formats import read_inputs
from spdnn.io.idx import read_idx
from spdnn.io.npz import NpzReader
from spdnn.model.choices import CHALLENGE_SIZES, CHALLENGE_THRESHOLD
from spdnn.model.csr import as_dtype, cast_values

_CHUNK = 2000  # images resized at a time (256x256 float64: 1 GB)
_BLOCK_ENTRIES = 1 << 22  # entries read at a time (16 MB of int32 indices)


@dataclass(frozen=True)
class ImageShare:
    """Some consecutive images of a file: ``matrix`` holds images first .. first + rows - 1
    of the ``total`` the file holds, and of their features those in ``features`` (all when
    None)."""

    matrix: sp.csr_matrix
    first: int
    total: int
    features: np.ndarray | None = None


def read_images(path: str | os.PathLike, n_features: int) -> sp.csr_matrix:
    """Input images from ``.npz`` (this module's form), ``.mtx`` or ``.tsv``."""
    return read_image_share(path, n_features).matrix


def read_image_share(path: str | os.PathLike, n_features: int,
                     share: Callable[[int], slice] | None = None, *,
                     features: np.ndarray | None = None,
                     dtype: np.dtype | str | None = None) -> ImageShare:
    """The images ``share(total)`` of a file (all when ``share`` is None), with only the
    feature columns ``features`` (ascending; all when None), in ``dtype`` (default float32 for
    a pattern, float64 for values). From ``.npz`` the images are read, selected and converted
    in blocks: a rank holds its share of its columns and one block, never the whole share
    (``.mtx`` and ``.tsv`` are read whole first)."""
    if features is not None:
        features = np.asarray(features, dtype=np.int64)
        if features.ndim != 1 or (len(features) and (
                features[0] < 0 or features[-1] >= n_features
                or np.any(np.diff(features) <= 0))):
            raise ValueError(f"features must ascend within 0..{n_features - 1}")
    if not os.fspath(path).endswith(".npz"):
        images = read_inputs(path, n_features)
        part = share(images.shape[0]) if share is not None else slice(0, images.shape[0])
        m = sp.csr_matrix(images[part])
        if features is not None:
            m = sp.csr_matrix(m[:, features])
        if dtype is not None:
            m.data = cast_values(m.data, dtype, os.fspath(path), "the images")
        return ImageShare(m, part.start, images.shape[0], features)
    return _read_npz(path, n_features, share, features, dtype)


def read_image_npz(path: str | os.PathLike, n_features: int) -> sp.csr_matrix:
    """Members ``shape`` (2 integers), ``indptr``, ``indices`` (CSR, int64 or int32) and an
    optional ``data`` (default: every entry 1); validated before any use."""
    return _read_npz(path, n_features, None, None, None).matrix


def _check_npz(r: NpzReader, p: str, n_features: int) -> tuple[np.ndarray, bool]:
    """The file's row pointers (int64) and whether it holds values, its headers checked."""
    r.check_headers()
    shape = r.get("shape")
    if shape.shape != (2,) or shape.dtype.kind not in "iu":
        raise InputError(p, "key 'shape' must hold two integers (images, features)")
    n_rows, n_cols = int(shape[0]), int(shape[1])
    if n_cols != n_features:
        raise InputError(p, f"has {n_cols} features per image, the network takes "
                            f"{n_features}")
    if n_rows < 1:
        raise InputError(p, "no inputs (the file holds no images)")
    for key in ("indptr", "indices"):
        dims, kind = r.header(key)
        if len(dims) != 1 or kind.kind not in "iu":
            raise InputError(p, f"key '{key}' must be a 1-D integer array")
    if r.header("indptr")[0] != (n_rows + 1,):
        raise InputError(p, f"key 'indptr' must hold {n_rows + 1} entries (images + 1)")
    indptr = r.get("indptr").astype(np.int64, copy=False)
    nnz = r.header("indices")[0][0]
    if indptr[0] != 0 or indptr[-1] != nnz or np.any(np.diff(indptr) < 0):
        raise InputError(p, "key 'indptr' must rise from 0 to the number of indices")
    has_data = "data" in r.keys
    if has_data and r.header("data")[0] != (nnz,):
        raise InputError(p, "key 'data' must hold one value per index")
    return indptr, has_data


def _read_npz(path: str | os.PathLike, n_features: int, share: Callable[[int], slice] | None,
              features: np.ndarray | None, dtype: np.dtype | str | None) -> ImageShare:
    p = os.fspath(path)
    with NpzReader(p, "images") as r:
        indptr, has_data = _check_npz(r, p, n_features)
        n_rows = len(indptr) - 1
        part = share(n_rows) if share is not None else slice(0, n_rows)
        dtype = as_dtype(dtype if dtype is not None else
                         np.float64 if has_data else np.float32)  # a pattern: 4 bytes a pixel
        m = _SelectedRows(r, p, indptr[part.start:part.stop + 1], n_features, features,
                          has_data).read(dtype)
    m.sum_duplicates()  # also sorts each row's indices
    return ImageShare(m, part.start, n_rows, features)


def image_share_nbytes(path: str | os.PathLike, n_features: int,
                       share: Callable[[int], slice] | None = None, *,
                       features: np.ndarray | None = None,
                       dtype: np.dtype | str = np.float32) -> int:
    """The bytes ``read_image_share`` will hold for these arguments (values, int32 indices,
    row pointers), counted from the file without holding it: a job's memory check comes
    before anything is read. ``.npz`` only; 0 for ``.mtx`` and ``.tsv`` (read whole)."""
    p = os.fspath(path)
    if not p.endswith(".npz"):
        return 0
    with NpzReader(p, "images") as r:
        indptr, has_data = _check_npz(r, p, n_features)
        part = share(len(indptr) - 1) if share is not None else slice(0, len(indptr) - 1)
        rows = _SelectedRows(r, p, indptr[part.start:part.stop + 1], n_features, features,
                             has_data)
        entries = int(rows.row_pointers()[-1])
    index = 4 if max(entries, n_features) < 2**31 else 8
    return entries * (as_dtype(dtype).itemsize + index) + (part.stop - part.start + 1) * index


class _SelectedRows:
    """Some consecutive rows of an images file, with some of their columns, read and checked
    block by block (a block: about _BLOCK_ENTRIES entries) into arrays of the final size."""

    def __init__(self, r: NpzReader, path: str, indptr: np.ndarray, n_cols: int,
                 features: np.ndarray | None, has_data: bool) -> None:
        self.r, self.path, self.indptr, self.n_cols, self.has_data = (
            r, path, indptr, n_cols, has_data)
        self.column = None  # a file column's place among ``features``, or -1
        if features is not None:
            self.column = np.full(n_cols, -1, np.int32)
            self.column[features] = np.arange(len(features), dtype=np.int32)
        self.n_out = n_cols if features is None else len(features)
        # A compressed member cannot be read in place: it is read whole, once.
        self.whole = {key: r.get(key) for key in ("indices", "data")
                      if key in r.keys and not r.stored(key)}
        rows = len(indptr) - 1
        self.blocks = [0]
        while self.blocks[-1] < rows:
            b = self.blocks[-1]
            self.blocks.append(max(b + 1, int(np.searchsorted(
                indptr, indptr[b] + _BLOCK_ENTRIES, side="right")) - 1))

    def _span(self, key: str, lo: int, hi: int) -> np.ndarray:
        if key in self.whole:
            return self.whole[key][lo:hi]
        return self.r.span(key, lo, hi - lo)

    def _block(self, b0: int, b1: int) -> tuple[np.ndarray, np.ndarray | None]:
        """The file columns of rows [b0, b1), checked, and which of them are kept."""
        lo, hi = int(self.indptr[b0]), int(self.indptr[b1])
        indices = self._span("indices", lo, hi)
        if hi > lo and (int(indices.min()) < 0 or int(indices.max()) >= self.n_cols):
            raise InputError(self.path, f"key 'indices' holds a feature outside "
                                        f"0..{self.n_cols - 1}")
        return indices, None if self.column is None else self.column[indices] >= 0

    def row_pointers(self) -> np.ndarray:
        """The selection's row pointers (int64): a first pass over the indices, checking
        them, when only some columns are kept."""
        rows = len(self.indptr) - 1
        base = self.indptr - self.indptr[0]
        if self.column is None:
            return base
        out_ptr = np.zeros(rows + 1, np.int64)
        for b0, b1 in zip(self.blocks[:-1], self.blocks[1:]):
            _, kept = self._block(b0, b1)
            before = np.concatenate([[0], np.cumsum(kept, dtype=np.int64)])
            local = base[b0:b1 + 1] - base[b0]
            out_ptr[b0 + 1:b1 + 1] = before[local[1:]] - before[local[:-1]]
        np.cumsum(out_ptr, out=out_ptr)
        return out_ptr

    def read(self, dtype: np.dtype) -> sp.csr_matrix:
        rows = len(self.indptr) - 1
        out_ptr = self.row_pointers()
        indices = np.empty(int(out_ptr[-1]), np.int32)
        data = np.empty(int(out_ptr[-1]), dtype)
        for b0, b1 in zip(self.blocks[:-1], self.blocks[1:]):
            cols, kept = self._block(b0, b1)
            lo, hi = int(self.indptr[b0]), int(self.indptr[b1])
            o0, o1 = int(out_ptr[b0]), int(out_ptr[b1])
            indices[o0:o1] = cols if kept is None else self.column[cols[kept]]
            if not self.has_data:
                data[o0:o1] = 1
                continue
            values = cast_values(self._span("data", lo, hi), dtype, self.path, "key 'data'")
            data[o0:o1] = values if kept is None else values[kept]
        return sp.csr_matrix((data, indices, out_ptr), shape=(rows, self.n_out))


def write_image_npz(path: str | os.PathLike, images: sp.spmatrix) -> None:
    """Write images in the ``.npz`` form (values dropped when all are 1)."""
    m = sp.csr_matrix(images)
    m.sort_indices()
    arrays = {"shape": np.array(m.shape, dtype=np.int64), "indptr": m.indptr.astype(np.int64),
              "indices": m.indices.astype(np.int32)}
    if not np.all(m.data == 1):
        arrays["data"] = m.data
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)


def _keys(x: np.ndarray, a: float = -0.5) -> np.ndarray:
    ax = np.abs(x)
    near = (a + 2) * ax**3 - (a + 3) * ax**2 + 1
    far = a * ax**3 - 5 * a * ax**2 + 8 * a * ax - 4 * a
    return np.where(ax <= 1, near, np.where(ax < 2, far, 0.0))


def bicubic_weights(n_in: int, n_out: int) -> np.ndarray:
    """The n_out x n_in matrix of a 1-D bicubic resize (output pixel centres mapped onto the
    input's, edges replicated)."""
    scale = n_out / n_in
    centre = np.arange(1, n_out + 1) / scale + 0.5 * (1 - 1 / scale)  # 1-based input coordinate
    taps = np.floor(centre - 2)[:, None] + np.arange(6)[None, :]
    w = _keys(centre[:, None] - taps)
    w /= w.sum(axis=1, keepdims=True)
    source = np.clip(taps, 1, n_in).astype(np.int64) - 1
    m = np.zeros((n_out, n_in))
    for i in range(n_out):
        np.add.at(m[i], source[i], w[i])
    return m


def challenge_images(mnist_dir: str | os.PathLike, size: int, count: int = 60_000,
                     threshold: float = CHALLENGE_THRESHOLD,
                     progress: Callable[[int, int], None] | None = None) -> sp.csr_matrix:
    """The first ``count`` MNIST training images as binary size x size challenge inputs."""
    if size not in CHALLENGE_SIZES:
        raise ValueError(f"image size must be one of {CHALLENGE_SIZES}, not {size}")
    d = Path(mnist_dir)
    names = [d / "train-images-idx3-ubyte.gz", d / "train-images-idx3-ubyte"]
    found = [f for f in names if f.is_file()]
    if not found:
        raise InputError(d, "no MNIST training images (train-images-idx3-ubyte[.gz])")
    raw = read_idx(found[0])
    if raw.ndim != 3 or raw.shape[1:] != (28, 28):
        raise InputError(found[0], f"expected 28x28 images, found shape {raw.shape}")
    if not 1 <= count <= len(raw):
        raise InputError(found[0], f"asked for {count:,} images, the file holds {len(raw):,}")
    m = bicubic_weights(28, size)
    parts = []
    for start in range(0, count, _CHUNK):
        x = raw[start:min(count, start + _CHUNK)].astype(np.float64) / 255.0
        resized = m @ x @ m.T  # (n, size, size)
        # Column by column, as the challenge flattens (MATLAB order).
        on = resized.transpose(0, 2, 1).reshape(len(x), -1) > threshold
        parts.append(sp.csr_matrix(on, dtype=np.float32))
        if progress is not None:
            progress(start + len(x), count)
    return sp.vstack(parts, format="csr")
