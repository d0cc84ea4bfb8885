"""The options of a job, each declared once (spdnn.schema): ``RunOptions`` (where and how it
runs) and ``TrainOptions`` (minibatch training, its recipe, checkpoints, dynamic sparsity and
the lossy speed-ups; one keyword per optimizer setting, from spdnn.optim), with the checks that
join several options."""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, make_dataclass, replace
from typing import Any, Literal

from spdnn.errors import OptionError
from spdnn.model.choices import EXCHANGES, VALUE_TYPES, Exchange, ValueType
from spdnn.model.plan import Plan
from spdnn.model.schedule import SCHEDULES
from spdnn.model.sparsity import MODES, SCOPES
from spdnn.optim import OPTIMIZERS, config_of, optimizer_class, setting_options
from spdnn.schema import (
    Boolean,
    Choice,
    Custom,
    Integer,
    Number,
    Text,
    check,
    declare,
    option,
    shown_default,
)

Path = str | os.PathLike
Loss = Literal["cross_entropy", "mse"]


def _replicas(value: Any) -> Any:  # noqa: ANN401
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool)
                           and 1 <= value < 2**31):
        return value
    raise ValueError(f"must be a positive integer or 'auto', not {value!r}")


def _bytes(value: Any) -> Any:  # noqa: ANN401
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63:
        return value
    raise ValueError(f"must be a number of bytes >= 0, not {value!r}")


def _text_bytes(text: str) -> int:
    from spdnn.comm.memlimit import parse_bytes

    try:
        return parse_bytes(text)
    except OptionError as exc:
        raise ValueError(exc.problem) from None


class _Seconds(Number):
    """A wait in seconds > 0; None, or 0 on the command line: no limit."""

    def parse(self, text: str) -> float | None:
        value = float(text)
        return None if value == 0 else value


@declare
@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """Where and how a job runs: the plan (``None``: one part), replicas of it (P = replicas x
    the plan's parts; ``"auto"``: the grid the cost model predicts fastest among ``plans`` and
    pure data parallelism, from a ``calibration`` file), arithmetic and exchange."""

    plan: Path | Plan | None = option(None, "plan from spdnn-partition (required with more "
                                            "ranks than replicas); in Python, a Plan too",
                                      flag="")
    replicas: int | Literal["auto"] = option(
        1, "replicas of the partitioned network (P = R x the plan's parts; the ranks of one "
           "replica are consecutive); auto: the grid the cost model predicts fastest for this "
           "P, among the plan candidates and pure data parallelism (needs a calibration)",
        Custom(_replicas, "a positive integer or auto",
               lambda t: t if t == "auto" else int(t)),
        metavar="R|auto", record="free")
    plans: tuple[Path, ...] = option((), "the candidates of {replicas} auto besides {plan}",
                                     flag="")
    calibration: Path | None = option(None, "from spdnn calibrate, for {replicas} auto",
                                      Custom(os.fspath, "a path", none=True))
    cluster: Path | None = option(None, "cluster description for {replicas} auto "
                                        "(docs/cost-model.md)",
                                  Custom(os.fspath, "a path", none=True))
    dtype: ValueType = option("float32", "arithmetic type (bfloat16: 16-bit activations, "
                              "weights as read and rows sent; float32 sums and master weights)",
                              Choice(*VALUE_TYPES), record="same")
    exchange: Exchange = option(
        "auto", "how cut rows travel (the results are the same): auto, per message the "
                "smaller of dense rows and a sparse form (forward: the values that are "
                "neither 0 nor at the cap, with bitmaps; backward: only the entries with a "
                "nonzero activation slope); dense; or sparse (docs/sparse-exchange.md)",
        Choice(*EXCHANGES))
    threads: int | None = option(
        None, "threads of each rank's sparse kernels; keep ranks per node x N <= cores",
        Integer(1, none=True), metavar="N", default_help="SPDNN_THREADS, else 1")
    comm_timeout: float | None = option(
        600.0, "end the job when one wait for other ranks lasts longer than this many "
               "seconds (a stalled peer, a lost link, a dead rank); 0 on the command line, "
               "None in Python: wait forever",
        _Seconds(open="low", none=True), metavar="SECONDS")
    memory_limit: int | None = option(
        None, "bytes a rank may hold, with K, M or G (e.g. 4G); a job whose predicted peak "
              "passes it is refused before it loads; none or 0: no limit",
        Custom(_bytes, "a number of bytes >= 0", _text_bytes, none=True), metavar="BYTES",
        default_help="the cgroup's limit, else the node's memory / its ranks")
    dry_run: bool = option(False, "print each rank's predicted peak memory and stop before "
                                  "loading", Boolean())
    stream_layers: int | None = option(
        None, "inference: read the weights in blocks of at most this many layers (default: "
              "only when they pass the memory limit; docs/memory.md); training holds every "
              "layer", Integer(1, none=True), metavar="N")


