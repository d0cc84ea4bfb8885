"""The exchange encodings on their own, across both kernel backends: exact round trips (signed
zeros, values at the cap), sizes, the choice per message, the fold's packing, refused corrupt
messages, and one format shared by both backends."""

import numpy as np
import pytest

from spdnn.errors import SpdnnError
from spdnn.kernels import products as kernels
from spdnn.kernels.encoding import (
    HEADER,
    add_rows,
    decode_rows,
    encode_rows,
    expand_capacity,
    fold_add,
    fold_pack,
    fold_packed,
    slope_count,
    slope_mask,
)


def _blocks(dtype, cap):
    rng = np.random.default_rng(0)
    mixed = rng.standard_normal((7, 13)).astype(dtype)
    mixed[mixed < 0.5] = 0
    mixed[0, :3] = -0.0
    saturated = rng.uniform(0, 2 * (cap or 1), (6, 11)).astype(dtype)
    if cap is not None:
        saturated = np.minimum(saturated, dtype(cap))
    saturated[saturated < 0.3] = 0
    large = rng.uniform(0, 2 * (cap or 1), (40, 53)).astype(dtype)  # many vectors, a tail
    large[rng.random(large.shape) < 0.6] = 0
    if cap is not None:
        large[rng.random(large.shape) < 0.2] = dtype(cap)
    return {"large": large, "empty": np.zeros((0, 13), dtype), "all zero": np.zeros((4, 13), dtype),
            "fully dense": rng.uniform(1, 2, (5, 13)).astype(dtype), "mixed": mixed,
            "one value": np.eye(1, 9, 4, dtype=dtype), "saturated": saturated,
            "all at cap": np.full((3, 17), cap or 1.0, dtype)}


def _encode(block, mode, cap, fill=0xAB):
    x = np.vstack([np.full((2, block.shape[1]), 9, block.dtype), block])  # rows 2.. are sent
    buf = np.full(expand_capacity(*block.shape, block.itemsize), fill, np.uint8)
    used = encode_rows(x, np.arange(2, 2 + len(block)), mode, cap, buf)
    return buf, used


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode", ["auto", "dense", "sparse"])
@pytest.mark.parametrize("cap", [None, 1.5, 6.1])
def test_round_trip_is_exact_and_sized(backend, dtype, mode, cap):
    for name, block in _blocks(dtype, cap).items():
        item, n = block.itemsize, block.size
        buf, used = _encode(block, mode, cap)
        nonzero = (block != 0) | np.signbit(block)
        nnz = int(np.count_nonzero(nonzero))
        at_cap = int(np.count_nonzero(block == dtype(cap))) if cap is not None else 0
        sparse = HEADER + (nnz - at_cap) * item + (n + 7) // 8 * (1 if cap is None else 2)
        dense = HEADER + n * item
        expected = {"dense": dense, "sparse": sparse,
                    "auto": sparse if sparse < dense else dense}[mode]
        assert used == expected <= len(buf), name
        assert len(buf) % 8 == 0
        out = np.full_like(block, np.nan)
        decode_rows(buf, out, cap, "test")
        np.testing.assert_array_equal(out, block, err_msg=name)
        assert np.array_equal(np.signbit(out), np.signbit(block)), name


def test_both_backends_write_the_same_bytes():
    if "numba" not in kernels.available_backends():
        pytest.skip("numba is not installed")
    before = kernels.backend()
    try:
        for cap in (None, 1.5):
            for block in _blocks(np.float32, cap).values():
                for mode in ("auto", "sparse"):
                    written = []
                    for name in ("scipy", "numba"):
                        kernels.set_backend(name)
                        buf, used = _encode(block, mode, cap, fill=0)
                        written.append(buf[:used].tobytes())
                    assert written[0] == written[1]
    finally:
        kernels.set_backend(before)


def test_auto_picks_the_smaller_form(backend):
    x = np.zeros((10, 64), np.float32)
    buf = np.zeros(expand_capacity(10, 64, 4), np.uint8)
    x[3, 5] = 1
    rows = np.arange(10)
    assert encode_rows(x, rows, "auto", None, buf) == HEADER + 4 + 80
    assert buf[:HEADER].view(np.int64).tolist() == [1, 0]
    x[3, 5] = 2.0  # at the cap: no value travels, a bit of the second bitmap says "cap"
    assert encode_rows(x, rows, "auto", 2.0, buf) == HEADER + 80 + 80
    assert buf[:HEADER].view(np.int64).tolist() == [0, 1]
    x[:] = 1
    assert encode_rows(x, rows, "auto", None, buf) == HEADER + 640 * 4
    assert buf[:HEADER].view(np.int64).tolist() == [-1, 0]
    x[:] = 2.0  # every entry at the cap: two bitmaps
    assert encode_rows(x, rows, "auto", 2.0, buf) == HEADER + 80 + 80


