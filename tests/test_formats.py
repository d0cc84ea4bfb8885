import gzip
import os
import re

import numpy as np
import pytest
import scipy.sparse as sp

from spdnn.errors import InputError
from spdnn.io.formats import (
    read_categories,
    read_inputs,
    read_mtx,
    read_triples,
    write_categories,
    write_mtx,
    write_triples,
)
from spdnn.io.graphchallenge import read_graphchallenge, write_graphchallenge
from spdnn.io.idx import read_idx, write_idx
from spdnn.model.generate import radixnet


def _random_sparse(shape=(7, 5), density=0.4, seed=0):
    m = sp.random(*shape, density=density, random_state=seed, format="csr")
    m.data = np.random.default_rng(seed).standard_normal(m.nnz)  # full float64 precision
    return m


def test_mtx_round_trip_is_exact(tmp_path):
    m = _random_sparse()
    write_mtx(tmp_path / "m.mtx", m, "a comment")
    back = read_mtx(tmp_path / "m.mtx")
    assert back.shape == m.shape and (back != m).nnz == 0


def test_mtx_pattern_and_comments(tmp_path):
    (tmp_path / "p.mtx").write_text(
        "%%MatrixMarket matrix coordinate pattern general\n% c\n%%GraphBLAS type bool\n"
        "3 2 2\n1 1\n3 2\n")
    assert read_mtx(tmp_path / "p.mtx").toarray().tolist() == [[1, 0], [0, 0], [0, 1]]


def test_triples_round_trip(tmp_path):
    m = _random_sparse((6, 9), seed=3)
    write_triples(tmp_path / "m.tsv", m)
    r, c, v, shape = read_triples(tmp_path / "m.tsv", (6, 9))
    assert (sp.csr_matrix((v, (r, c)), shape=shape) != m).nnz == 0


def test_graphchallenge_round_trip_transposes(tmp_path):
    net = radixnet(1024, 7, seed=5)
    write_graphchallenge(net, tmp_path)
    first = (tmp_path / "n1024-l1.tsv").read_text().splitlines()[0].split("\t")
    # TSV row = input neuron, column = output neuron: entry (i, j) is W[j, i].
    i, j = int(first[0]) - 1, int(first[1]) - 1
    assert net.layers[0].weight[j, i] == pytest.approx(float(first[2]))
    back = read_graphchallenge(tmp_path, bias=-0.3, cap=32)
    assert back.sizes == net.sizes and back.fingerprint() == net.fingerprint()
    for a, b in zip(net.layers, back.layers):
        assert (a.weight != b.weight).nnz == 0
    assert back.output_activation == "relu" and back.cap == 32
    assert len(read_graphchallenge(tmp_path, -0.3, 32, n_layers=3).layers) == 3


def test_categories_round_trip(tmp_path):
    write_categories(tmp_path / "c.tsv", np.array([3, 10, 7]))
    assert read_categories(tmp_path / "c.tsv").tolist() == [3, 7, 10]
    (tmp_path / "c.mtx").write_text(
        "%%MatrixMarket matrix coordinate pattern general\n9 1 2\n4 1\n2 1\n")
    assert read_categories(tmp_path / "c.mtx").tolist() == [2, 4]


def test_inputs_tsv_and_mtx_agree(tmp_path):
    m = _random_sparse((5, 8), seed=4)
    write_triples(tmp_path / "x.tsv", m)
    write_mtx(tmp_path / "x.mtx", m)
    a, b = read_inputs(tmp_path / "x.tsv", 8), read_inputs(tmp_path / "x.mtx", 8)
    assert (a != b).nnz == 0
    with pytest.raises(InputError, match="has 8 columns, expected 9"):
        read_inputs(tmp_path / "x.mtx", 9)


@pytest.mark.parametrize("gz", [False, True])
def test_idx_round_trip(tmp_path, gz):
    a = np.random.default_rng(0).integers(0, 256, size=(4, 3, 2), dtype=np.uint8)
    f = tmp_path / ("a.idx.gz" if gz else "a.idx")
    write_idx(f, a)
    np.testing.assert_array_equal(read_idx(f), a)


# ------------------------------------------------------------------- bad input, by line


@pytest.mark.parametrize(
    "text, problem, line",
    [
        ("1\t1\t0.5\n2\t2\n", "expected 3 fields, found 2", 2),
        ("1\t1\t0.5\n2\tx\t1\n", "non-numeric field 'x'", 2),
        ("1\t1\t0.5\n0\t2\t1\n", "row index 0 is not a 1-based index (must be >= 1)", 2),
        ("1\t1\t0.5\n\n3\t9\t1\n", "column index 9 out of range [1, 4]", 3),
        ("1\t1.5\t0.5\n", "column index 1.5 is not an integer", 1),
        ("1\t1\tnan\n", "non-finite value", 1),
    ],
)
def test_bad_tsv(tmp_path, text, problem, line):
    f = tmp_path / "w.tsv"
    f.write_text(text)
    with pytest.raises(InputError) as err:
        read_triples(f, (4, 4))
    assert str(err.value) == f"{f}:{line}: {problem}"


