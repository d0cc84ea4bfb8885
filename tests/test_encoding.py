"""The exchange encodings on their own: exact round trips, sizes, the choice per message."""

import numpy as np
import pytest

from spdnn.encoding import (
    HEADER,
    decode_expand,
    encode_expand,
    expand_capacity,
    fold_packed,
    slope_mask,
)
from spdnn.errors import SpdnnError


def _blocks(dtype):
    rng = np.random.default_rng(0)
    mixed = rng.standard_normal((7, 13)).astype(dtype)
    mixed[mixed < 0.5] = 0
    return {"empty": np.zeros((0, 13), dtype), "all zero": np.zeros((4, 13), dtype),
            "fully dense": rng.uniform(1, 2, (5, 13)).astype(dtype), "mixed": mixed,
            "one value": np.eye(1, 9, 4, dtype=dtype)}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode", ["auto", "dense", "sparse"])
def test_expand_round_trip_is_exact_and_sized(dtype, mode):
    for name, block in _blocks(dtype).items():
        item, n = block.itemsize, block.size
        buf = np.full(expand_capacity(*block.shape, item), 0xAB, np.uint8)
        used = encode_expand(block, mode, buf)
        nnz = int(np.count_nonzero(block))
        sparse = HEADER + ((n + 7) // 8 + 7) // 8 * 8 + nnz * item
        dense = HEADER + n * item
        expected = {"dense": dense, "sparse": sparse, "auto": min(dense, sparse)}[mode]
        if mode == "auto" and sparse == dense:
            expected = dense
        assert used == expected <= len(buf), name
        out = np.full_like(block, np.nan)
        decode_expand(buf, out, "test")
        np.testing.assert_array_equal(out, block, err_msg=name)
        assert np.array_equal(np.signbit(out), np.signbit(block))


def test_auto_picks_the_smaller_form():
    buf = np.zeros(expand_capacity(10, 64, 4), np.uint8)
    sparse_block = np.zeros((10, 64), np.float32)
    sparse_block[3, 5] = 1
    assert encode_expand(sparse_block, "auto", buf) == HEADER + 80 + 4
    assert np.frombuffer(buf[:HEADER], np.int64)[0] == 1
    dense_block = np.ones((10, 64), np.float32)
    assert encode_expand(dense_block, "auto", buf) == HEADER + 640 * 4
    assert np.frombuffer(buf[:HEADER], np.int64)[0] == -1


def test_corrupt_sparse_messages_are_refused():
    block = np.zeros((2, 8), np.float64)
    block[0, 1] = 3.0
    buf = np.zeros(expand_capacity(2, 8, 8), np.uint8)
    encode_expand(block, "sparse", buf)
    bad = buf.copy()
    bad[:HEADER] = np.frombuffer(np.int64(99).tobytes(), np.uint8)
    with pytest.raises(SpdnnError, match="rank 3: corrupt sparse message"):
        decode_expand(bad, np.empty_like(block), "rank 3")
    bad = buf.copy()
    bad[HEADER] |= 0x80  # one more bit than the count says
    with pytest.raises(SpdnnError, match="bitmap disagrees"):
        decode_expand(bad, np.empty_like(block), "rank 3")


def test_slope_mask_and_fold_choice():
    x = np.array([[0.0, 0.5, 2.0, 3.0], [1e-300, 2.0 - 1e-12, 0.0, 1.0]])
    np.testing.assert_array_equal(slope_mask(x, 2.0), [[0, 1, 0, 0], [1, 1, 0, 1]])
    np.testing.assert_array_equal(slope_mask(x, None), [[0, 1, 1, 1], [1, 1, 0, 1]])
    full = np.ones((2, 3), bool)
    assert fold_packed(full, "sparse") and not fold_packed(full, "auto")
    assert not fold_packed(~full, "dense") and fold_packed(~full, "auto")