def _rates(value: Any) -> Any:  # noqa: ANN401
    one = Number(0, 1, open="high")
    if isinstance(value, (list, tuple)) and value and all(one.keep(v) == v for v in value):
        return tuple(float(v) for v in value)
    if one.keep(value) == value:
        return value
    raise ValueError(f"must be a rate in [0, 1) or one per hidden layer, not {value!r}")


def _rates_text(text: str) -> float | tuple[float, ...]:
    values = tuple(float(v) for v in text.split(","))
    return values[0] if len(values) == 1 else values


def _step_or_fraction(value: Any) -> Any:  # noqa: ANN401
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value <= 0 or (isinstance(value, float) and value > 1):
        raise ValueError(f"must be a fraction in (0, 1] of the job's steps or a step >= 1, "
                         f"not {value!r}")
    return value


def _replan(value: Any) -> Any:  # noqa: ANN401
    head, _, count = str(value).partition(":")
    if not isinstance(value, str) or not (value in ("never", "auto") or (
            head == "every" and count.isdigit() and int(count) >= 1)):
        raise ValueError(f"must be never, auto or every:K (K >= 1), not {value!r}")
    return value


_PATH = Custom(os.fspath, "a path", none=True)
_LOSSY = "lossy speed-ups (opt-in; docs/lossy.md)"


