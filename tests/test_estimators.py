"""spdnn as scikit-learn estimators (spdnn.estimators): scikit-learn's own estimator checks,
Pipeline, GridSearchCV and cross_val_score; the fitted networks against the serial reference;
parameters checked by the options' declarations and named as the caller named them."""

from __future__ import annotations

import numpy as np
import pytest

sklearn = pytest.importorskip("sklearn", reason="scikit-learn (the sklearn extra) is not "
                                                "installed")

import scipy.sparse as sp  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import GridSearchCV, cross_val_score  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402
from sklearn.utils.estimator_checks import parametrize_with_checks  # noqa: E402

from spdnn.errors import OptionError  # noqa: E402
from spdnn.estimators import (  # noqa: E402
    SparseMLPClassifier,
    SparseMLPRegressor,
    initial_network,
)
from spdnn.io.loaders import Dataset  # noqa: E402
from spdnn.optim import AdamConfig, SGDConfig  # noqa: E402
from spdnn.reference import train as reference_train  # noqa: E402


@parametrize_with_checks([SparseMLPClassifier(), SparseMLPRegressor()])
def test_scikit_learns_estimator_checks(estimator, check):
    """Every check of sklearn.utils.estimator_checks.check_estimator, none excluded."""
    check(estimator)


def _digits(n=600):
    x, y = load_digits(return_X_y=True)
    return StandardScaler().fit_transform(x[:n]), y[:n]


def test_the_fitted_network_is_the_serial_references():
    """fit draws the network that initial_network draws from random_state and trains it as
    the serial reference trains it (Adam, alpha as weight decay, batches of min(200, n),
    shuffled by the seed): the same weights, coefs_ as its transposes, the same losses."""
    x, y = _digits(450)
    clf = SparseMLPClassifier((20, 12), fan_in=9, max_iter=4, random_state=7, alpha=1e-3,
                              learning_rate_init=0.01).fit(x, y)
    net = initial_network([64, 20, 12, 10], [9, 9, 9], seed=7, dtype="float64",
                          activations="relu")
    expected, reports = reference_train(net, Dataset(name="digits", x_train=x, y_train=y), 4,
                                        200, AdamConfig(lr=0.01, weight_decay=1e-3), seed=7)
    assert clf.n_iter_ == 4 and clf.network_.dtype == np.float64
    for coef, b, layer in zip(clf.coefs_, clf.intercepts_, expected.layers):
        assert sp.issparse(coef) and coef.shape == layer.weight.T.shape
        np.testing.assert_allclose(coef.toarray(), layer.weight.T.toarray(), rtol=0, atol=1e-10)
        np.testing.assert_allclose(b, layer.bias, rtol=0, atol=1e-10)
    np.testing.assert_allclose(clf.loss_curve_, [r.loss for r in reports], rtol=1e-10)
    assert clf.best_loss_ == min(clf.loss_curve_) and clf.validation_scores_ is None


def test_labels_of_any_kind_come_back_as_given():
    x, y = _digits(300)
    names = np.array(["zero", "one", "two", "three", "four", "five", "six", "seven", "eight",
                      "nine"])
    params = dict(hidden_layer_sizes=(32,), max_iter=30, random_state=0,
                  learning_rate_init=0.01)
    clf = SparseMLPClassifier(**params).fit(x, names[y])
    assert list(clf.classes_) == sorted(names)
    # the classes in sorted order are the outputs: the same network as integer labels that
    # number them so
    rank = np.searchsorted(np.sort(names), names)
    ints = SparseMLPClassifier(**params).fit(x, rank[y])
    np.testing.assert_array_equal(clf.predict(x), np.sort(names)[ints.predict(x)])
    assert clf.score(x, names[y]) > 0.8
    np.testing.assert_allclose(clf.predict_proba(x).sum(axis=1), 1.0, rtol=1e-12)


