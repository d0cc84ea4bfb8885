"""Option records and results of the Python API (``spdnn.train``, ``spdnn.infer``) and of
the commands built on it. Built by keyword; string choices are ``Literal``."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from spdnn.errors import OptionError, SpdnnError
from spdnn.model.choices import DTYPE_NAMES, EXCHANGES, Dtype, Exchange
from spdnn.model.plan import Plan
from spdnn.model.reports import EpochReport

Path = str | os.PathLike
Loss = Literal["cross_entropy", "mse"]


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """Where and how a job runs: the plan (``None``: one part), replicas of it (P = replicas x
    the plan's parts; ``"auto"``: the grid the cost model predicts fastest among ``plans`` and
    pure data parallelism, from a ``calibration`` file), arithmetic and exchange."""

    plan: Path | Plan | None = None  # a plan file, or a Plan in memory
    replicas: int | Literal["auto"] = 1
    plans: tuple[Path, ...] = ()  # the candidates of replicas="auto" (besides ``plan``)
    calibration: Path | None = None
    cluster: Path | None = None
    dtype: Dtype = "float32"
    exchange: Exchange = "auto"
    # Threads of each rank's sparse kernels; None: SPDNN_THREADS when set, else 1 (as the
    # command line's --threads).
    threads: int | None = None
    # Seconds any one wait for other ranks may last once the job runs (None: no limit): past
    # it the job ends with one line naming the rank, peers and layer (docs/failures.md).
    comm_timeout: float | None = 600.0
    # Bytes a rank may hold (None: the cgroup's limit, else the node's memory / its ranks; 0:
    # no limit): a job whose predicted peak passes it is refused before it loads anything.
    memory_limit: int | None = None
    dry_run: bool = False  # print each rank's predicted memory and stop before loading
    # Inference: read the weights in blocks of at most this many layers (None: only when
    # they pass memory_limit; docs/memory.md). Training holds every layer.
    stream_layers: int | None = None


@dataclass(frozen=True, kw_only=True)
class TrainOptions:
    """Minibatch training with ``torch.optim``'s optimizers (``optimizer``: sgd, adam or
    adamw; the hyper-parameters left None take that optimizer's defaults, torch's:
    ``spdnn.model.optim``), checkpoints and the lossy speed-ups (``compress``: none, topk:R,
    dgc:R, sidco:R[:exp|gamma|gpareto] or hylo)."""

    epochs: int = 10
    batch_size: int = 64
    optimizer: str = "sgd"
    lr: float | None = None  # sgd 0.05 (torch has no default), adam and adamw 1e-3
    momentum: float | None = None  # sgd: 0.9
    nesterov: bool | None = None  # sgd: False
    betas: tuple[float, float] | None = None  # adam, adamw: (0.9, 0.999)
    eps: float | None = None  # adam, adamw: 1e-8
    weight_decay: float | None = None  # sgd, adam 0; adamw 1e-2 (decoupled)
    # the rate's schedule over the job's planned steps (spdnn.model.schedule)
    lr_schedule: str = "constant"  # constant | step | cosine
    warmup_steps: int = 0
    min_lr: float = 0.0  # cosine's floor
    step_size: int | None = None  # step: steps between decays by gamma
    gamma: float = 0.1
    clip_grad_norm: float | None = None  # torch.nn.utils.clip_grad_norm_'s max_norm
    # inverted dropout on hidden outputs in training: one rate, or one per hidden layer
    dropout: float | tuple[float, ...] | None = None
    # the last fraction of the training samples in file order, held out and scored each
    # epoch (the test split is then scored once, after training); the lowest validation loss's
    # network written to save_best; training ended after early_stopping epochs without one
    validation_split: float | None = None
    save_best: Path | None = None
    early_stopping: int | None = None
    loss: Loss = "cross_entropy"
    seed: int = 0
    shuffle: bool = True
    max_steps: int | None = None
    checkpoint_dir: Path | None = None
    checkpoint_every: int | None = None
    resume: Path | None = None
    resume_with_changes: bool = False
    compress: str = "none"
    compress_min_values: int = 0
    critical_set: float | None = None
    refresh: int | None = None
    lsh: str | None = None  # LAYER:K:L[:dwta|simhash], on the output layer (SLIDE)
    lsh_max_active: int | None = None  # retrieved output neurons kept per sample
    lsh_random: int = 0  # random output neurons added per sample in training
    lsh_top_bias: int = 0  # output neurons of largest bias added to every sample in training
    lsh_estimate_tail: bool = False  # the random ones stand for every output not retrieved
    rehash: int = 50  # steps before the first rebuild of the LSH tables
    # topology updates (spdnn.model.sparsity): set or rigl, every update_every steps, the
    # fraction drop_fraction decayed by a cosine to zero at update_until (a fraction of the
    # job's planned steps, or a step), in update_scope row
    sparse_update: str | None = None
    update_every: int = 100
    drop_fraction: float = 0.3
    update_until: float | int = 0.75
    update_scope: str = "row"
    grow_locality: float = 1.0  # growth W times as likely (set) or scored W times (rigl) near
    replan: str = "never"  # never | auto | every:K: refine the plan for the current topology
    save_plan: Path | None = None  # the plan in force at the end, for the final topology


Ints = tuple[int, ...]
Floats = tuple[float, ...]


def _plain(value: Any) -> Any:  # noqa: ANN401 (JSON's shapes)
    """Tuples as lists, all the way down, as JSON holds them."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True, kw_only=True)