@dataclass(frozen=True, kw_only=True)
class _TrainOptions:
    """Minibatch training with ``torch.optim``'s optimizers (``optimizer``: spdnn.optim; its
    settings left None take that optimizer's defaults, torch's), checkpoints and the lossy
    speed-ups (``compress``: none, topk:R, dgc:R, sidco:R[:exp|gamma|gpareto] or hylo)."""

    epochs: int = option(10, "epochs in all (a resumed run counts the ones already done)",
                         Integer(1))
    batch_size: int = option(64, "samples per optimizer step", Integer(1), record="same")
    optimizer: str = option("sgd", "torch.optim's optimizer (one parameter group)",
                            Choice(*OPTIMIZERS), record="same")
    lr_schedule: str = option(
        "constant", "the rate over the job's planned steps T (epochs x steps per epoch), "
                    "stepped once per optimizer step; docs/recipes.md",
        Choice(*SCHEDULES), record="same")
    warmup_steps: int = option(0, "multiply the rate by (t + 1) / W for the first W steps",
                               Integer(0), metavar="W", record="same")
    min_lr: float = option(0.0, "cosine: the rate it decays to at step T", Number(),
                           record="same")
    step_size: int | None = option(None, "step: multiply the rate by {gamma} every this many "
                                         "steps", Integer(1, none=True), record="same")
    gamma: float = option(0.1, "step: the factor", Number(open="low"), record="same")
    clip_grad_norm: float | None = option(
        None, "scale the gradients to an L2 norm of at most X over every parameter and rank, "
              "as torch.nn.utils.clip_grad_norm_", Number(open="low", none=True), metavar="X",
        record="same")
    dropout: float | tuple[float, ...] | None = option(
        None, "inverted dropout on the hidden layers' outputs in training: one rate, or one "
              "per hidden layer (masks that do not depend on P)",
        Custom(_rates, "a rate in [0, 1) or one per hidden layer", _rates_text, none=True),
        metavar="P[,P...]", record="same")
    validation_split: float | None = option(
        None, "hold out the last F of the training samples (file order, before shuffling) and "
              "score them each epoch; the test split is then scored once, after training",
        Number(0, 1, open="both", none=True, what="a fraction in (0, 1)"), metavar="F",
        record="same")
    save_best: Path | None = option(None, "write the network of the epoch with the lowest "
                                          "validation loss", _PATH, metavar="FILE")
    early_stopping: int | None = option(
        None, "end training after N epochs without a lower loss: the validation loss with "
              "{validation_split}, else the epoch's training loss", Integer(1, none=True),
        metavar="N")
    min_delta: float = option(0.0, "with {early_stopping}: a loss counts as lower only when "
                                   "it is below the lowest so far by more than this",
                              Number(), metavar="D")
    loss: Loss = option("cross_entropy", "softmax cross-entropy (mean over the batch) or mean "
                                         "squared error", Choice("cross_entropy", "mse"))
    seed: int = option(0, "seed of the sample shuffling and of dropout's masks", Integer(0),
                       record="same")
    shuffle: bool = option(True, "shuffle the samples each epoch (a seeded order); off: "
                                         "batches in file order",
                           Boolean(), flag="--no-shuffle", record="same")
    max_steps: int | None = option(None, "stop after this many optimizer steps in all",
                                   Integer(1, none=True))
    checkpoint_dir: Path | None = option(None, "write checkpoints here (every N steps, and at "
                                               "the end)", _PATH)
    checkpoint_every: int | None = option(None, "steps between checkpoints",
                                          Integer(1, none=True))
    resume: Path | None = option(None, "continue from this checkpoint directory (any P and "
                                       "plan)", _PATH)
    resume_with_changes: bool = option(
        False, "resume even though {batch_size}, {seed}, {shuffle}, {dtype}, the optimizer "
               "or its settings differ from the run that wrote the checkpoint (the result then "
               "differs from an uninterrupted run; another optimizer starts from fresh state)",
        Boolean())
    sparse_update: str | None = option(
        None, "dynamic sparsity (docs/dynamic-sparsity.md): every {update_every} steps each row "
              "drops its smallest |w| and grows as many, at random (set: SET, Mocanu et al. "
              "2018) or where |dL/dw| is largest (rigl: RigL, Evci et al. 2020)",
        Choice(*MODES, none=True), record="same")
    update_every: int = option(100, "steps between topology updates: an update follows "
                                    "steps N, 2N, ...", Integer(1), metavar="N",
                               record="same")
    drop_fraction: float = option(0.3, "the fraction dropped at the first update, decayed by "
                                       "a cosine to zero at {update_until}",
                                  Number(0, 1, open="both", what="a fraction in (0, 1)"),
                                  metavar="F", record="same")
    update_until: float | int = option(
        0.75, "the step at which updates end: a fraction of the job's planned steps (0.75), "
              "or a step (3000)", Custom(_step_or_fraction, "a fraction in (0, 1] or a step >= 1",
                              lambda t: int(t) if t.strip().isdigit() else float(t)),
        metavar="T", record="same")
    update_scope: str = option("row", "row: every row drops and grows the same count, so each "
                                      "neuron keeps its fan-in; layer: the layer is ranked as "
                                      "a whole, as SET and RigL first did", Choice(*SCOPES),
                               record="same")
    grow_locality: float = option(
        1.0, "growth that knows the plan: a column the row's rank already holds (owns or "
             "receives) is W times as likely (set) or scores W times higher (rigl)",
        Number(open="low"), metavar="W", record="same")
    replan: str = option(
        "never", "after an update, refine the plan for the current topology and move the "
                 "rows that change owner: every K updates, or when the rows saved over the "
                 "steps to the next update outweigh the bytes moved (auto)",
        Custom(_replan, "never, auto or every:K"), metavar="never|auto|every:K", record="free")
    save_plan: Path | None = option(
        None, "write the plan in force at the end, with its statistics and fingerprint for "
              "the final topology (for spdnn infer on the network that {save} writes)", _PATH,
        metavar="FILE")
    compress: str = option(
        "none", "compress the gradient sums over replicas, with error feedback: none, "
                "topk:RATIO, dgc:RATIO, sidco:RATIO[:exp|gamma|gpareto] or hylo (2 bits per "
                "value); RATIO = fraction of the values a rank sends, e.g. 0.01", Text(),
        metavar="SPEC", group=_LOSSY, record="free")
    compress_min_values: int = option(0, "sum layers with fewer gradient values than N on a "
                                         "rank exactly", Integer(0), metavar="N", group=_LOSSY,
                                      record="free")
    critical_set: float | None = option(
        None, "between full passes, train only on this fraction of the samples with the "
              "highest loss in the last full pass",
        Number(0, 1, open="low", none=True, what="a fraction in (0, 1]"), metavar="FRACTION",
        group=_LOSSY, record="free")
    refresh: int | None = option(None, "with {critical_set}: a full pass every K epochs",
                                 Integer(1, none=True), metavar="K", default_help="2",
                                 group=_LOSSY, record="free")
    lsh: str | None = option(
        None, "SLIDE: compute and train only the neurons of layer LAYER that L hash tables of "
              "K functions retrieve for each sample (on the output layer, plus its labels), "
              "e.g. 2:6:50 (DWTA) or 2:9:50:simhash; a hidden layer's other neurons are zero",
        Text(none=True), metavar="LAYER:K:L[:dwta|simhash]", group=_LOSSY, record="same")
    lsh_max_active: int | None = option(
        None, "with {lsh}: keep at most M retrieved neurons per sample (those most tables "
              "retrieved; ties in a seeded order), labels, random and top-bias neurons besides",
        Integer(1, none=True), metavar="M", group=_LOSSY)
    lsh_random: int = option(
        0, "with {lsh}: add N random output neurons to each sample's active set in training "
           "(SLIDE tops its retrieved sets up so; the same on every grid)", Integer(0),
        metavar="N", group=_LOSSY)
    lsh_top_bias: int = option(
        0, "with {lsh}: add the N output neurons of largest bias (found at each rebuild) to "
           "every sample's active set in training, so that frequent labels are pushed down as "
           "in exact training; without it they drift up and can become every sample's "
           "prediction (about 100 at 200,000 labels)", Integer(0), metavar="N", group=_LOSSY)
    lsh_estimate_tail: bool = option(
        False, "with {lsh_random}: in training the random output neurons stand for every "
               "output not retrieved, their softmax terms weighted by (outputs not retrieved) "
               "/ (random ones): the loss and gradients of the full softmax, estimated "
               "(sampled softmax); holds at learning rates where the softmax over the active "
               "outputs alone kills the hidden layer (docs/lossy.md)", Boolean(), group=_LOSSY)
    rehash: int = option(50, "with {lsh}: rebuild the tables after 1, 2, 4, ... steps up to N, "
                             "then after N steps, each later period 10% longer", Integer(1),
                         metavar="N", group=_LOSSY, record="same")