def test_early_stopping_holds_out_a_stratified_validation_set():
    """With early_stopping the last validation_fraction of a stratified random split is held
    out and scored each epoch (validation_scores_); training ends after n_iter_no_change
    epochs without a validation loss lower by more than tol."""
    x, y = _digits(500)
    clf = SparseMLPClassifier((32,), max_iter=200, random_state=1, early_stopping=True,
                              validation_fraction=0.2, n_iter_no_change=2, tol=0.05,
                              learning_rate_init=0.01).fit(x, y)
    assert 2 < clf.n_iter_ < 200
    assert len(clf.validation_scores_) == clf.n_iter_
    assert clf.best_validation_score_ == max(clf.validation_scores_)
    assert all(0 <= s <= 1 for s in clf.validation_scores_)


def test_partial_fit_is_one_epoch_from_the_fitted_network():
    """A first partial_fit equals fit with max_iter=1; a second continues from its weights
    (a fresh estimator's two epochs differ from it only by the optimizer's state)."""
    x, y = _digits(400)
    common = dict(hidden_layer_sizes=(16,), random_state=3, solver="sgd",
                  learning_rate_init=0.05)
    one = SparseMLPClassifier(max_iter=1, **common).fit(x, y)
    inc = SparseMLPClassifier(**common).partial_fit(x, y, classes=np.arange(10))
    for a, b in zip(one.coefs_, inc.coefs_):
        np.testing.assert_array_equal(a.toarray(), b.toarray())
    inc.partial_fit(x, y)
    assert inc.n_iter_ == 2 and len(inc.loss_curve_) == 2
    net = one.network_
    expected, _ = reference_train(net, Dataset(name="d", x_train=x, y_train=y), 1, 200,
                                  SGDConfig(0.05, 0.9, 1e-4), seed=3)
    for coef, layer in zip(inc.coefs_, expected.layers):
        np.testing.assert_allclose(coef.toarray(), layer.weight.T.toarray(), rtol=0, atol=1e-10)
    with pytest.raises(ValueError, match="classes must be passed"):
        SparseMLPClassifier().partial_fit(x, y)
    with pytest.raises(ValueError, match="X has 63 features"):
        inc.partial_fit(x[:, 1:], y)


def test_in_a_pipeline_a_grid_search_and_cross_validation():
    x, y = _digits(500)
    pipe = make_pipeline(StandardScaler(), SparseMLPClassifier(
        (24,), max_iter=30, learning_rate_init=0.01, random_state=0))
    scores = cross_val_score(pipe, x, y, cv=3)
    assert scores.shape == (3,) and scores.min() > 0.7
    grid = GridSearchCV(SparseMLPClassifier((24,), max_iter=20, learning_rate_init=0.01,
                                            random_state=0),
                        {"solver": ["sgd", "adam"], "fan_in": [4, 16]}, cv=2).fit(x, y)
    assert grid.best_params_["fan_in"] == 16  # four inputs of 64 learn less than sixteen
    assert grid.best_estimator_.coefs_[0].getnnz(axis=0).max() == 16


def test_density_sets_each_layers_fan_in():
    x, y = _digits(200)
    clf = SparseMLPClassifier((40, 20), density=0.25, max_iter=1, random_state=0).fit(x, y)
    assert [c.getnnz(axis=0).max() for c in clf.coefs_] == [16, 10, 5]
    assert [c.getnnz(axis=0).min() for c in clf.coefs_] == [16, 10, 5]


