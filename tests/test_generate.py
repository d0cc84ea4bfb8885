import numpy as np
import pytest

from spdnn import reference
from spdnn.errors import InputError, OptionError
from spdnn.io.dense import prune_file
from spdnn.io.graphchallenge import read_graphchallenge
from spdnn.model.generate import add_head, local_network, prune_dense, radixnet, random_network
from spdnn.reference import forward


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


def test_random_fan_in_per_layer():
    net = random_network([50, 30, 20], fan_in=[12, 30], seed=1)
    assert np.all(np.diff(net.layers[0].weight.indptr) == 12)
    assert np.all(np.diff(net.layers[1].weight.indptr) == 30)  # every input: a full layer
    with pytest.raises(ValueError, match="fan_in lists 2 counts for 1 layers"):
        random_network([50, 30], fan_in=[3, 4])
    with pytest.raises(OptionError, match="fan_in must be at least 1, not 0"):
        random_network([50, 30, 20], fan_in=[12, 0])


def test_random_fixed_fan_in():
    net = random_network([50, 30, 20], fan_in=8, seed=1, head=5)
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
    net = prune_file(tmp_path / "dense.npz", 0.25, head=3)
    assert net.sizes == (10, 20, 6, 3)
    np.savez(tmp_path / "bad.npz", W1=w1, W2=rng.standard_normal((6, 7)))
    with pytest.raises(InputError, match="shapes do not chain"):
        prune_file(tmp_path / "bad.npz", 0.25)


def test_add_head_makes_the_output_linear():
    base = radixnet(1024, 2, dtype="float64")
    net = add_head(base, 10, seed=3)
    assert net.sizes == (*base.sizes, 10) and net.output_activation == "linear"
    assert net.cap == base.cap == 32 and net.extra["head"] == 10
    head = net.layers[-1]
    # A dense head (every weight stored), PyTorch's uniform init bound, zero biases.
    assert head.weight.nnz == 10 * 1024 and head.bias.tolist() == [0.0] * 10
    assert 0 < np.abs(head.weight.data).max() <= 1 / np.sqrt(1024)
    # The function: the base's last layer now goes through the capped ReLU, the head is linear.
    x = np.random.default_rng(0).uniform(0, 1, (1024, 5))
    zs, _ = forward(base, x)
    hidden = np.clip(zs[-1], 0, 32)
    np.testing.assert_allclose(forward(net, x)[0][-1], head.weight @ hidden, rtol=1e-12)
    assert add_head(base, 10, seed=3).fingerprint() == net.fingerprint()


def test_local_network_windows_and_fan_in():
    net = local_network("8x8", ["16x16", "4x4"], radius=1, head=10, shuffle=False,
                        dtype="float64")
    assert net.sizes == (64, 256, 16, 10) and net.output_activation == "linear"
    w = net.layers[0].weight
    # Neuron (r, c) of the 16x16 grid sits over pixel (r // 2, c // 2): a 3x3 window inside,
    # 2x2 in a corner, 2x3 on an edge.
    fan = np.diff(w.indptr).reshape(16, 16)
    assert fan[0, 0] == 4 and fan[0, 7] == 6 and fan[7, 7] == 9 and fan[15, 15] == 4
    r, c = 9, 4
    cols = w.indices[w.indptr[r * 16 + c]:w.indptr[r * 16 + c + 1]]
    assert sorted((j // 8, j % 8) for j in cols) == [(i, j) for i in (3, 4, 5) for j in (1, 2, 3)]
    # He initialisation: N(0, 2 / fan_in) per row.
    assert abs(np.std(w.data * np.sqrt(np.repeat(fan.ravel(), fan.ravel()) / 2)) - 1) < 0.1
    # 16x16 -> 4x4: each of the 16 neurons reads a 3x3 window of the 16x16 grid.
    assert set(np.diff(net.layers[1].weight.indptr)) <= {4, 6, 9}


def test_local_network_shuffle_renumbers_the_same_function():
    plain = local_network("8x8", ["16x16", "16x16"], radius=1, seed=3, head=10, shuffle=False,
                          dtype="float64")
    mixed = local_network("8x8", ["16x16", "16x16"], radius=1, seed=3, head=10,
                          dtype="float64")
    assert plain.fingerprint() != mixed.fingerprint() and plain.nnz == mixed.nnz
    x = np.random.default_rng(0).random((64, 7))
    np.testing.assert_allclose(reference.forward(mixed, x)[0][-1],
                               reference.forward(plain, x)[0][-1], rtol=1e-12, atol=1e-12)
    again = local_network("8x8", ["16x16", "16x16"], radius=1, seed=3, head=10,
                          dtype="float64")
    assert again.fingerprint() == mixed.fingerprint()  # seeded


def test_local_network_hypergraph_plan_beats_block_when_shuffled():
    from partition.methods import baseline_owners, partition_network
    from spdnn.model.plan import network_patterns, plan_statistics

    patterns = network_patterns(local_network("8x8", ["16x16", "16x16"], radius=1, head=10))
    plan = partition_network(patterns, 2, seed=0)
    ours = plan_statistics(patterns, plan.owners, parts=2)
    block = plan_statistics(patterns, baseline_owners("block", patterns, parts=2), parts=2)
    assert ours.volume * 1.5 < block.volume


@pytest.mark.parametrize("grid", ["8y8", "0x4", "8"])
def test_local_network_bad_grids(grid):
    with pytest.raises(ValueError, match="grid"):
        local_network(grid, ["4x4"])