def _optimizer_settings() -> list[tuple[str, Any, Any]]:
    """TrainOptions' field for each optimizer setting: None (the chosen optimizer's
    default), declared with the first optimizer's help and check."""
    out = []
    for name, (first, defaults) in setting_options().items():
        check = copy.copy(first.check)
        check.none = True
        shown = ", ".join(f"{opt} {shown_default(replace(first, default=d))}"
                          for opt, d in defaults.items())
        out.append((name, Any, option(None, first.help, check, metavar=first.metavar,
                                      default_help=shown, group=_OPTIMIZER)))
    return out


_OPTIMIZER = "optimizer settings (each left out takes the chosen optimizer's default)"
# TrainOptions: the fields above and one per optimizer setting (spdnn.optim declares them).
TrainOptions = declare(make_dataclass("TrainOptions", _optimizer_settings(),
                                      bases=(_TrainOptions,), frozen=True, kw_only=True))
TrainOptions.__module__ = __name__
TrainOptions.__doc__ = _TrainOptions.__doc__


def kernel_threads(run: RunOptions) -> int:
    """The threads a job's kernels get: ``run.threads``, else SPDNN_THREADS, else 1."""
    from spdnn.comm.threads import default_threads

    return default_threads() if run.threads is None else run.threads


def check_run_options(run: RunOptions) -> None:
    """Values a RunOptions may hold (each option's check is its declaration's), and what
    bfloat16 runs do not do yet."""
    check(run)
    if run.dtype == "bfloat16":
        if run.stream_layers is not None:
            raise OptionError("stream_layers", "does not apply with {dtype} bfloat16 yet",
                              ("dtype",))


# What a bfloat16 training does not do yet, and why (each refused by name).
BFLOAT16_UNSUPPORTED = {
    "dropout": "its masks would scale the 16-bit activations after their rounding",
    "lsh": "its tables and sampled passes read float32 or float64 values",
    "sparse_update": "its scores and regrown weights are not rounded to bfloat16 yet",
    "compress": "its residuals are not tested against bfloat16's rounding yet",
    "critical_set": "its per-sample losses are not tested against bfloat16's rounding yet",
}


def check_bfloat16_training(run: RunOptions, opt: Any) -> None:  # noqa: ANN401
    """The training options a bfloat16 run refuses (``BFLOAT16_UNSUPPORTED``), by name."""
    if run.dtype != "bfloat16":
        return
    for name, why in BFLOAT16_UNSUPPORTED.items():
        value = getattr(opt, name)
        if value not in (None, 0, 0.0, False, "none"):
            raise OptionError(name, "does not apply with {dtype} bfloat16 yet: " + why,
                              ("dtype",))


