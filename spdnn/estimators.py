"""spdnn as scikit-learn estimators: ``SparseMLPClassifier`` and ``SparseMLPRegressor`` take
the parameters of scikit-learn's ``MLPClassifier`` and ``MLPRegressor`` where they mean the
same thing, and train a sparse network with ``spdnn.train`` on the ranks of ``comm``.

``fit`` draws a random network of fixed fan-in, partitions it for the ranks (the partitioner
is found by its entry point: spdnn never imports the ``partition`` package), trains it, and
every rank returns the same fitted estimator. Under ``mpirun -n P`` every rank calls ``fit``
and ``predict`` with the same arrays (collective calls); in one process they are plain calls.
Needs scikit-learn (``pip install 'spdnn[sklearn]'``); docs/sklearn.md.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import scipy.sparse as sp

from spdnn.errors import OptionError, SpdnnError
from spdnn.model.options import RunOptions, TrainOptions, check_run_options, check_train_options
from spdnn.schema import options

try:
    from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin, clone
    from sklearn.model_selection import train_test_split
    from sklearn.utils import check_random_state
    from sklearn.utils.multiclass import check_classification_targets
    from sklearn.utils.validation import check_is_fitted, column_or_1d, validate_data
except ImportError as e:  # the optional extra is missing
    raise ImportError("spdnn's scikit-learn estimators need scikit-learn: "
                      "pip install 'spdnn[sklearn]'") from e

__all__ = ["SparseMLPClassifier", "SparseMLPRegressor"]

# scikit-learn's parameter -> the TrainOptions keyword it sets: the option's declaration
# (spdnn.schema) checks it, and its errors name the parameter.
AS_OPTION = {"solver": "optimizer", "learning_rate_init": "lr", "alpha": "weight_decay",
             "max_iter": "epochs", "shuffle": "shuffle", "n_iter_no_change": "early_stopping",
             "tol": "min_delta", "validation_fraction": "validation_split",
             "batch_size": "batch_size", "sparse_update": "sparse_update"}
# scikit-learn's names of activations that spdnn names otherwise (spdnn.model.activations)
ACTIVATIONS = {"logistic": "sigmoid"}
PARAMETER = {**{v: k for k, v in AS_OPTION.items()}, "activations": "activation",
             "method": "plan"}


def _by_parameter(err: OptionError) -> OptionError:
    return err.renamed(PARAMETER)


def initial_network(sizes: Sequence[int], fan_in: Sequence[int], *, seed: int, dtype: str,
                    activations: str | Sequence[str]) -> Any:  # noqa: ANN401
    """The network ``fit`` starts from: ``random_network``'s fixed fan-in pattern, weights and
    biases drawn as MLPClassifier draws its own (Glorot's uniform bound sqrt(6 / (fan_in +
    fan_out)), 2 in place of 6 for the logistic activation), with a neuron's inputs as its
    fan-in and an input's mean count of outputs as its fan-out."""
    from dataclasses import replace

    from spdnn.model.generate import random_network
    from spdnn.model.network import Layer

    net = random_network(sizes, list(fan_in), seed=seed, dtype=dtype, activations=activations)
    factor = 2.0 if all(a == "sigmoid" for a in net.activations) else 6.0
    rng = np.random.default_rng([seed, 1])
    layers = []
    for layer, n_in in zip(net.layers, sizes):
        w = layer.weight
        k = w.nnz / w.shape[0]
        bound = np.sqrt(factor / (k + w.nnz / n_in))
        values = rng.uniform(-bound, bound, w.nnz).astype(w.dtype)
        bias = rng.uniform(-bound, bound, w.shape[0]).astype(w.dtype)
        layers.append(Layer(sp.csr_matrix((values, w.indices, w.indptr), shape=w.shape), bias))
    return replace(net, layers=tuple(layers))


