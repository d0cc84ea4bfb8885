"""SparseMLPClassifier and SparseMLPRegressor under MPI: fit partitions the network for the
ranks and trains it there; every rank returns the same fitted estimator, equal to the serial
reference's."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sklearn", reason="scikit-learn (the sklearn extra) is not installed")

from spdnn.estimators import (  # noqa: E402
    SparseMLPClassifier,
    SparseMLPRegressor,
    initial_network,
)
from spdnn.io.loaders import Dataset, load_dataset  # noqa: E402
from spdnn.optim import AdamConfig  # noqa: E402
from spdnn.reference import predict as reference_predict  # noqa: E402
from spdnn.reference import train as reference_train  # noqa: E402

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("plan", ["sweep", "block"])
def test_fit_on_the_ranks_equals_the_serial_reference_on_every_rank(comm, plan):
    digits = load_dataset("digits", "float64")
    x, y = digits.x_train[:300], digits.y_train[:300]
    clf = SparseMLPClassifier((24, 16), fan_in=7, max_iter=3, random_state=5,
                              learning_rate_init=0.01, plan=plan, comm=comm).fit(x, y)
    net = initial_network([64, 24, 16, 10], [7, 7, 7], seed=5, dtype="float64",
                          activations="relu")
    expected, reports = reference_train(net, Dataset(name="d", x_train=x, y_train=y), 3, 200,
                                        AdamConfig(lr=0.01, weight_decay=1e-4), seed=5)
    for coef, b, layer in zip(clf.coefs_, clf.intercepts_, expected.layers):
        np.testing.assert_allclose(coef.toarray(), layer.weight.T.toarray(), rtol=0, atol=1e-10)
        np.testing.assert_allclose(b, layer.bias, rtol=0, atol=1e-10)
    np.testing.assert_allclose(clf.loss_curve_, [r.loss for r in reports], rtol=1e-10)
    xt = digits.x_test[:41]
    proba = clf.predict_proba(xt)
    z = reference_predict(expected, xt)
    want = np.exp(z - z.max(axis=1, keepdims=True))
    np.testing.assert_allclose(proba, want / want.sum(axis=1, keepdims=True), rtol=0,
                               atol=1e-10)
    # the same estimator on every rank, bit for bit
    mine = (np.concatenate([c.data for c in clf.coefs_]), clf.predict(xt), proba)
    for other in comm.allgather(mine):
        for a, b in zip(mine, other):
            np.testing.assert_array_equal(a, b)


def test_a_random_state_of_none_draws_one_seed_for_every_rank(comm):
    digits = load_dataset("digits", "float64")
    clf = SparseMLPClassifier((12,), max_iter=1, comm=comm).fit(digits.x_train[:100],
                                                               digits.y_train[:100])
    mine = clf.coefs_[0].toarray()
    assert all(np.array_equal(mine, other) for other in comm.allgather(mine))


def test_the_regressor_on_the_ranks_equals_the_serial_reference(comm):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((150, 12))
    y = np.stack([np.sin(x[:, 0]) + x[:, 1], x[:, 2] * x[:, 3]], axis=1)
    reg = SparseMLPRegressor((16, 8), fan_in=5, max_iter=3, random_state=2, activation="tanh",
                             learning_rate_init=0.01, comm=comm).fit(x, y)
    net = initial_network([12, 16, 8, 2], [5, 5, 5], seed=2, dtype="float64",
                          activations="tanh")
    expected, reports = reference_train(net, Dataset(name="r", x_train=x, y_train=y), 3, 150,
                                        AdamConfig(lr=0.01, weight_decay=1e-4), seed=2,
                                        loss="mse")
    for coef, layer in zip(reg.coefs_, expected.layers):
        np.testing.assert_allclose(coef.toarray(), layer.weight.T.toarray(), rtol=0, atol=1e-10)
    np.testing.assert_allclose(reg.loss_curve_, [r.loss for r in reports], rtol=1e-10)
    np.testing.assert_allclose(reg.predict(x[:20]), reference_predict(expected, x[:20]),
                               rtol=0, atol=1e-10)


def test_a_grid_search_on_the_ranks_gives_every_rank_the_same_choice(comm):
    """GridSearchCV clones the estimator, its communicator included, for every fit: the ranks
    search together and agree on the best parameters and the refitted network."""
    from sklearn.model_selection import GridSearchCV

    digits = load_dataset("digits", "float64")
    x, y = digits.x_train[:240], digits.y_train[:240]
    search = GridSearchCV(SparseMLPClassifier((16,), max_iter=4, random_state=0,
                                              learning_rate_init=0.01, comm=comm),
                          {"fan_in": [2, 16]}, cv=2).fit(x, y)
    assert search.best_params_ == {"fan_in": 16}
    mine = search.best_estimator_.coefs_[0].toarray()
    assert all(np.array_equal(mine, other) for other in comm.allgather(mine))


def test_a_bfloat16_fit_on_the_ranks_equals_the_serial_reference_at_its_rounding_points(comm):
    """dtype="bfloat16": the fit runs in bfloat16 (dtype_ says so) and ends as the serial
    reference's bfloat16 passes do, within float32 rounding; its predictions use them too."""
    digits = load_dataset("digits", "float32")
    x, y = digits.x_train[:300], digits.y_train[:300]
    clf = SparseMLPClassifier((24, 16), fan_in=7, max_iter=3, random_state=5, dtype="bfloat16",
                              learning_rate_init=0.01, comm=comm).fit(x, y)
    assert clf.dtype_ == "bfloat16" and clf.network_.dtype == np.float32
    net = initial_network([64, 24, 16, 10], [7, 7, 7], seed=5, dtype="float32",
                          activations="relu")
    expected, reports = reference_train(net, Dataset(name="d", x_train=x, y_train=y), 3, 200,
                                        AdamConfig(lr=0.01, weight_decay=1e-4), seed=5,
                                        bfloat16=True)
    for coef, layer in zip(clf.coefs_, expected.layers):
        np.testing.assert_allclose(coef.toarray(), layer.weight.T.toarray(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(clf.loss_curve_, [r.loss for r in reports], rtol=1e-5)
    xt = digits.x_test[:41]
    z = reference_predict(expected, xt, bfloat16=True)
    np.testing.assert_array_equal(clf.predict(xt), np.argmax(z, axis=1))
