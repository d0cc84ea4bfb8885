"""Graph Challenge input images (spdnn.io.images): the binary .npz form and its validation, the
bicubic resize, challenge images from MNIST, and ``spdnn generate challenge-images``."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest
import scipy.sparse as sp

from spdnn.errors import InputError
from spdnn.io.formats import read_inputs, write_mtx
from spdnn.io.images import (
    bicubic_weights,
    challenge_images,
    image_share_nbytes,
    read_image_npz,
    read_image_share,
    read_images,
    write_image_npz,
)
from tests.conftest import GRAPHCHALLENGE, MNIST
from tests.helpers import assert_one_line_error, launch, run_cli


def _idx(path, images: np.ndarray) -> None:
    head = struct.pack(">BBBB", 0, 0, 0x08, 3) + struct.pack(">III", *images.shape)
    with gzip.open(path, "wb") as f:
        f.write(head + images.astype(np.uint8).tobytes())


@pytest.fixture
def mnist_dir(tmp_path):
    rng = np.random.default_rng(0)
    images = np.zeros((5, 28, 28), np.uint8)
    images[:, 6:22, 10:18] = rng.integers(150, 256, (5, 16, 8))
    images[0] = 0
    images[0, :, 13] = 255  # one bright column
    d = tmp_path / "mnist"
    d.mkdir()
    _idx(d / "train-images-idx3-ubyte.gz", images)
    return d


def test_bicubic_weights_keep_constants_and_interior_ramps():
    for n_out in (32, 64, 128, 256):
        m = bicubic_weights(28, n_out)
        np.testing.assert_allclose(m.sum(axis=1), 1.0, atol=1e-12)
        ramp = np.arange(28.0)
        scale = n_out / 28
        centres = np.arange(1, n_out + 1) / scale + 0.5 * (1 - 1 / scale) - 1
        inner = (centres > 2) & (centres < 25)  # away from the replicated edges
        np.testing.assert_allclose((m @ ramp)[inner], centres[inner], atol=1e-9)
    np.testing.assert_allclose(bicubic_weights(28, 28), np.eye(28), atol=1e-12)


def test_challenge_images_are_binary_and_flattened_column_by_column(mnist_dir):
    x = challenge_images(mnist_dir, 32, count=5)
    assert x.shape == (5, 1024) and x.dtype == np.float32
    assert set(np.unique(x.data)) == {1.0}
    on = x[0].indices  # the bright column: a run of consecutive features (one column)
    assert len(on) > 20 and np.all(np.diff(np.sort(on)) == 1)
    big = challenge_images(mnist_dir, 64, count=3)
    assert big.shape == (3, 4096) and big[1].nnz > x[1].nnz
    with pytest.raises(InputError, match="asked for 6"):
        challenge_images(mnist_dir, 32, count=6)
    with pytest.raises(ValueError, match="size"):
        challenge_images(mnist_dir, 30, count=1)


def test_npz_images_round_trip_and_equal_the_text_forms(tmp_path):
    rng = np.random.default_rng(1)
    x = sp.random(9, 40, density=0.2, random_state=rng, format="csr")
    x.data[:] = 1
    write_image_npz(tmp_path / "x.npz", x)
    write_mtx(tmp_path / "x.mtx", x)
    got = read_images(tmp_path / "x.npz", 40)
    assert (got != read_inputs(tmp_path / "x.mtx", 40)).nnz == 0
    x.data[:] = rng.random(x.nnz)  # values other than 1 are kept
    write_image_npz(tmp_path / "v.npz", x)
    np.testing.assert_array_equal(read_image_npz(tmp_path / "v.npz", 40).toarray(), x.toarray())


def _write_in(directory, x: sp.csr_matrix, suffix: str):
    """``x`` as images in one of the forms read: .npz (stored, or compressed), .mtx."""
    path = directory / f"x.{suffix.split('-')[0]}"
    if suffix == "npz-compressed":
        np.savez_compressed(path, shape=np.array(x.shape), indptr=x.indptr,
                            indices=x.indices, data=x.data)
    elif suffix == "mtx":
        write_mtx(path, x)
    else:
        write_image_npz(path, x)
    return path


@pytest.mark.parametrize("suffix", ["npz", "npz-compressed", "mtx"])
def test_shares_of_a_file_are_read_alone_and_make_up_the_whole(tmp_path, suffix):
    """What a data-parallel rank reads: only its images (in place from a stored .npz)."""
    rng = np.random.default_rng(4)
    x = sp.random(11, 30, density=0.3, random_state=rng, format="csr")
    x.data[:] = rng.random(x.nnz) + 0.5
    path = _write_in(tmp_path, x, suffix)
    parts = [read_image_share(path, 30, lambda n, k=k: slice(*[(0, 4), (4, 4), (4, 11)][k]))
             for k in range(3)]
    assert [(p.first, p.total, p.matrix.shape) for p in parts] == [
        (0, 11, (4, 30)), (4, 11, (0, 30)), (4, 11, (7, 30))]
    whole = sp.vstack([p.matrix for p in parts])
    np.testing.assert_allclose(whole.toarray(), x.toarray(), rtol=1e-6)


@pytest.mark.parametrize("suffix", ["npz", "npz-compressed", "npz-pattern", "mtx"])
@pytest.mark.parametrize("block", [1, 7, 1 << 22])
def test_a_model_part_reads_only_its_features_in_its_dtype(tmp_path, monkeypatch, suffix,
                                                           block):
    """What a rank of a plan reads: its share of the images and only its first layer's feature
    columns, in its dtype, block by block (blocks of 1 entry, 7, and one block)."""
    monkeypatch.setattr("spdnn.io.images._BLOCK_ENTRIES", block)
    rng = np.random.default_rng(5)
    x = sp.random(13, 30, density=0.3, random_state=rng, format="csr")
    x.data[:] = 1.0 if suffix == "npz-pattern" else rng.random(x.nnz) + 0.5
    path = _write_in(tmp_path, x, suffix)
    features = np.array([0, 3, 4, 5, 17, 29])
    for dtype in (np.float32, np.float64):
        got = read_image_share(path, 30, lambda n: slice(2, 11), features=features,
                               dtype=dtype)
        assert (got.first, got.total, got.matrix.shape) == (2, 13, (9, 6))
        assert got.matrix.dtype == dtype and got.matrix.has_canonical_format
        np.testing.assert_array_equal(got.features, features)
        np.testing.assert_allclose(got.matrix.toarray(), x[2:11][:, features].toarray(),
                                   rtol=1e-6)
        held = got.matrix.data.nbytes + got.matrix.indices.nbytes + got.matrix.indptr.nbytes
        counted = image_share_nbytes(path, 30, lambda n: slice(2, 11), features=features,
                                     dtype=dtype)
        assert counted == (0 if suffix == "mtx" else held)  # counted before it is read
    none = read_image_share(path, 30, features=np.array([], np.int64))
    assert none.matrix.shape == (13, 0) and none.matrix.nnz == 0
    with pytest.raises(ValueError, match="ascend"):
        read_image_share(path, 30, features=np.array([4, 3]))


def test_a_share_is_validated_as_it_is_read(tmp_path):
    """A bad index is reported by the share that holds it (with comm.check, on every rank)."""
    path = _bad(tmp_path, "late", shape=np.array([3, 4]), indptr=np.array([0, 1, 2, 3]),
                indices=np.array([0, 3, 9], np.int32))
    assert read_image_share(path, 4, lambda n: slice(0, 2)).matrix.nnz == 2
    with pytest.raises(InputError, match="outside 0..3"):
        read_image_share(path, 4, lambda n: slice(2, 3))


def _bad(tmp_path, name, **members):
    path = tmp_path / f"{name}.npz"
    base = {"shape": np.array([2, 4]), "indptr": np.array([0, 1, 2]),
            "indices": np.array([0, 3], np.int32)}
    np.savez(path, **{k: v for k, v in (base | members).items() if v is not None})
    return path


@pytest.mark.parametrize(("name", "members", "message"), [
    ("noshape", {"shape": None}, "missing key 'shape'"),
    ("shape3", {"shape": np.array([2, 4, 1])}, "two integers"),
    ("fshape", {"shape": np.array([2.0, 4.0])}, "two integers"),
    ("features", {"shape": np.array([2, 5])}, "has 5 features"),
    ("empty", {"shape": np.array([0, 4]), "indptr": np.array([0]),
               "indices": np.array([], np.int32)}, "no inputs"),
    ("ptrlen", {"indptr": np.array([0, 2])}, "3 entries"),
    ("ptrdown", {"indptr": np.array([0, 2, 1])}, "rise from 0"),
    ("ptrend", {"indptr": np.array([0, 1, 5])}, "rise from 0"),
    ("range", {"indices": np.array([0, 4], np.int32)}, "outside 0..3"),
    ("negative", {"indices": np.array([0, -1], np.int32)}, "outside 0..3"),
    ("findex", {"indices": np.array([0.0, 1.0])}, "1-D integer"),
    ("nan", {"data": np.array([1.0, np.nan])}, "non-finite"),
    ("datalen", {"data": np.array([1.0])}, "one value per index"),
])
def test_malformed_npz_images_are_refused_naming_the_file(tmp_path, name, members, message):
    path = _bad(tmp_path, name, **members)
    with pytest.raises(InputError, match=message) as err:
        read_image_npz(path, 4)
    assert str(path) in str(err.value)


def test_not_an_npz_is_refused(tmp_path):
    path = tmp_path / "junk.npz"
    path.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(InputError, match="junk.npz"):
        read_images(path, 4)


def test_generate_challenge_images_command(tmp_path, mnist_dir):
    out = tmp_path / "img.npz"
    proc = run_cli("generate", "challenge-images", "--mnist", mnist_dir, "--count", 5,
                   "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "5 images of 1,024 pixels" in proc.stdout
    assert (read_images(out, 1024) != challenge_images(mnist_dir, 32, 5)).nnz == 0
    mtx = tmp_path / "img.mtx"
    assert run_cli("generate", "challenge-images", "--mnist", mnist_dir, "--count", 5,
                   "-o", mtx).returncode == 0
    assert (read_images(mtx, 1024) != read_images(out, 1024)).nnz == 0
    assert_one_line_error(run_cli("generate", "challenge-images", "--mnist", tmp_path,
                                  "-o", out), "no MNIST training images")
    assert_one_line_error(run_cli("generate", "challenge-images", "--mnist", mnist_dir,
                                  "-o", tmp_path / "img.png"), ".npz, .mtx or .tsv")
    assert_one_line_error(run_cli("generate", "challenge-images", "--mnist", mnist_dir,
                                  "--threshold", 1.5, "-o", out), "--threshold")


def test_infer_reads_npz_images(tmp_path, mnist_dir):
    assert run_cli("generate", "radixnet", "--neurons", 1024, "--layers", 3, "--bias", -0.05,
                   "-o", tmp_path / "rx.npz").returncode == 0
    assert run_cli("generate", "challenge-images", "--mnist", mnist_dir, "--count", 5,
                   "-o", tmp_path / "img.npz").returncode == 0
    write_mtx(tmp_path / "img.mtx", read_images(tmp_path / "img.npz", 1024))
    cats = []
    for name in ("img.npz", "img.mtx"):
        proc = launch(0, "infer", "--network", tmp_path / "rx.npz", "--inputs",
                      tmp_path / name, "--categories-out", tmp_path / f"{name}.tsv")
        assert proc.returncode == 0, proc.stderr
        cats.append((tmp_path / f"{name}.tsv").read_text())
    assert cats[0] == cats[1] and cats[0].strip()  # some images survive


@pytest.mark.skipif(not (MNIST / "train-images-idx3-ubyte.gz").is_file()
                    or not (GRAPHCHALLENGE / "sparse-images-1024_subset.mtx").is_file(),
                    reason=f"MNIST or the Graph Challenge subset not under {MNIST.parent} "
                           "(../shared absent)")
def test_32x32_images_agree_with_the_official_subset():
    official = read_inputs(GRAPHCHALLENGE / "sparse-images-1024_subset.mtx", 1024)
    ours = challenge_images(MNIST, 32, count=official.shape[0])
    differ = (ours != (official != 0)).nnz
    # 8,930 of 1,228,800 pixels differ (0.73%): the official resize is not exactly this one.
    assert differ < 0.01 * official.shape[0] * 1024
    assert abs(ours.nnz - official.nnz) < 0.01 * official.nnz