class LayerTraffic:
    """Per layer k = 1..L (index k - 1), summed over the ranks, passes and replicas: rows
    expanded into it (forward) and folded out of it (backward), and their bytes as dense rows
    (rows x samples x item size)."""

    forward_rows: Ints
    forward_bytes: Ints
    backward_rows: Ints
    backward_bytes: Ints


@dataclass(frozen=True, kw_only=True)
class CountedTraffic(LayerTraffic):
    """What the ranks moved, per layer: as ``LayerTraffic``, with the bytes actually sent
    (sparse or dense encoding) and the messages."""

    forward_sent: Ints
    backward_sent: Ints
    forward_messages: Ints
    backward_messages: Ints


class _Report:
    def as_dict(self) -> dict[str, Any]:
        """As ``--metrics-out`` writes it (docs/formats.md): dicts and lists."""
        return _plain(asdict(self))  # type: ignore[call-overload]


@dataclass(frozen=True, kw_only=True)
class TrafficReport(_Report):
    """What a run exchanged, counted, beside the plan's prediction (its volume x passes);
    ``equal`` when rows and dense bytes agree. Per layer, the gradient sums over replicas:
    values each rank put in, bytes, and under compression the values selected of those
    considered."""

    counted: CountedTraffic
    predicted: LayerTraffic
    equal: bool
    plan_volume_rows: int  # forward + backward rows of one pass
    predicted_from: Literal["plan", "schedule"]  # the plan's statistics, or the ghost rows
    gradient_sum_values: Ints
    gradient_sum_bytes: Ints
    gradient_sum_selected: Ints
    gradient_sum_considered: Ints



@dataclass(frozen=True, kw_only=True)
class PassSeconds:
    """Seconds per layer (index k - 1) in the forward and the backward pass."""

    forward: Floats
    backward: Floats


@dataclass(frozen=True, kw_only=True)
class GradientSumSeconds:
    """Seconds per layer in starting the gradient sums over replicas (``post``, of which
    ``select``: compressing), and in waiting for them after the backward pass."""

    post: Floats
    select: Floats
    wait: Floats


@dataclass(frozen=True, kw_only=True)
class TimingReport(_Report):
    """Where a run's time went, per layer, the slowest rank's: compute, packing and posting
    messages (``comm``), waiting for them, and the gradient sums over replicas."""

    compute: PassSeconds
    comm: PassSeconds
    wait: PassSeconds
    gradient_sum: GradientSumSeconds



def _as_dict(report: TrafficReport | TimingReport | None) -> dict[str, Any] | None:
    return None if report is None else report.as_dict()


