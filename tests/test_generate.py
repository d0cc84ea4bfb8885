import numpy as np
import pytest

from spdnn.errors import InputError
from spdnn.generate import add_head, prune_dense, prune_file, radixnet, random_network
from spdnn.graphchallenge import read_graphchallenge


def test_radixnet_reproduces_official_layers_1_to_6(graphchallenge_dir):
    official = read_graphchallenge(graphchallenge_dir / "neuron1024", -0.3, 32, n_layers=6,
                                   dtype="float64")
    ours = radixnet(1024, 6, dtype="float64")
    for k, (a, b) in enumerate(zip(official.layers, ours.layers), start=1):
        assert (a.weight != b.weight).nnz == 0, f"layer {k} differs"
        np.testing.assert_array_equal(a.bias, b.bias)


def test_radixnet_official_later_layers_have_the_same_statistics(graphchallenge_dir):
    official = read_graphchallenge(graphchallenge_dir / "neuron1024", -0.3, 32, n_layers=8)
    ours = radixnet(1024, 8, seed=3)
    for a, b in zip(official.layers[6:], ours.layers[6:]):
        for w in (a.weight, b.weight):
            assert set(np.diff(w.indptr)) == {32}
            assert set(np.bincount(w.indices, minlength=1024)) == {32}
            assert set(np.unique(w.data)) == {np.float32(1 / 16)}


@pytest.mark.parametrize("n", [1024, 4096])
def test_radixnet_structure_and_seed(n):
    cycle = int(np.log2(n // 16))
    net = radixnet(n, cycle + 2, seed=7)
    for layer in net.layers:
        w = layer.weight
        assert w.shape == (n, n) and w.has_sorted_indices
        assert set(np.diff(w.indptr)) == {32}
        assert set(np.bincount(w.indices, minlength=n)) == {32}
    # Later layers are permuted copies of the base cycle, different per seed.
    later = net.layers[cycle].weight
    assert (later != net.layers[0].weight).nnz > 0
    assert radixnet(n, cycle + 2, seed=7).fingerprint() == net.fingerprint()
    assert radixnet(n, cycle + 2, seed=8).fingerprint() != net.fingerprint()
    with pytest.raises(ValueError):
        radixnet(1000, 3)


def test_random_fixed_fan_in():
    net = random_network([50, 30, 20], fan_in=8, seed=1, n_classes=5)
    assert net.sizes == (50, 30, 20, 5)
    for layer in net.layers[:2]:
        assert set(np.diff(layer.weight.indptr)) == {8}
    assert net.layers[2].nnz == 5 * 20  # dense head
    assert random_network([50, 30, 20], 8, seed=1).fingerprint() == \
        random_network([50, 30, 20], 8, seed=1).fingerprint()
    assert set(np.diff(random_network([3, 4], 10).layers[0].weight.indptr)) == {3}


def test_prune_keeps_the_largest_magnitudes(tmp_path):
    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((20, 10)), rng.standard_normal((6, 20))
    layers = prune_dense([w1, w2], [None, np.ones(6)], density=0.25)
    kept = layers[0].weight
    # Exactly the 50 largest magnitudes (25% of 200), plus each row's largest entry so that no
    # neuron is cut off: nothing more, nothing less.
    expected = np.zeros(w1.size, dtype=bool)
    expected[np.argsort(-np.abs(w1).ravel())[:50]] = True
    expected = expected.reshape(w1.shape)
    expected[np.arange(20), np.argmax(np.abs(w1), axis=1)] = True
    dense = kept.toarray()
    np.testing.assert_array_equal(dense != 0, expected)
    assert kept.nnz == int(expected.sum()) < 70
    assert np.all((dense == 0) | (dense == w1))
    assert np.all(np.diff(kept.indptr) >= 1)  # every neuron keeps an input
    np.savez(tmp_path / "dense.npz", W1=w1, W2=w2, b2=np.ones(6))
    net = prune_file(tmp_path / "dense.npz", 0.25, n_classes=3)
    assert net.sizes == (10, 20, 6, 3)
    np.savez(tmp_path / "bad.npz", W1=w1, W2=rng.standard_normal((6, 7)))
    with pytest.raises(InputError, match="shapes do not chain"):
        prune_file(tmp_path / "bad.npz", 0.25)


def test_add_head_makes_the_output_linear():
    net = add_head(radixnet(1024, 2), 10)
    assert net.sizes[-1] == 10 and net.output_activation == "linear" and net.cap == 32