@pytest.mark.parametrize(("params", "message"), [
    (dict(solver="lbfgs"), "solver must be one of sgd, adam"),
    (dict(learning_rate_init=-1.0), "learning_rate_init must be"),
    (dict(max_iter=0), "max_iter must be"),
    (dict(batch_size=0), "batch_size must be"),
    (dict(tol=-1.0), "tol must be"),
    (dict(alpha=-0.1), "alpha must be"),
    (dict(sparse_update="grow"), "sparse_update must be one of"),
    (dict(activation="softsign"), "activation softsign"),
    (dict(hidden_layer_sizes=(10, 0)), "hidden_layer_sizes must be positive integers"),
    (dict(fan_in=0), "fan_in must be a positive integer"),
    (dict(density=1.5), "density must be a fraction in (0, 1]"),
    (dict(dtype="float16"), "dtype must be one of"),
    (dict(early_stopping=True, validation_fraction=1.0), "validation_fraction must be"),
])
def test_bad_parameters_are_refused_by_the_name_the_caller_gave(params, message):
    """Each parameter is checked by the declaration of the option it sets (spdnn.schema),
    at fit, and the error names the estimator's parameter, not spdnn's keyword."""
    x, y = _digits(100)
    with pytest.raises(OptionError) as err:
        SparseMLPClassifier(**{"max_iter": 1, **params}).fit(x, y)
    assert str(err.value).startswith(message), str(err.value)


def _regression(n=240, outputs=2):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((n, 12))
    y = np.stack([np.sin(x[:, 0]) + 0.5 * x[:, 1], x[:, 2] * x[:, 3], x[:, 4] - x[:, 5]],
                 axis=1)[:, :outputs]
    return x, y


def test_the_regressors_network_is_the_serial_references():
    """The regressor trains its network on the real-valued targets with the mean squared
    error, as the serial reference does; one target comes back as one value a sample."""
    x, y = _regression()
    reg = SparseMLPRegressor((16, 8), fan_in=5, max_iter=3, random_state=2,
                             learning_rate_init=0.01).fit(x, y)
    net = initial_network([12, 16, 8, 2], [5, 5, 5], seed=2, dtype="float64",
                          activations="relu")
    expected, reports = reference_train(net, Dataset(name="r", x_train=x, y_train=y), 3, 200,
                                        AdamConfig(lr=0.01, weight_decay=1e-4), seed=2,
                                        loss="mse")
    for coef, b, layer in zip(reg.coefs_, reg.intercepts_, expected.layers):
        np.testing.assert_allclose(coef.toarray(), layer.weight.T.toarray(), rtol=0, atol=1e-10)
        np.testing.assert_allclose(b, layer.bias, rtol=0, atol=1e-10)
    np.testing.assert_allclose(reg.loss_curve_, [r.loss for r in reports], rtol=1e-10)
    assert reg.predict(x).shape == (240, 2)
    one = SparseMLPRegressor((16,), max_iter=2, random_state=2).fit(x, y[:, 0])
    assert one.predict(x).shape == (240,) and one.n_outputs_ == 1


def test_the_regressors_validation_scores_are_r2_on_the_held_out_samples():
    """With early_stopping a random validation_fraction is held out (train_test_split by
    random_state, as MLPRegressor) and validation_scores_ are its R^2: the last one equals
    scikit-learn's r2_score of the fitted network on those samples (variance weighted over
    the outputs; for one output, the plain R^2)."""
    from sklearn.metrics import r2_score
    from sklearn.model_selection import train_test_split

    x, y = _regression(300)
    for targets, average in ((y, "variance_weighted"), (y[:, 0], "uniform_average")):
        reg = SparseMLPRegressor((32,), max_iter=8, random_state=4, early_stopping=True,
                                 validation_fraction=0.25, learning_rate_init=0.01,
                                 n_iter_no_change=20).fit(x, targets)
        _, held = train_test_split(np.arange(300), random_state=4, test_size=0.25)
        assert reg.n_iter_ == 8 and len(reg.validation_scores_) == 8
        want = r2_score(targets[held], reg.predict(x[held]), multioutput=average)
        assert reg.validation_scores_[-1] == pytest.approx(want, rel=1e-9)
        assert reg.best_validation_score_ == max(reg.validation_scores_)


def test_the_regressor_in_a_pipeline_and_cross_validation():
    x, y = _regression(300, outputs=1)
    pipe = make_pipeline(StandardScaler(), SparseMLPRegressor((32,), max_iter=100,
                                                             learning_rate_init=0.01,
                                                             random_state=0))
    scores = cross_val_score(pipe, x, y.ravel(), cv=3)
    assert scores.shape == (3,) and scores.min() > 0.5