@dataclass(frozen=True, kw_only=True)
class TrainResult:
    """What ``train`` returns on every rank (the metrics ``--metrics-out`` writes)."""

    epochs: tuple[EpochReport, ...]
    rank: int  # of this process in the job's communicator (print on rank 0 only)
    ranks: int
    parts: int
    replicas: int
    plan_method: str | None
    kernels: str
    traffic: TrafficReport | None = None
    timing: TimingReport | None = None
    # per rank: peak_bytes (measured), predicted_bytes and held_bytes by kind (docs/memory.md)
    memory: dict[str, Any] = field(default_factory=dict)
    # with a validation split: the test split's accuracy, scored once after training
    test_accuracy: float | None = None
    # with sparse_update: one record per update (spdnn.runtime.topology.UpdateRecord)
    topology_updates: tuple[dict[str, Any], ...] = ()

    @property
    def accuracy(self) -> float | None:
        """The accuracy on the test split: after training (with a validation split), else
        the last epoch's (as ``InferResult.accuracy``)."""
        if self.test_accuracy is not None:
            return self.test_accuracy
        return self.epochs[-1].test_accuracy if self.epochs else None

    def metrics(self) -> dict[str, Any]:
        return {"ranks": self.ranks, "epochs": [r.as_dict() for r in self.epochs],
                "traffic": _as_dict(self.traffic), "timing": _as_dict(self.timing),
                "plan": self.plan_method, "kernels": self.kernels, "memory": self.memory,
                "test_accuracy": self.test_accuracy,
                "topology_updates": list(self.topology_updates)}


@dataclass(frozen=True, kw_only=True)
class InferResult:
    """What ``infer`` returns on every rank: the accuracy on a labelled data set (on label
    sets, P@1, also ``precision_at_1``, and ``precision_at_5``), or the Graph Challenge
    categories (``categories``, 0-based, and the rate in edges per second)."""

    samples: int
    seconds: float
    rank: int  # of this process in the job's communicator
    ranks: int
    accuracy: float | None = None
    precision_at_1: float | None = None
    precision_at_5: float | None = None
    categories: Any = None  # np.ndarray of the inputs that reach the last layer
    rate: float | None = None
    traffic: TrafficReport | None = None
    timing: TimingReport | None = None
    memory: dict[str, Any] = field(default_factory=dict)  # as TrainResult.memory


def kernel_threads(run: RunOptions) -> int:
    """The threads a job's kernels get: ``run.threads``, else SPDNN_THREADS, else 1."""
    from spdnn.comm.threads import default_threads

    return default_threads() if run.threads is None else run.threads


def check_run_options(run: RunOptions) -> None:
    """Values a RunOptions may hold (the CLI's parser checks the same on its side)."""
    if run.replicas != "auto" and (not isinstance(run.replicas, int) or run.replicas < 1):
        raise SpdnnError(f"replicas must be a positive integer or 'auto', not {run.replicas!r}")
    if run.dtype not in DTYPE_NAMES:
        raise SpdnnError(f"dtype must be float32 or float64, not {run.dtype!r}")
    if run.exchange not in EXCHANGES:
        raise SpdnnError(f"exchange must be auto, dense or sparse, not {run.exchange!r}")
    t = run.threads
    if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 1):
        raise SpdnnError(f"threads must be an integer >= 1 or None, not {t!r}")
    m = run.memory_limit
    if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 0):
        raise SpdnnError(f"memory_limit must be a number of bytes >= 0 or None, not {m!r}")
    n = run.stream_layers
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise SpdnnError(f"stream_layers must be a positive number of layers or None, not {n!r}")
    t = run.comm_timeout
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float))
                          or not 0 < t < float("inf")):
        raise SpdnnError(f"comm_timeout must be a positive number of seconds or None, "
                         f"not {t!r}")


