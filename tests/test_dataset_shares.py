"""What a rank reads of a data set: a replica's share of each split's samples, only the split
an evaluation reads, C-ordered columns, and an npz member read without a second copy."""

from __future__ import annotations

import gzip
import struct
import tracemalloc

import numpy as np
import pytest

from spdnn.io.loaders import keep_share, load_dataset
from spdnn.io.npz import NpzReader


@pytest.fixture
def npz_file(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {"x_train": rng.random((11, 5)), "y_train": rng.integers(0, 3, 11),
              "x_test": rng.random((4, 5)), "y_test": rng.integers(0, 3, 4)}
    return tmp_path, arrays


@pytest.mark.parametrize("compressed", [False, True])
@pytest.mark.parametrize("features", [None, np.array([0, 2, 4])])
def test_a_share_is_the_rows_of_the_whole(npz_file, compressed, features):
    tmp, arrays = npz_file
    path = tmp / "d.npz"
    (np.savez_compressed if compressed else np.savez)(path, **arrays)
    cols = slice(None) if features is None else features
    for replicas in (1, 2, 3, 5):
        parts = [load_dataset(f"npz:{path}", "float64", features=features, share=(k, replicas))
                 for k in range(replicas)]
        for split in ("train", "test"):
            x = np.concatenate([getattr(p, f"x_{split}") for p in parts])
            np.testing.assert_array_equal(x, arrays[f"x_{split}"][:, cols])
            assert all(np.array_equal(getattr(p, f"y_{split}"), arrays[f"y_{split}"])
                       for p in parts)  # labels whole
        assert [p.train_rows.stop - p.train_rows.start for p in parts] == \
            [len(p.x_train) for p in parts]


def test_an_evaluation_reads_only_the_test_split(npz_file):
    tmp, arrays = npz_file
    np.savez(tmp / "both.npz", **arrays)
    data = load_dataset(f"npz:{tmp / 'both.npz'}", "float64", evaluate=True)
    assert data.x_train.shape == (0, 5) and data.train_rows == slice(0, 0)
    np.testing.assert_array_equal(data.x_test, arrays["x_test"])
    assert data.n_features == 5 and len(data.y_train) == 11
    np.savez(tmp / "train.npz", x_train=arrays["x_train"], y_train=arrays["y_train"])
    only = load_dataset(f"npz:{tmp / 'train.npz'}", "float64", evaluate=True)
    np.testing.assert_array_equal(only.x_train, arrays["x_train"])  # nothing else to evaluate


def _idx(path, a: np.ndarray) -> None:
    head = struct.pack(">BBBB", 0, 0, 8, a.ndim) + struct.pack(f">{a.ndim}I", *a.shape)
    with gzip.open(path, "wb") as fh:
        fh.write(head + a.astype(np.uint8).tobytes())


def test_mnist_shares_and_evaluation(tmp_path):
    rng = np.random.default_rng(1)
    images = {"train": rng.integers(0, 256, (9, 4, 4)), "t10k": rng.integers(0, 256, (5, 4, 4))}
    for stem, a in images.items():
        _idx(tmp_path / f"{stem}-images-idx3-ubyte.gz", a)
        _idx(tmp_path / f"{stem}-labels-idx1-ubyte.gz", rng.integers(0, 10, len(a)))
    spec = f"mnist:{tmp_path}"
    whole = load_dataset(spec, "float32", features=np.arange(16))
    features = np.array([1, 5, 6, 15])
    for k in range(3):
        part = load_dataset(spec, "float32", features=features, share=(k, 3))
        assert part.x_train.flags["C_CONTIGUOUS"]  # the columns taken are not a second copy
        np.testing.assert_array_equal(part.x_train, whole.x_train[part.train_rows][:, features])
        np.testing.assert_array_equal(part.x_test, whole.x_test[part.test_rows][:, features])
    seen = load_dataset(spec, "float32", features=features, evaluate=True)
    assert seen.x_train.shape == (0, 4) and len(seen.y_train) == 9
    np.testing.assert_array_equal(seen.x_test, whole.x_test[:, features])
    np.testing.assert_array_equal(keep_share(whole, (1, 2)).x_test, whole.x_test[3:])


def test_an_npz_member_is_read_without_a_second_copy(tmp_path):
    x = np.random.default_rng(2).random(2_500_000)  # 20 MB
    np.savez(tmp_path / "big.npz", x=x)
    with NpzReader(tmp_path / "big.npz", "test data") as npz:
        tracemalloc.start()
        got = npz.get("x")
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    np.testing.assert_array_equal(got, x)
    assert peak < 1.2 * x.nbytes, peak  # read as bytes and then copied: 2x


@pytest.mark.parametrize("chunk", [7, 20_000])
def test_an_xc_share_is_the_rows_of_the_whole_read_chunk_by_chunk(tmp_path, monkeypatch,
                                                                   chunk):
    """A replica keeps the features of its share alone (labels whole), cut chunk by chunk
    as the file is read: the same rows as the whole file's, at every chunk boundary."""
    import spdnn.io.xc as xc
    from spdnn.io.xc_synthetic import XCTask, synthetic_xc

    monkeypatch.setattr(xc, "CHUNK_LINES", chunk)
    x, y, xt, yt = synthetic_xc(XCTask(train_samples=23, test_samples=9, features=30,
                                       labels=12, features_per_sample=5), seed=1)
    xc.write_xc(tmp_path / "train.txt", x, y)
    xc.write_xc(tmp_path / "test.txt", xt, yt)
    whole = load_dataset(f"xc:{tmp_path}", "float64")
    for replicas in (1, 2, 3, 5):
        parts = [load_dataset(f"xc:{tmp_path}", "float64", share=(k, replicas))
                 for k in range(replicas)]
        for split in ("train", "test"):
            stacked = np.concatenate([getattr(p, f"x_{split}").toarray() for p in parts])
            np.testing.assert_array_equal(stacked, getattr(whole, f"x_{split}").toarray())
            for p in parts:
                rows = getattr(p, f"{split}_rows")
                assert getattr(p, f"x_{split}").shape[0] == rows.stop - rows.start
                assert np.array_equal(getattr(p, f"y_{split}").indices,
                                      getattr(whole, f"y_{split}").indices)  # labels whole
