"""SparseMLPClassifier under MPI: fit partitions the network for the ranks and trains it
there; every rank returns the same fitted estimator, equal to the serial reference's."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sklearn", reason="scikit-learn (the sklearn extra) is not installed")

from spdnn.estimators import SparseMLPClassifier  # noqa: E402
from spdnn.io.loaders import Dataset, load_dataset  # noqa: E402
from spdnn.model.generate import random_network  # noqa: E402
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
    net = random_network([64, 24, 16, 10], [7, 7, 7], seed=5, dtype="float64")
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