@pytest.mark.parametrize(
    "text, problem",
    [
        ("1 1 1\n", ":1: missing '%%MatrixMarket matrix ...' header"),
        ("%%MatrixMarket matrix array real general\n2 2\n", "unsupported Matrix Market type"),
        ("%%MatrixMarket matrix coordinate real symmetric\n", "unsupported Matrix Market symmetry"),
        ("%%MatrixMarket matrix coordinate real general\n3 3 3\n1 1 1\n2 2 2\n",
         "truncated: size line says 3 entries, found 2"),
        ("%%MatrixMarket matrix coordinate real general\n3 3 1\n4 1 1\n",
         ":3: row index 4 out of range [1, 3]"),
        ("%%MatrixMarket matrix coordinate real general\n3 3 2\n1 1 1\n1 1 2\n",
         "duplicate entry"),
        ("%%MatrixMarket matrix coordinate real general\n3 x 2\n", ":2: size line must be"),
    ],
)
def test_bad_mtx(tmp_path, text, problem):
    f = tmp_path / "m.mtx"
    f.write_text(text)
    with pytest.raises(InputError, match=None) as err:
        read_mtx(f)
    assert str(err.value).startswith(str(f)) and problem in str(err.value)


def test_bad_idx(tmp_path):
    a = np.zeros((3, 2, 2), dtype=np.uint8)
    write_idx(tmp_path / "a.idx", a)
    raw = (tmp_path / "a.idx").read_bytes()
    (tmp_path / "cut.idx.gz").write_bytes(gzip.compress(raw[:-3]))
    with pytest.raises(InputError, match="truncated: header promises 12 data bytes, found 9"):
        read_idx(tmp_path / "cut.idx.gz")
    (tmp_path / "magic.idx").write_bytes(b"\x01\x02" + raw[2:])
    with pytest.raises(InputError, match="bad magic number"):
        read_idx(tmp_path / "magic.idx")
    with pytest.raises(InputError, match="no such file"):
        read_idx(tmp_path / "missing.idx")


def test_graphchallenge_directory_problems(tmp_path):
    with pytest.raises(InputError, match="no Graph Challenge layer files"):
        read_graphchallenge(tmp_path, -0.3, 32)
    (tmp_path / "n4-l1.tsv").write_text("1\t1\t1\n")
    (tmp_path / "n4-l3.tsv").write_text("1\t1\t1\n")
    with pytest.raises(InputError, match="missing layer file n4-l2.tsv"):
        read_graphchallenge(tmp_path, -0.3, 32)
    (tmp_path / "n4-l2.tsv").write_text("1\t5\t1\n")
    with pytest.raises(InputError, match=r"n4-l2.tsv:1: column index 5 out of range"):
        read_graphchallenge(tmp_path, -0.3, 32)


def test_training_npz_round_trip_and_errors(tmp_path):
    from spdnn.io.loaders import load_npz

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((6, 4)), np.array([0, 2, 1, 1, 0, 2])
    np.savez(tmp_path / "d.npz", x_train=x, y_train=y, x_test=x[:2], y_test=y[:2])
    data = load_npz(tmp_path / "d.npz", "float64")
    np.testing.assert_array_equal(data.x_train, x)
    np.testing.assert_array_equal(data.y_train, y)
    np.testing.assert_array_equal(data.x_test, x[:2])
    assert data.n_features == 4 and data.n_classes == 3
    np.savez(tmp_path / "bad.npz", x_train=x, y_train=y[:5])
    with pytest.raises(InputError, match="one label per row"):
        load_npz(tmp_path / "bad.npz")
    np.savez(tmp_path / "nan.npz", x_train=np.full((2, 2), np.nan), y_train=[0, 1])
    with pytest.raises(InputError, match="finite"):
        load_npz(tmp_path / "nan.npz")


