"""Extreme-classification data: the repository's text format (spdnn.io.xc) read and written, its
malformed files refused with one line; the synthetic task; label sets, their loss against a
plain computation and P@k."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from spdnn.errors import InputError
from spdnn.io.loaders import load_dataset
from spdnn.io.xc import read_xc, write_xc
from spdnn.io.xc_synthetic import XCTask, synthetic_xc
from spdnn.model.batching import columns
from spdnn.model.labels import MultiLabels, precision_at
from spdnn.model.ops import loss_and_gradient, top_k, top_rows
from tests.helpers import launch

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "xc-sample"


def _labels(rows: list[list[int]], n_labels: int) -> MultiLabels:
    indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    return MultiLabels(indptr, np.array([v for r in rows for v in sorted(r)], np.int64),
                       n_labels)


def test_shipped_sample_reads():
    data = load_dataset(f"xc:{SAMPLE}", "float64")
    assert data.multi_label and data.n_classes == 128 and data.n_features == 256
    assert data.x_train.shape == (600, 256) and data.x_test.shape == (150, 256)
    assert len(data.y_train) == 600 and data.y_train.counts.min() >= 1
    np.testing.assert_allclose(sp.linalg.norm(data.x_train, axis=1), 1, atol=1e-5)


def test_read_write_round_trip(tmp_path):
    f = tmp_path / "d.txt"
    f.write_text("4 6 5\n3,0 5:0.5 1:2\n 2:1.5e-3\n4\n\n")
    x, y = read_xc(f, "float64")
    assert x.shape == (4, 6)
    np.testing.assert_array_equal(x.toarray(), [[0, 2, 0, 0, 0, 0.5], [0, 0, 1.5e-3, 0, 0, 0],
                                                [0] * 6, [0] * 6])
    np.testing.assert_array_equal(y.indptr, [0, 2, 2, 3, 3])
    np.testing.assert_array_equal(y.indices, [0, 3, 4])  # sorted within a sample
    write_xc(tmp_path / "e.txt", x, y)
    x2, y2 = read_xc(tmp_path / "e.txt", "float64")
    assert (x2 != x).nnz == 0 and np.array_equal(y2.indices, y.indices) and \
        np.array_equal(y2.indptr, y.indptr)


def test_reader_streams_in_chunks(tmp_path, monkeypatch):
    import spdnn.io.xc as xc

    x, y, _, _ = synthetic_xc(XCTask(train_samples=230, test_samples=1, features=50,
                                     labels=20, features_per_sample=8), seed=3)
    write_xc(tmp_path / "d.txt", x, y)
    whole = read_xc(tmp_path / "d.txt", "float64")
    monkeypatch.setattr(xc, "CHUNK_LINES", 7)
    chunked = read_xc(tmp_path / "d.txt", "float64")
    assert (whole[0] != chunked[0]).nnz == 0
    assert np.array_equal(whole[1].indices, chunked[1].indices)
    # the bad line is found in a later chunk
    lines = (tmp_path / "d.txt").read_text().splitlines()
    lines[100] = lines[100] + " 7:x"
    (tmp_path / "d.txt").write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"d.txt:101: '7:x' is not integer:number"):
        read_xc(tmp_path / "d.txt")


@pytest.mark.parametrize("text, message", [
    ("", "header 'N D L'"),
    ("2 3\n", "header 'N D L'"),
    ("2 3 x\n", "header 'N D L'"),
    ("0 3 2\n", "samples must lie in"),
    ("1 3 2\n0 1:1\n1 1:1\n", ":3: more samples than the header's 1"),
    ("3 3 2\n0 1:1\n", "the header says 3 samples but the file has 1"),
    ("1 3 2\n2 1:1\n", ":2: label 2 outside \\[0, 2\\)"),
    ("1 3 2\n-1 1:1\n", ":2: label -1 outside"),
    ("1 3 2\n0,x 1:1\n", ":2: label 'x' is not an integer"),
    ("1 3 2\n0, 1:1\n", ":2: label '' is not an integer"),
    ("1 3 2\n0,0 1:1\n", ":2: a label is repeated"),
    ("1 3 2\n0 3:1\n", ":2: feature 3 outside \\[0, 3\\)"),
    ("1 3 2\n0 1:1 1:2\n", ":2: a feature is repeated"),
    ("1 3 2\n0 1:nan\n", ":2: feature 1 has the value nan"),
    ("1 3 2\n0 1:inf\n", ":2: feature 1 has the value inf"),
    ("1 3 2\n0 1\n", ":2: '1' is not feature:value"),
    ("1 3 2\n0 1:2:3\n", ":2: '1:2:3' is not feature:value"),
    ("1 3 2\n0 a:1\n", ":2: 'a:1' is not integer:number"),
    ("1 3 2\n0 1:1e999\n", ":2: feature 1 has the value inf"),
])
def test_malformed_files_get_one_line(tmp_path, text, message):
    f = tmp_path / "bad.txt"
    f.write_text(text)
    with pytest.raises(InputError, match=message):
        read_xc(f)


def test_binary_and_missing_files(tmp_path):
    (tmp_path / "b.txt").write_bytes(b"1 2 2\n\xff\xfe 0:1\n")
    with pytest.raises(InputError, match="not a UTF-8 text file"):
        read_xc(tmp_path / "b.txt")
    with pytest.raises(InputError, match="no such file"):
        read_xc(tmp_path / "none.txt")
    with pytest.raises(InputError, match="no such directory"):
        load_dataset(f"xc:{tmp_path / 'none'}")
    (tmp_path / "d").mkdir()
    with pytest.raises(InputError, match="train.txt: no such file"):
        load_dataset(f"xc:{tmp_path / 'd'}")
    (tmp_path / "d" / "train.txt").write_text("1 3 2\n0 1:1\n")
    (tmp_path / "d" / "test.txt").write_text("1 4 2\n0 1:1\n")
    with pytest.raises(InputError, match="test.txt: header has 4 features and 2 labels"):
        load_dataset(f"xc:{tmp_path / 'd'}")


def test_synthetic_task_shape_and_determinism():
    task = XCTask(train_samples=3000, test_samples=500, features=4000, labels=2000)
    x, y, xt, yt = synthetic_xc(task, seed=1)
    again = synthetic_xc(task, seed=1)
    assert (again[0] != x).nnz == 0 and np.array_equal(again[1].indices, y.indices)
    assert (synthetic_xc(task, seed=2)[0] != x).nnz > 0
    assert x.shape == (3000, 4000) and xt.shape == (500, 4000)
    assert 30 <= x.nnz / 3000 <= 50 and 2.5 <= len(y.indices) / 3000 <= 3.5
    np.testing.assert_allclose(sp.linalg.norm(x, axis=1), 1, atol=1e-5)
    # Zipf: the most frequent labels carry far more than their share, many never occur
    freq = np.sort(np.bincount(y.indices, minlength=2000))[::-1]
    assert freq[0] > 20 * freq.mean() and np.count_nonzero(freq == 0) > 200
    # learnable: a label's signature features occur far more often with it than without
    top = int(np.argmax(np.bincount(y.indices, minlength=2000)))
    has = y.contains(np.full(3000, top))
    lift = np.asarray(x[has].astype(bool).mean(axis=0)).ravel() / \
        np.maximum(np.asarray(x[~has].astype(bool).mean(axis=0)).ravel(), 1e-9)
    assert np.sort(lift)[-6:].min() > 5
    with pytest.raises(ValueError, match="labels per sample"):
        synthetic_xc(XCTask(labels=2, labels_per_sample=3))


def test_labels_select_and_hits():
    y = _labels([[3, 1], [], [0], [2, 4, 0]], 5)
    sub = y[np.array([3, 0, 0])]
    np.testing.assert_array_equal(sub.indptr, [0, 3, 5, 7])
    np.testing.assert_array_equal(sub.indices, [0, 2, 4, 1, 3, 1, 3])
    assert len(y[1:3]) == 2 and list(y[1:3].indices) == [0]
    np.testing.assert_array_equal(y.hits(np.array([[1, 3], [0, 1], [0, 2], [4, 1]])),
                                  [2, 0, 1, 1])
    np.testing.assert_array_equal(y.contains(np.array([3, 3, 0, 1])), [True, False, True, False])
    # -1 (nothing predicted) is no label, not the previous sample's last one
    np.testing.assert_array_equal(_labels([[4], [0]], 5).hits(np.array([[-1], [-1]])), [0, 0])
    assert precision_at(y, np.array([[1, 0], [0, 1], [0, 2], [4, 1]]), 1) == 0.75
    assert precision_at(y, np.array([[1, 0], [0, 1], [0, 2], [4, 1]]), 2) == 3 / 8


def test_multi_label_loss_against_a_plain_computation():
    rng = np.random.default_rng(0)
    out = rng.standard_normal((6, 4))
    y = _labels([[0, 5], [2], [], [1, 3, 4]], 6)
    value, grad = loss_and_gradient(out, y, "cross_entropy")
    target = np.zeros((6, 4))
    for i, labels in enumerate([[0, 5], [2], [], [1, 3, 4]]):
        target[labels, i] = 1 / len(labels) if labels else 0
    logp = out - np.log(np.exp(out).sum(axis=0))
    expected = -(target * logp).sum(axis=0)
    assert value == pytest.approx(expected.sum() / 4, rel=1e-12)
    plain = (np.exp(logp) - target) / 4
    plain[:, 2] = 0  # a sample with no labels: no gradient
    np.testing.assert_allclose(grad, plain, atol=1e-15)
    # the gradient is the loss's: a finite difference
    eps, k = 1e-6, (3, 3)
    bumped = out.copy()
    bumped[k] += eps
    assert (loss_and_gradient(bumped, y, "cross_entropy")[0] - value) / eps == \
        pytest.approx(grad[k], rel=1e-4)
    with pytest.raises(ValueError, match="cross_entropy"):
        loss_and_gradient(out, y, "mse")


def test_top_k_breaks_ties_by_row():
    out = np.array([[1.0, 0.0], [3.0, 2.0], [3.0, 2.0], [0.5, 5.0]])
    np.testing.assert_array_equal(top_k(out, 3), [[1, 2, 0], [3, 1, 2]])


@pytest.mark.parametrize("n, k", [(20_000, 5), (20_000, 1), (40, 5), (12, 5), (3, 5)])
def test_top_rows_equal_a_stable_sort(n, k):
    rng = np.random.default_rng(n + k)
    out = rng.standard_normal((n, 9)).round(1)  # many ties, at the k-th value too
    out[:, 0] = 0.5  # a column of equal values
    out[:, 1] = -0.0  # signed zeros compare equal
    out[::2, 1] = 0.0
    np.testing.assert_array_equal(top_rows(out, k), np.argsort(-out, axis=0, kind="stable")[:k])


def test_sparse_columns_equal_the_dense_ones():
    x = sp.random(30, 50, density=0.2, format="csr", random_state=1, dtype=np.float32)
    idx = np.array([4, 0, 29, 4, 7])  # a repeated sample
    got = columns(x, idx)
    assert got.flags.c_contiguous and got.dtype == np.float32
    np.testing.assert_array_equal(got, x.toarray()[idx].T)
    # duplicate entries of a row sum, as toarray sums them
    dup = sp.csr_matrix((np.array([1.0, 2.0, 4.0], np.float32), np.array([3, 3, 0]),
                         np.array([0, 2, 3])), shape=(2, 5))
    np.testing.assert_array_equal(columns(dup, slice(0, 2)), dup.toarray().T)


def test_generate_and_train_from_the_command_line(tmp_path):
    r = launch(0, "generate", "xc-data", "--samples", "300", "--features", "200", "--labels",
               "100", "-o", tmp_path / "xc", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "300 + 60 samples" in r.stdout
    r = launch(0, "generate", "random", "--sizes", "200,32,100", "--fan-in", "32", "-o",
               tmp_path / "n.npz", cwd=tmp_path)
    r = launch(0, "train", "--network", tmp_path / "n.npz", "--data", f"xc:{tmp_path / 'xc'}",
               "--epochs", "2", "--lr", "0.5", "--metrics-out", tmp_path / "m.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "test P@1" in r.stdout
    import json

    epochs = json.loads((tmp_path / "m.json").read_text())["epochs"]
    assert all(0 <= e["precision_at_1"] <= 1 and 0 <= e["precision_at_5"] <= 1 for e in epochs)
    r = launch(0, "train", "--network", tmp_path / "n.npz", "--data", f"xc:{tmp_path / 'xc'}",
               "--epochs", "1", "--save", tmp_path / "t.npz", cwd=tmp_path)
    r = launch(0, "infer", "--network", tmp_path / "t.npz", "--inputs", f"xc:{tmp_path / 'xc'}",
               "--metrics-out", tmp_path / "i.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "P@1" in r.stdout and "on 60 samples" in r.stdout
    m = json.loads((tmp_path / "i.json").read_text())
    assert m["accuracy"] == m["precision_at_1"] and 0 <= m["precision_at_5"] <= 1
    r = launch(0, "generate", "xc-data", "--labels", "2", "--labels-per-sample", "3", "-o",
               tmp_path / "bad", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "labels per sample" in r.stderr