class _SparseMLP(BaseEstimator):
    """What the classifier and the regressor share: the parameters, the network, training."""

    def __init__(self, hidden_layer_sizes: int | Sequence[int] = (100,),
                 activation: str = "relu", *, solver: str = "adam", alpha: float = 0.0001,
                 batch_size: int | str = "auto", learning_rate_init: float = 0.001,
                 max_iter: int = 200, shuffle: bool = True, random_state: Any = None,  # noqa: ANN401
                 tol: float = 1e-4, verbose: bool = False, early_stopping: bool = False,
                 validation_fraction: float = 0.1, n_iter_no_change: int = 10,
                 fan_in: int = 32, density: float | None = None,
                 sparse_update: str | None = options(TrainOptions)["sparse_update"].default,
                 dtype: str | None = None, plan: str = "sweep",
                 comm: Any = None) -> None:  # noqa: ANN401
        self.hidden_layer_sizes = hidden_layer_sizes
        self.activation = activation
        self.solver = solver
        self.alpha = alpha
        self.batch_size = batch_size
        self.learning_rate_init = learning_rate_init
        self.max_iter = max_iter
        self.shuffle = shuffle
        self.random_state = random_state
        self.tol = tol
        self.verbose = verbose
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.fan_in = fan_in
        self.density = density
        self.sparse_update = sparse_update
        self.dtype = dtype
        self.plan = plan
        self.comm = comm

    def __sklearn_tags__(self) -> Any:  # noqa: ANN401
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags

    def __sklearn_clone__(self) -> _SparseMLP:
        """An unfitted copy (scikit-learn's clone) that shares ``comm``: a communicator is a
        handle on the job's ranks, which a deep copy cannot duplicate."""
        params = self.get_params(deep=False)
        comm = params.pop("comm")
        return type(self)(**{k: clone(v, safe=False) for k, v in params.items()}, comm=comm)

    # --- the parameters, checked where fit starts ---

    @contextmanager
    def _communicator(self) -> Iterator[Any]:
        """The job's communicator for one call: ``comm``, or a duplicate of every rank's that
        the call frees when it ends (a grid search makes thousands of calls)."""
        from spdnn.api import _communicator
        from spdnn.comm.mpi import Communicator

        comm = _communicator(self.comm)
        try:
            yield comm
        finally:
            if not isinstance(self.comm, Communicator):
                comm.free()

    def _fit(self, x: Any, targets: np.ndarray, n_out: int, *, epochs: int,  # noqa: ANN401
             early: bool, fresh: bool) -> None:
        """Train a new network (``fresh``) or the fitted one on the ranks."""
        with self._communicator() as comm:
            seed = self._seed(comm)
            if fresh:  # the value type of the run (bfloat16: a float32 network, rounded)
                self.dtype_ = self._dtype(x)
            network = self._network(x.shape[1], n_out, seed, self.dtype_) if fresh \
                else self.network_
            self._train(x, targets, network, epochs=epochs, early=early, seed=seed, comm=comm)

    def _sizes(self, n_in: int, n_out: int) -> list[int]:
        hidden = self.hidden_layer_sizes
        hidden = [hidden] if isinstance(hidden, (int, np.integer)) else list(hidden)
        if not all(isinstance(h, (int, np.integer)) and not isinstance(h, bool) and h > 0
                   for h in hidden):
            raise OptionError("hidden_layer_sizes", f"must be positive integers, not "
                                                    f"{self.hidden_layer_sizes!r}")
        return [n_in, *map(int, hidden), n_out]

    def _fan_in(self, sizes: list[int]) -> list[int]:
        """Each layer's fan-in: ``density`` of its inputs when given (at least one), else
        ``fan_in`` (all of them when fewer)."""
        if self.density is not None:
            d = self.density
            if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 < d <= 1:
                raise OptionError("density", f"must be a fraction in (0, 1], not {d!r}")
            return [max(1, round(d * n)) for n in sizes[:-1]]
        f = self.fan_in
        if isinstance(f, bool) or not isinstance(f, (int, np.integer)) or f < 1:
            raise OptionError("fan_in", f"must be a positive integer, not {f!r}")
        return [min(int(f), n) for n in sizes[:-1]]

    def _options(self, n_samples: int, epochs: int, early: bool, seed: int) -> TrainOptions:
        batch = self.batch_size
        if isinstance(batch, str) and batch == "auto":
            batch = min(200, n_samples)
        elif isinstance(batch, (int, np.integer)) and not isinstance(batch, bool) and batch > 0:
            batch = min(int(batch), n_samples)  # as MLPClassifier clips it
        given = dict(optimizer=self.solver, lr=self.learning_rate_init, weight_decay=self.alpha,
                     epochs=epochs, shuffle=self.shuffle, early_stopping=self.n_iter_no_change,
                     min_delta=self.tol, batch_size=batch, sparse_update=self.sparse_update,
                     validation_split=self.validation_fraction if early else None,
                     loss=self._loss, seed=seed)
        try:
            opt = TrainOptions(**given)
            check_train_options(opt)
        except OptionError as e:
            raise _by_parameter(e) from None
        return opt

    def _seed(self, comm: Any) -> int:  # noqa: ANN401
        """One seed for the network, the order of the samples and the validation split: the
        same on every rank (a random one is drawn on rank 0)."""
        if isinstance(self.random_state, (int, np.integer)) and \
                not isinstance(self.random_state, bool):
            return int(self.random_state) % 2**31
        drawn = int(check_random_state(self.random_state).randint(2**31 - 1))
        return comm.bcast(drawn if comm.rank == 0 else None)

    # --- training ---

    def _dtype(self, x: Any) -> str:  # noqa: ANN401
        """``dtype``, or X's value type (float64 unless X is float32), as MLPClassifier
        computes in X's."""
        if self.dtype is None:
            return "float32" if x.dtype == np.float32 else "float64"
        try:
            check_run_options(RunOptions(dtype=self.dtype))
        except OptionError as e:
            raise _by_parameter(e) from None
        return self.dtype

    def _network(self, n_in: int, n_out: int, seed: int, dtype: str) -> Any:  # noqa: ANN401

        sizes = self._sizes(n_in, n_out)
        fans = self._fan_in(sizes)
        given = self.activation
        activation = ACTIVATIONS.get(given, given) if isinstance(given, str) else \
            [ACTIVATIONS.get(a, a) for a in given]
        try:
            return initial_network(sizes, fans, seed=seed, dtype=dtype,
                                   activations=activation)
        except OptionError as e:
            raise _by_parameter(e) from None

    def _plan(self, comm: Any, network: Any, seed: int) -> Any:  # noqa: ANN401
        """The plan for the ranks of ``comm``, made on rank 0 and broadcast (None alone)."""
        if comm.size == 1:
            return None
        from spdnn.plugins import entry_point

        partition = entry_point("spdnn.partitioners", "partition")
        if partition is None:
            raise SpdnnError("no partitioner is installed (the entry point "
                             "spdnn.partitioners): reinstall spdnn")

        def make() -> Any:  # noqa: ANN401
            try:
                return partition(network, parts=comm.size, method=self.plan, seed=seed)
            except OptionError as e:
                raise _by_parameter(e) from None

        return comm.bcast(comm.check(lambda: make() if comm.rank == 0 else None))

    def _train(self, x: Any, y: np.ndarray, network: Any, *, epochs: int, early: bool,  # noqa: ANN401
               seed: int, comm: Any) -> None:  # noqa: ANN401
        """Train ``network`` on (x, y) and set the fitted attributes."""
        import spdnn

        opt = self._options(len(y), epochs, early, seed)
        held = []
        if early:  # a stratified random validation set, as MLPClassifier holds out
            train, held = train_test_split(np.arange(len(y)), random_state=seed,
                                           test_size=self.validation_fraction,
                                           stratify=self._stratify(y))
            order = np.concatenate([train, held])
            x, y = x[order], y[order]
            opt = _replace(opt, validation_split=len(held) / len(y))
        plan = self._plan(comm, network, seed)
        try:
            result = spdnn.train(network, data=(x, y), run=RunOptions(
                plan=plan, dtype=self.dtype_),
                                 options=opt, comm=comm, verbose=bool(self.verbose),
                                 return_network=True)
        except OptionError as e:
            raise _by_parameter(e) from None
        net = result.network
        self.network_ = net
        self.coefs_ = [sp.csr_matrix(layer.weight.T) for layer in net.layers]
        self.intercepts_ = [np.array(layer.bias) for layer in net.layers]
        self.n_layers_ = net.n_layers + 1
        self.n_outputs_ = net.sizes[-1]
        self.n_iter_ = getattr(self, "n_iter_", 0) + len(result.epochs)
        self.t_ = getattr(self, "t_", 0) + len(result.epochs) * (len(y) - len(held))
        losses = [r.loss for r in result.epochs]
        self.loss_curve_ = getattr(self, "loss_curve_", []) + losses
        self.loss_ = self.loss_curve_[-1] if self.loss_curve_ else None
        if early:
            self.validation_scores_ = self._validation_scores(result.epochs, y[-len(held):])
            self.best_validation_score_ = max(self.validation_scores_)
            self.best_loss_ = None
        else:
            self.validation_scores_ = None
            self.best_validation_score_ = None
            self.best_loss_ = min(self.loss_curve_) if self.loss_curve_ else None

    def _scores(self, x: Any) -> np.ndarray:  # noqa: ANN401
        """The output layer's values for each sample (samples x outputs), on every rank."""
        import spdnn

        check_is_fitted(self, "network_")
        x = validate_data(self, x, accept_sparse="csr", dtype=(np.float64, np.float32),
                          reset=False)
        with self._communicator() as comm:
            # every rank holds the whole network: the ranks share the samples (replicas)
            return spdnn.predict(self.network_, x, run=RunOptions(
                dtype=self.dtype_, replicas=comm.size), scores=True, comm=comm)