def check_train_options(opt: Any) -> None:  # noqa: ANN401
    """Values a TrainOptions may hold: each option's own check (its declaration's), then the
    checks that join several, which name every option they join."""
    check(opt)
    if opt.save_best is not None and opt.validation_split is None:
        raise OptionError("save_best", "needs {validation_split}", ("validation_split",))
    if opt.min_delta and opt.early_stopping is None:
        raise OptionError("min_delta", "needs {early_stopping}", ("early_stopping",))
    for name in ("save_best", "early_stopping"):
        if getattr(opt, name) is not None and opt.resume is not None:
            raise OptionError(name, "does not apply with {resume} yet: the best epoch so far "
                                    "is not in the checkpoint", ("resume",))
    for name, needs in (("checkpoint_every", "checkpoint_dir"), ("refresh", "critical_set")):
        if getattr(opt, name) is not None and getattr(opt, needs) is None:
            raise OptionError(name, "needs {" + needs + "}", (needs,))
    for name in ("lsh_max_active", "lsh_random", "lsh_top_bias", "lsh_estimate_tail"):
        if getattr(opt, name) not in (None, 0, False) and opt.lsh is None:
            raise OptionError(name, "needs {lsh}", ("lsh",))
    optimizer = optimizer_config(opt)
    schedule = schedule_of(opt)
    sparse = sparse_update_of(opt)
    if opt.lsh is not None:
        refusal = optimizer_class(opt.optimizer).rows_refusal(optimizer)
        if refusal:
            raise OptionError("lsh", f"does not apply with {opt.optimizer} here yet: "
                                     f"{refusal}")
        if opt.dropout:
            raise OptionError("dropout", "does not apply with {lsh} yet: a sampled layer's "
                                         "outputs are its active pairs", ("lsh",))
        if opt.compress != "none":  # its compressor keeps state per position
            raise OptionError("compress", "does not apply with {lsh}: the LSH layer's "
                                          "gradients are those of the rows active in each "
                                          "step, not of fixed positions", ("lsh",))
    if opt.critical_set is not None and not schedule.constant:
        raise OptionError("lr_schedule", "and {warmup_steps} do not apply with "
                                         "{critical_set} yet: its epochs' steps vary, so the "
                                         "job's planned steps are not known ahead",
                          ("warmup_steps", "critical_set"))
    if sparse is not None:
        for given, name in ((opt.lsh is not None, "lsh"), (opt.compress != "none", "compress"),
                            (opt.critical_set is not None, "critical_set")):
            if given:
                raise OptionError("sparse_update", "does not apply with {" + name + "} yet: "
                                  + UNSUPPORTED[name], (name,))


# Why a topology update cannot run beside each option yet.
UNSUPPORTED = {"lsh": "its tables index the rows' weights as they are",
               "compress": "its compressors keep a residual per weight position",
               "critical_set": "its epochs' steps vary, so the step updates end at is not "
                               "known ahead"}
_DEFAULTS = TrainOptions()
UPDATE_SETTINGS = ("update_every", "drop_fraction", "update_until", "update_scope",
                   "grow_locality", "replan")


def sparse_update_of(opt: Any) -> Any:  # noqa: ANN401
    """The topology updates the options ask for (``spdnn.model.sparsity.SparseUpdate``), or
    None; an update setting without ``sparse_update`` is refused by name."""
    from spdnn.model.sparsity import SparseUpdate

    if opt.sparse_update is None:
        for name in UPDATE_SETTINGS:
            if getattr(opt, name) != getattr(_DEFAULTS, name):
                raise OptionError(name, "needs {sparse_update} (set or rigl)",
                                  ("sparse_update",))
        return None
    return SparseUpdate(mode=opt.sparse_update, every=opt.update_every,
                        drop_fraction=opt.drop_fraction, until=opt.update_until,
                        scope=opt.update_scope, locality=opt.grow_locality,
                        replan=opt.replan, seed=opt.seed)


def optimizer_config(opt: Any) -> Any:  # noqa: ANN401
    """The optimizer's config (``spdnn.optim``) from the options: its checks, by the
    options' names (``OptionError``)."""
    return config_of(opt.optimizer, **{k: getattr(opt, k) for k in setting_options()})


def schedule_of(opt: Any) -> Any:  # noqa: ANN401
    """The rate's schedule from the options (its T is set once the data is known)."""
    from spdnn.model.schedule import Schedule

    return Schedule(kind=opt.lr_schedule, warmup_steps=opt.warmup_steps, min_lr=opt.min_lr,
                    step_size=opt.step_size, gamma=opt.gamma)


def candidate_plans(run: RunOptions) -> list[str | Plan]:
    """Every plan the options name: ``plan`` first, then ``plans`` (paths as strings)."""
    out: Sequence[Path | Plan] = ([run.plan] if run.plan is not None else []) + list(run.plans)
    return [p if isinstance(p, Plan) else os.fspath(p) for p in out]