def test_corrupt_sparse_messages_are_refused(backend):
    block = np.zeros((2, 8), np.float64)
    block[0, 1], block[1, 2] = 3.0, 2.0  # entry 1 carries 3.0, entry 10 is at the cap 2.0
    buf, used = _encode(block, "sparse", 2.0, fill=0)
    # header (1 value, 1 at the cap), the value, bitmap of values, bitmap of the cap
    assert used == HEADER + 8 + 2 + 2 and buf[:HEADER].view(np.int64).tolist() == [1, 1]
    assert buf[24:28].tolist() == [0x02, 0, 0, 0x04]

    def refused(bad, cap=2.0, target=block):
        with pytest.raises(SpdnnError, match="^rank 3: corrupt sparse message"):
            decode_rows(bad, np.empty_like(target), cap, "rank 3")

    for header in ([99, 0], [1, 2], [2, 0], [-1, 1], [-2, 0], [0, 1]):
        bad = buf.copy()
        bad[:HEADER].view(np.int64)[:] = header
        refused(bad)
    bad = buf.copy()
    bad[24] |= 0x80  # one more value bit than the header says
    refused(bad)
    bad = buf.copy()
    bad[26] |= 0x02  # entry 1 both carries a value and is at the cap
    bad[:HEADER].view(np.int64)[:] = [1, 2]
    refused(bad)
    refused(buf[:20])  # cut short
    refused(buf, cap=None)  # an at-cap count where the network has no cap
    bad = buf.copy()
    bad[24] = 0x08  # the value moves to entry 3: well formed, so decoded as written
    decoded = np.empty_like(block)
    decode_rows(bad, decoded, 2.0, "rank 3")
    assert decoded[0, 3] == 3.0 and decoded[1, 2] == 2.0 and np.count_nonzero(decoded) == 2
    short = np.zeros((1, 5))
    short[0, 0] = 1.0
    buf, _ = _encode(short, "sparse", None, fill=0)
    buf[HEADER + 8] = 0x40  # the bit moves into the padding of the last byte
    refused(buf, cap=None, target=short)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("batch", [6, 37])  # within one vector, and vectors with a tail
@pytest.mark.parametrize("cap", [None, 2.0])
def test_fold_packing_round_trip(backend, dtype, batch, cap):
    rng = np.random.default_rng(4)
    x = rng.choice([0.0, 0.5, 1.0, 2.0, 3.0], (9, batch)).astype(dtype)  # at, above, below
    rows = np.array([7, 1, 4, 2])
    partials = rng.standard_normal((4, batch)).astype(dtype)
    mask = slope_mask(x[rows], cap)
    count = slope_count(x, rows, cap)
    assert count == int(np.count_nonzero(mask))
    with pytest.raises(ValueError, match=f"needs {4 * batch} entries"):
        fold_pack(partials, x, rows, cap, np.empty(4 * batch - 1, dtype))
    out = np.full(4 * batch, np.nan, dtype)
    assert fold_pack(partials, x, rows, cap, out) == count
    np.testing.assert_array_equal(out[:count], partials[mask])
    spent = partials.copy()  # packed in place, over its own storage (the fold's ghost block)
    assert fold_pack(spent, x, rows, cap, spent.reshape(-1)) == count
    np.testing.assert_array_equal(spent.reshape(-1)[:count], partials[mask])
    g = rng.standard_normal((9, batch)).astype(dtype)
    expected = g.copy()
    expected[rows] += np.where(mask, partials, 0)
    fold_add(g, rows, out[:count], x, cap)
    np.testing.assert_array_equal(g, expected)
    add_rows(g, rows, partials)
    expected[rows] += partials
    np.testing.assert_array_equal(g, expected)


def test_slope_mask_and_fold_choice():
    x = np.array([[0.0, 0.5, 2.0, 3.0], [1e-300, 2.0 - 1e-12, 0.0, 1.0]])
    np.testing.assert_array_equal(slope_mask(x, 2.0), [[0, 1, 0, 0], [1, 1, 0, 1]])
    np.testing.assert_array_equal(slope_mask(x, None), [[0, 1, 1, 1], [1, 1, 0, 1]])
    assert fold_packed(6, 6, "sparse") and not fold_packed(6, 6, "auto")
    assert not fold_packed(0, 6, "dense") and fold_packed(5, 6, "auto")