def test_a_rank_reads_only_its_columns_of_an_npz_data_set(tmp_path, monkeypatch):
    from spdnn.io import loaders

    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((700, 30)), rng.integers(0, 3, 700)
    np.savez(tmp_path / "d.npz", x_train=x, y_train=y, x_test=x[:50], y_test=y[:50])
    np.savez_compressed(tmp_path / "z.npz", x_train=x, y_train=y)
    monkeypatch.setattr(loaders, "ROW_BLOCK_BYTES", 30 * 8 * 64)  # blocks of 64 rows
    mine = np.array([1, 4, 5, 29])
    for name in ("d.npz", "z.npz"):  # stored: read in place; compressed: read whole
        data = loaders.load_dataset(f"npz:{tmp_path / name}", "float32", features=mine)
        np.testing.assert_array_equal(data.x_train, x[:, mine].astype(np.float32))
        assert data.n_features == 30 and data.features is mine
    np.testing.assert_array_equal(data.y_train, y)
    data = loaders.load_dataset(f"npz:{tmp_path / 'd.npz'}", "float32", features=mine)
    np.testing.assert_array_equal(data.x_test, x[:50, mine].astype(np.float32))
    x[650, 7] = np.inf  # outside the columns kept: still refused
    np.savez(tmp_path / "bad.npz", x_train=x, y_train=y)
    with pytest.raises(InputError, match="x_train: non-finite value"):
        loaders.load_dataset(f"npz:{tmp_path / 'bad.npz'}", "float32", features=mine)


@pytest.mark.long
def test_a_large_matrix_market_file_reads_fast_and_alike(tmp_path):
    """scipy's reader takes the well-formed file (the same matrix as the line parser's); what
    it would misread (0x10 as 0, 2x as 2, a fourth field skipped) goes to the line parser,
    which names the line."""
    import time

    from spdnn.io import formats

    rng = np.random.default_rng(0)
    m = sp.random(20_000, 1024, density=0.1, format="csr", random_state=rng)
    m.data = np.round(m.data * 255)
    write_mtx(tmp_path / "big.mtx", m)
    start = time.perf_counter()
    fast = read_mtx(tmp_path / "big.mtx")
    took = time.perf_counter() - start
    lines = (tmp_path / "big.mtx").read_text().splitlines()
    slow = formats._read_mtx_lines(str(tmp_path / "big.mtx"), lines)
    assert (fast != slow).nnz == 0 and fast.dtype == slow.dtype and fast.has_sorted_indices
    print(f"{m.nnz:,} entries in {took:.2f} s")
    head = "%%MatrixMarket matrix coordinate real general\n3 3 2\n"
    for body, message in (("1 1 0x10\n2 3 4\n", ":3: non-numeric field '0x10'"),
                          ("1 1 2x\n2 3 4\n", ":3: non-numeric field '2x'"),
                          ("1 1 2 9\n2 3 4\n", ":3: expected 3 fields, found 4"),
                          ("1 1 1e999\n2 3 4\n", ":3: non-finite value"),
                          ("1 1 2\n1 1 4\n", "duplicate entry"),
                          ("1.5 1 2\n2 3 4\n", ":3: row index 1.5 is not an integer"),
                          ("1 1 2\n", "truncated: size line says 2 entries, found 1")):
        (tmp_path / "bad.mtx").write_text(head + body)
        with pytest.raises(InputError, match=re.escape(message)):
            read_mtx(tmp_path / "bad.mtx")


@pytest.mark.parametrize("y, problem", [
    (np.array([0, 2**63, 1], dtype=np.uint64), r"beyond 2\^63"),
    (np.array([0.0, np.inf, 1.0]), "NaN or infinity"),
    (np.array([0.0, 1.5, 1.0]), "fractions"),
    (np.array([0, -1, 1]), "negative label"),
    (np.array(["a", "b", "c"]), "integer labels, not <U1"),
])
def test_labels_that_would_wrap_or_are_not_integers_are_refused(tmp_path, y, problem):
    """In a file and in memory alike (one check): never a wrapped or truncated label."""
    from spdnn.errors import SpdnnError
    from spdnn.io.arrays import from_memory
    from spdnn.io.loaders import load_dataset

    x = np.zeros((3, 4))
    np.savez(tmp_path / "d.npz", x_train=x, y_train=y)
    with pytest.raises(InputError, match=problem):
        load_dataset(f"npz:{tmp_path / 'd.npz'}", "float32")
    with pytest.raises(SpdnnError, match=problem):
        from_memory((x, y), "float32")


def test_complex_inputs_are_refused_not_cast_with_a_warning(tmp_path):
    from spdnn.io.loaders import load_dataset

    np.savez(tmp_path / "c.npz", x_train=np.ones((3, 4), complex), y_train=np.zeros(3, int))
    with pytest.raises(InputError, match="must hold real numbers, not complex128"):
        load_dataset(f"npz:{tmp_path / 'c.npz'}", "float32")