def _replace(opt: TrainOptions, **changes: Any) -> TrainOptions:  # noqa: ANN401
    from dataclasses import replace

    return replace(opt, **changes)


class SparseMLPClassifier(ClassifierMixin, _SparseMLP):
    """A sparse multi-layer perceptron classifier trained by spdnn: softmax cross-entropy
    over the classes of ``y``, fixed fan-in layers (``fan_in``, or ``density`` of each
    layer's inputs), scikit-learn's ``MLPClassifier`` parameters otherwise (docs/sklearn.md
    says where they differ). Learned: ``coefs_`` and ``intercepts_`` (scipy.sparse, inputs x
    outputs per layer, as MLPClassifier's), ``classes_``, ``loss_curve_``,
    ``validation_scores_``, ``n_iter_``, ``network_`` (the spdnn.Network)."""

    _loss = "cross_entropy"

    def _stratify(self, y: np.ndarray) -> np.ndarray:
        return y

    def _validation_scores(self, reports: Sequence[Any], held: np.ndarray) -> list[float]:
        """Each epoch's accuracy on the validation set, as MLPClassifier scores it."""
        return [r.validation_accuracy for r in reports]

    def _targets(self, y: Any, reset: bool) -> np.ndarray:  # noqa: ANN401
        y = column_or_1d(y, warn=True)
        check_classification_targets(y)
        if reset:
            self.classes_ = np.unique(y)
        unknown = np.setdiff1d(y, self.classes_)
        if len(unknown):
            raise ValueError(f"y holds labels not in classes_: {unknown[:5].tolist()}")
        return np.searchsorted(self.classes_, y).astype(np.int64)

    def fit(self, X: Any, y: Any) -> SparseMLPClassifier:  # noqa: ANN401, N803
        """Train a new network on (X, y); collective under MPI. Returns self."""
        for name in ("network_", "n_iter_", "t_", "loss_curve_"):
            self.__dict__.pop(name, None)
        x, y = validate_data(self, X, y, accept_sparse="csr", dtype=(np.float64, np.float32),
                             multi_output=True)
        labels = self._targets(y, reset=True)
        if len(self.classes_) < 2:
            raise ValueError(f"a classifier needs samples of at least 2 classes; y holds 1 "
                             f"class ({self.classes_[0]!r})")
        self._fit(x, labels, len(self.classes_), epochs=self.max_iter,
                  early=bool(self.early_stopping), fresh=True)
        return self

    def partial_fit(self, X: Any, y: Any, classes: Any = None) -> SparseMLPClassifier:  # noqa: ANN401, N803
        """One pass over (X, y), from the fitted network (or a new one, whose ``classes``
        must then be given); the optimizer's state starts afresh on each call. Returns
        self."""
        first = not hasattr(self, "network_")
        if first and classes is None:
            raise ValueError("classes must be passed on the first call to partial_fit")
        x, y = validate_data(self, X, y, accept_sparse="csr", dtype=(np.float64, np.float32),
                             multi_output=True, reset=first)
        if first:
            self._targets(classes, reset=True)
            if len(self.classes_) < 2:
                raise ValueError("a classifier needs at least 2 classes")
        elif classes is not None and not np.array_equal(np.unique(classes), self.classes_):
            raise ValueError(f"classes={classes!r} differs from the classes of the first call "
                             f"{self.classes_.tolist()}")
        labels = self._targets(y, reset=False)
        self._fit(x, labels, len(self.classes_), epochs=1, early=False, fresh=first)
        return self

    def predict_proba(self, X: Any) -> np.ndarray:  # noqa: ANN401, N803
        """The probability of each class (samples x classes): the softmax of the outputs."""
        z = self._scores(X).astype(np.float64)
        z -= z.max(axis=1, keepdims=True)
        np.exp(z, out=z)
        z /= z.sum(axis=1, keepdims=True)
        return z

    def predict_log_proba(self, X: Any) -> np.ndarray:  # noqa: ANN401, N803
        return np.log(self.predict_proba(X))

    def predict(self, X: Any) -> np.ndarray:  # noqa: ANN401, N803
        """The class of each sample (the labels of ``classes_``)."""
        scores = self._scores(X)
        return self.classes_[np.argmax(scores, axis=1)]