def check_train_options(opt: TrainOptions) -> None:
    """Values a TrainOptions may hold (the CLI's parser checks the same on its side)."""
    def count(name: str, least: int, optional: bool = False) -> None:
        v = getattr(opt, name)
        if not (optional and v is None) and (isinstance(v, bool) or not isinstance(v, int)
                                              or v < least):
            raise SpdnnError(f"{name} must be an integer >= {least}, not {v!r}")

    for name in ("epochs", "batch_size", "rehash"):
        count(name, 1)
    for name in ("max_steps", "checkpoint_every", "refresh", "lsh_max_active"):
        count(name, 1, optional=True)
    for name in ("seed", "compress_min_values", "lsh_random", "lsh_top_bias"):
        count(name, 0)
    optimizer_config(opt)
    schedule_of(opt)
    if opt.dropout is not None:  # its count is checked against the network's layers
        from spdnn.model.counters import Dropout

        d = opt.dropout
        Dropout(tuple(d) if isinstance(d, (tuple, list)) else (d,))
    c = opt.clip_grad_norm
    if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float))
                          or not 0 < c < math.inf):
        raise OptionError("clip_grad_norm", f"must be a finite number > 0, not {c!r}")
    v = opt.validation_split
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                          or not 0 < v < 1):
        raise OptionError("validation_split", f"must be a fraction in (0, 1), not {v!r}")
    count("early_stopping", 1, optional=True)
    for name in ("save_best", "early_stopping"):
        if getattr(opt, name) is not None and v is None:
            raise OptionError(name, "needs a validation split")
        if getattr(opt, name) is not None and opt.resume is not None:
            raise OptionError(name, "does not apply with resume yet: the best epoch so far is "
                                    "not in the checkpoint")
    sparse_update_of(opt)
    if opt.loss not in ("cross_entropy", "mse"):
        raise SpdnnError(f"loss must be cross_entropy or mse, not {opt.loss!r}")
    if opt.critical_set is not None and not 0 < opt.critical_set <= 1:
        raise SpdnnError(f"critical_set must be a fraction in (0, 1], not {opt.critical_set}")


_DEFAULTS = TrainOptions()
UPDATE_SETTINGS = ("update_every", "drop_fraction", "update_until", "update_scope",
                   "grow_locality", "replan")


def sparse_update_of(opt: TrainOptions) -> Any:  # noqa: ANN401
    """The topology updates the options ask for (``spdnn.model.sparsity.SparseUpdate``), or
    None; an update setting without ``sparse_update`` is refused by name."""
    from spdnn.model.sparsity import SparseUpdate

    if opt.sparse_update is None:
        for name in UPDATE_SETTINGS:
            if getattr(opt, name) != getattr(_DEFAULTS, name):
                raise OptionError(name, "needs sparse_update (set or rigl)")
        return None
    return SparseUpdate(mode=opt.sparse_update, every=opt.update_every,
                        drop_fraction=opt.drop_fraction, until=opt.update_until,
                        scope=opt.update_scope, locality=opt.grow_locality,
                        replan=opt.replan, seed=opt.seed)


OPTIMIZER_SETTINGS = ("lr", "momentum", "nesterov", "betas", "eps", "weight_decay")


def optimizer_config(opt: TrainOptions) -> Any:  # noqa: ANN401
    """The optimizer's config (``spdnn.model.optim``) from the options: its checks, by the
    options' names (``OptionError``)."""
    from spdnn.model.optim import config_of

    return config_of(opt.optimizer, **{k: getattr(opt, k) for k in OPTIMIZER_SETTINGS})


def schedule_of(opt: TrainOptions) -> Any:  # noqa: ANN401
    """The rate's schedule from the options (its T is set once the data is known)."""
    from spdnn.model.schedule import Schedule

    return Schedule(kind=opt.lr_schedule, warmup_steps=opt.warmup_steps, min_lr=opt.min_lr,
                    step_size=opt.step_size, gamma=opt.gamma)


def candidate_plans(run: RunOptions) -> list[str | Plan]:
    """Every plan the options name: ``plan`` first, then ``plans`` (paths as strings)."""
    out: Sequence[Path | Plan] = ([run.plan] if run.plan is not None else []) + list(run.plans)
    return [p if isinstance(p, Plan) else os.fspath(p) for p in out]
