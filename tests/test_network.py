import numpy as np
import pytest
import scipy.sparse as sp

from spdnn.errors import InputError
from spdnn.kernels.ranges import concat_ranges
from spdnn.model.network import Layer, Network
from tests.helpers import small_network


def test_sizes_nnz_and_dtype():
    net = small_network()
    assert net.sizes == (12, 9, 7, 4)
    assert net.nnz == 4 * (9 + 7 + 4)
    assert net.dtype == np.float64
    assert net.astype("float32").dtype == np.float32


def test_fingerprint_depends_on_pattern_not_values_or_index_dtype():
    net = small_network()
    fp = net.fingerprint()
    changed_values = net.copy()
    changed_values.layers[0].weight.data[:] *= 3
    assert changed_values.fingerprint() == fp
    w = net.layers[0].weight
    w64 = sp.csr_matrix((w.data, w.indices.astype(np.int64), w.indptr.astype(np.int64)),
                        shape=w.shape)
    assert Network(layers=(Layer(w64, net.layers[0].bias), *net.layers[1:])).fingerprint() == fp
    assert small_network(seed=1).fingerprint() != fp


def _layer(indptr, indices, data, shape, bias=None):
    bias = np.zeros(shape[0]) if bias is None else bias
    return Layer.from_arrays(np.array(indptr), np.array(indices), np.array(data, dtype=float),
                             shape, np.asarray(bias, dtype=float), "net.npz", "layer 1")


@pytest.mark.parametrize(
    "indptr, indices, data, problem",
    [
        ([0, 2, 3], [1, 0, 1], [1, 1, 1], "unsorted column index in row 0"),
        ([0, 2, 3], [1, 1, 0], [1, 1, 1], "duplicate column index in row 0"),
        ([0, 1, 2], [0, 3], [1, 1], "out of range"),
        ([0, 1, 2], [0, -1], [1, 1], "out of range"),
        ([0, 1, 2], [0, 1], [1, np.nan], "non-finite"),
        ([0, 1, 2], [0, 1], [np.inf, 1], "non-finite"),
        ([0, 2, 1], [0, 1], [1, 1], "lengths do not agree"),
        ([0, 1], [0], [1], "indptr has length 2"),
    ],
)
def test_layer_validation(indptr, indices, data, problem):
    with pytest.raises(InputError, match=problem) as err:
        _layer(indptr, indices, data, (2, 3))
    assert str(err.value).startswith("net.npz: layer 1")


def test_row_boundary_decrease_is_fine():
    layer = _layer([0, 2, 4], [1, 2, 0, 1], [1, 2, 3, 4], (2, 3))
    assert layer.weight.toarray().tolist() == [[0, 1, 2], [3, 4, 0]]


def test_bias_validation():
    with pytest.raises(InputError, match="bias has shape"):
        _layer([0, 1, 2], [0, 1], [1, 1], (2, 3), bias=[0.0])
    with pytest.raises(InputError, match="bias must be finite"):
        _layer([0, 1, 2], [0, 1], [1, 1], (2, 3), bias=[0.0, np.nan])


def test_shapes_must_chain():
    a, b = small_network().layers[:2]
    bad = Network(layers=(b, a))
    with pytest.raises(InputError, match="shapes do not chain"):
        bad.validate("x.npz")


def test_meta_validation():
    net = small_network()
    with pytest.raises(InputError, match="output_activation"):
        Network(layers=net.layers, output_activation="tanh").validate()
    with pytest.raises(InputError, match="cap"):
        Network(layers=net.layers, cap=-1.0).validate()


def test_concat_ranges_matches_a_loop_including_empty_ranges():
    starts = np.array([5, 0, 9, 3, 7])
    counts = np.array([2, 0, 3, 1, 0])
    expected = [i for s, c in zip(starts, counts) for i in range(s, s + c)]
    assert concat_ranges(starts, counts).tolist() == expected
    assert concat_ranges(np.array([], dtype=np.int64), np.array([], dtype=np.int64)).size == 0