class SparseMLPRegressor(RegressorMixin, _SparseMLP):
    """A sparse multi-layer perceptron regressor trained by spdnn: the mean squared error
    over the targets (one, or several: ``y`` as samples x outputs) of a linear output layer,
    fixed fan-in layers (``fan_in``, or ``density`` of each layer's inputs), scikit-learn's
    ``MLPRegressor`` parameters otherwise (docs/sklearn.md says where they differ). Learned:
    ``coefs_``, ``intercepts_``, ``loss_curve_``, ``validation_scores_`` (R^2), ``n_iter_``,
    ``network_``."""

    _loss = "mse"

    def __sklearn_tags__(self) -> Any:  # noqa: ANN401
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags

    def _stratify(self, y: np.ndarray) -> None:
        return None

    def _validation_scores(self, reports: Sequence[Any], held: np.ndarray) -> list[float]:
        """Each epoch's R^2 on the validation set from its mean squared error: 1 - the
        squared errors' sum / the targets' (about their mean) sum, over every output (for
        one output, MLPRegressor's score)."""
        spread = float(np.sum((held - held.mean(axis=0)) ** 2))
        return [1.0 - r.validation_loss * held.size / spread if spread > 0 else float("nan")
                for r in reports]

    def _targets(self, y: Any) -> np.ndarray:  # noqa: ANN401
        y = np.asarray(y, dtype=np.float64)
        return y.reshape(len(y), -1)

    def fit(self, X: Any, y: Any) -> SparseMLPRegressor:  # noqa: ANN401, N803
        """Train a new network on (X, y); collective under MPI. Returns self."""
        for name in ("network_", "n_iter_", "t_", "loss_curve_"):
            self.__dict__.pop(name, None)
        x, y = validate_data(self, X, y, accept_sparse="csr", dtype=(np.float64, np.float32),
                             multi_output=True, y_numeric=True)
        targets = self._targets(y)
        self._fit(x, targets, targets.shape[1], epochs=self.max_iter,
                  early=bool(self.early_stopping), fresh=True)
        return self

    def partial_fit(self, X: Any, y: Any) -> SparseMLPRegressor:  # noqa: ANN401, N803
        """One pass over (X, y), from the fitted network (or a new one); the optimizer's
        state starts afresh on each call. Returns self."""
        first = not hasattr(self, "network_")
        x, y = validate_data(self, X, y, accept_sparse="csr", dtype=(np.float64, np.float32),
                             multi_output=True, y_numeric=True, reset=first)
        targets = self._targets(y)
        if not first and targets.shape[1] != self.n_outputs_:
            raise ValueError(f"y has {targets.shape[1]} targets per sample; the fitted "
                             f"network has {self.n_outputs_} outputs")
        self._fit(x, targets, targets.shape[1], epochs=1, early=False, fresh=first)
        return self

    def predict(self, X: Any) -> np.ndarray:  # noqa: ANN401, N803
        """The network's outputs for each sample: one value a sample for one output, else
        samples x outputs (as MLPRegressor)."""
        out = self._scores(X)
        return out.ravel() if out.shape[1] == 1 else out
