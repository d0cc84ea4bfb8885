import numpy as np
import pytest

from spdnn.io.formats import read_categories, read_inputs
from spdnn.io.loaders import Dataset, load_digits
from spdnn.model.batching import batch_order, columns
from spdnn.model.ops import loss_and_gradient, output
from spdnn.optim import SGDConfig, parameters
from spdnn.reference import backward, challenge_infer, forward, train
from tests.helpers import small_network


def _loss(net, x0, y, loss):
    zs, _ = forward(net, x0)
    return loss_and_gradient(output(zs[-1], net.output_function), y, loss)[0]


@pytest.mark.parametrize("loss", ["cross_entropy", "mse"])
@pytest.mark.parametrize("output_activation, cap", [("linear", None), ("relu", 1.5)])
def test_gradients_match_finite_differences(loss, output_activation, cap):
    net = small_network(cap=cap, output_activation=output_activation, bias_scale=0.3)
    rng = np.random.default_rng(2)
    x0 = rng.standard_normal((net.sizes[0], 5))
    y = rng.integers(0, net.sizes[-1], 5)
    g = backward(net, x0, y, loss)
    analytic = [a for pair in zip(g.weights, g.biases) for a in pair]
    params = parameters(net.layers)
    eps = 1e-6
    checked = 0
    for p, gp in zip(params, analytic):
        for i in range(0, p.size, max(1, p.size // 7)):
            old = p[i]
            p[i] = old + eps
            up = _loss(net, x0, y, loss)
            p[i] = old - eps
            down = _loss(net, x0, y, loss)
            p[i] = old
            assert gp[i] == pytest.approx((up - down) / (2 * eps), rel=1e-5, abs=1e-8)
            checked += 1
    assert checked > 20


def test_sgd_follows_torch_semantics():
    """Momentum without dampening, weight decay on every parameter (torch.optim.SGD)."""
    net = small_network()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((10, net.sizes[0]))
    y = rng.integers(0, net.sizes[-1], 10)
    data = Dataset(name="t", x_train=x, y_train=y)
    cfg = SGDConfig(lr=0.1, momentum=0.9, weight_decay=0.01)
    trained, _ = train(net, data, epochs=2, batch_size=4, optimizer=cfg, shuffle=False)
    # Hand-rolled reference of the same steps.
    ref = net.copy()
    params = parameters(ref.layers)
    bufs = [None] * len(params)
    for _ in range(2):
        for s in range(0, 10, 4):
            g = backward(ref, columns(x, slice(s, s + 4)), y[s:s + 4], "cross_entropy")
            grads = [a for pair in zip(g.weights, g.biases) for a in pair]
            for i, (p, gp) in enumerate(zip(params, grads)):
                d = gp + 0.01 * p
                bufs[i] = d.copy() if bufs[i] is None else 0.9 * bufs[i] + d
                p -= 0.1 * bufs[i]
    for a, b in zip(parameters(trained.layers), params):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
    assert not np.allclose(parameters(net.layers)[0], params[0])  # the input network is untouched


def test_batch_order():
    assert batch_order(5, 0, 1, shuffle=False).tolist() == [0, 1, 2, 3, 4]
    a, b = batch_order(100, 0, 1, True), batch_order(100, 1, 1, True)
    assert sorted(a) == list(range(100)) and not np.array_equal(a, b)
    np.testing.assert_array_equal(a, batch_order(100, 0, 1, True))


@pytest.mark.parametrize("n", [1, 16, 37])
def test_a_block_of_samples_is_their_features_by_columns(n):
    """Gathered a group of samples at a time (COLUMN_GROUP = 16): a batch of one group, of
    whole groups and with a last partial one, in the epoch's order, equals x[idx].T."""
    rng = np.random.default_rng(n)
    x = rng.random((50, 7), dtype=np.float32)
    idx = rng.permutation(50)[:n]
    block = columns(x, idx)
    assert block.flags.c_contiguous and block.dtype == np.float32
    np.testing.assert_array_equal(block, x[idx].T)
    np.testing.assert_array_equal(columns(x, slice(3, 3 + n)), x[3:3 + n].T)


def test_last_batch_is_smaller_and_counted():
    """With lr = 0 the weights stay put, so the epoch's loss and accuracy (weighted over the
    batches 4, 4, 2) must equal the loss and accuracy of all 10 samples at once."""
    net = small_network()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((10, net.sizes[0]))
    y = rng.integers(0, net.sizes[-1], 10)
    reports = []
    train(net, Dataset(name="t", x_train=x, y_train=y), 1, 4, SGDConfig(0.0),
          on_epoch=reports.append)
    whole = backward(net, columns(x, slice(None)), y, "cross_entropy")
    r = reports[0]
    assert r.steps == 3 and r.epoch == 1
    assert r.loss == pytest.approx(whole.loss, rel=1e-12)
    assert r.train_accuracy == whole.correct / 10
    assert r.samples_per_second == pytest.approx(10 / r.seconds)


def test_digits_training_learns():
    from spdnn.model.generate import random_network

    data = load_digits()
    assert data.x_train.shape == (1437, 64) and data.x_test.shape == (360, 64)
    net = random_network([64, 128, 128], 16, seed=0, head=10)
    _, reports = train(net, data, 8, 32, SGDConfig(0.05, 0.9))
    assert reports[-1].test_accuracy > 0.9


def test_graph_challenge_subset_gives_the_official_categories(graphchallenge_dir, neuron1024):
    net = neuron1024()
    images = read_inputs(graphchallenge_dir / "sparse-images-1024_subset.mtx", 1024)
    truth = read_categories(graphchallenge_dir / "neuron1024-l120-categories_subset.mtx")
    result = challenge_infer(net, images)
    assert len(truth) == 19
    np.testing.assert_array_equal(result.categories, truth)
    assert result.n_inputs == 1200 and result.edges == 120 * 1024 * 32 and result.rate > 0
    # The full truth file starts with the same 19 among the first 1,200 inputs.
    full = read_categories(graphchallenge_dir / "neuron1024-l120-categories.tsv")
    np.testing.assert_array_equal(full[full <= 1200], truth)