def test_values_beyond_float32_are_one_line_in_every_format(tmp_path):
    """1e39 fits float64 and is inf in float32: refused where it enters (a Matrix Market or
    Graph Challenge layer, challenge images in .tsv, .mtx and .npz, a data set), in one line
    with no numpy warning before it, and read as it is in float64."""
    from tests.helpers import assert_one_line_error, run_spdnn

    (tmp_path / "w.mtx").write_text("%%MatrixMarket matrix coordinate real general\n"
                                    "2 2 2\n1 1 1e39\n2 2 1\n")
    (tmp_path / "gc").mkdir()
    (tmp_path / "gc" / "n2-l1.tsv").write_text("1\t1\t1e39\n2\t2\t1\n")
    for args, name in ((["mtx", tmp_path / "w.mtx"], "w.mtx"),
                       (["graphchallenge", tmp_path / "gc", "--layers", "1"], "n2-l1.tsv")):
        proc = run_spdnn("convert", *args, "--dtype", "float32", "-o", tmp_path / "n.npz")
        assert_one_line_error(proc, name, "beyond the float32 range")
        assert not (tmp_path / "n.npz").exists()
        proc = run_spdnn("convert", *args, "--dtype", "float64", "-o", tmp_path / "n.npz")
        assert proc.returncode == 0, proc.stderr
        (tmp_path / "n.npz").unlink()
    proc = run_spdnn("generate", "random", "--sizes", "2,2", "--fan-in", "1", "-o",
                     tmp_path / "net.npz")
    assert proc.returncode == 0, proc.stderr
    (tmp_path / "img.tsv").write_text("1\t1\t1e39\n2\t2\t1\n")
    (tmp_path / "img.mtx").write_text("%%MatrixMarket matrix coordinate real general\n"
                                      "2 2 2\n1 1 1e39\n2 2 1\n")
    np.savez(tmp_path / "img.npz", shape=np.array([2, 2]), indptr=np.array([0, 1, 2]),
             indices=np.array([0, 1]), data=np.array([1e39, 1.0]))
    np.savez(tmp_path / "d.npz", x_train=np.full((4, 2), 1e39), y_train=np.zeros(4, int))
    for inputs, name in (("img.tsv", "img.tsv"), ("img.mtx", "img.mtx"),
                         ("img.npz", "img.npz"), ("npz:d.npz", "d.npz")):
        where = f"npz:{tmp_path / 'd.npz'}" if inputs.startswith("npz:") else tmp_path / inputs
        proc = run_spdnn("infer", "--network", tmp_path / "net.npz", "--inputs", where)
        assert_one_line_error(proc, name, "beyond the float32 range")


def test_deeply_nested_json_is_one_line_in_every_reader(tmp_path):
    """A JSON file, a bundle's meta and a safetensors header nested 100,000 deep: one
    InputError each, not a RecursionError."""
    import struct

    from spdnn.io.jsonfiles import manifest_file
    from spdnn.io.jsonread import read
    from spdnn.io.safetensors import SafetensorsFile

    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "m.json").write_text(deep)
    with pytest.raises(InputError, match="nested too deeply"):
        read(tmp_path / "m.json", manifest_file())
    raw = deep.encode()
    (tmp_path / "s.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    with pytest.raises(InputError, match="nested too deeply"):
        SafetensorsFile(tmp_path / "s.safetensors")
    from spdnn.io.bundle import load_network, save_network
    from tests.helpers import small_network

    save_network(small_network(), tmp_path / "n.npz")
    with np.load(tmp_path / "n.npz") as z:
        arrays = {k: z[k] for k in z.files}
    arrays["meta"] = np.array(deep)
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(InputError, match="meta is JSON nested too deeply"):
        load_network(tmp_path / "bad.npz")


def test_an_input_that_never_ends_is_refused_before_it_is_read(tmp_path):
    """/dev/zero and a FIFO given where spdnn reads a file (a network, a plan, data, images,
    safetensors, a JSON file): one line naming it, at once, not a read without end (a FIFO
    with no writer would block the open itself)."""
    from spdnn.io.jsonfiles import manifest_file
    from spdnn.io.jsonread import read
    from tests.helpers import assert_one_line_error, run_spdnn

    os.mkfifo(tmp_path / "fifo")
    proc = run_spdnn("generate", "random", "--sizes", "4,3", "--fan-in", "2", "-o",
                     tmp_path / "net.npz")
    assert proc.returncode == 0, proc.stderr
    net = tmp_path / "net.npz"
    for endless in ("/dev/zero", tmp_path / "fifo"):
        for args in (("train", "--network", net, "--data", f"npz:{endless}"),
                     ("infer", "--network", endless, "--inputs", "digits"),
                     ("train", "--network", net, "--plan", endless),
                     ("infer", "--network", net, "--inputs", endless),
                     ("convert", "safetensors", endless, "--activations", "relu", "-o",
                      tmp_path / "x.npz")):
            proc = run_spdnn(*args, timeout=30)
            assert_one_line_error(proc, str(endless), "is not a regular file")
        proc = run_spdnn("-P", "2", endless, "-o", tmp_path / "p.npz", module="partition",
                         timeout=30)
        assert_one_line_error(proc, str(endless), "is not a regular file")
        with pytest.raises(InputError, match="is not a regular file"):
            read(endless, manifest_file())
