"""The JSON files spdnn reads, declared once as typed structures and validated by msgspec:
the calibration (``spdnn-calibration/2``), the cluster description (``spdnn-cluster/1``), the
checkpoint manifest (``spdnn-checkpoint/2``, ``/1`` read too) and the metrics of
``--metrics-out``. Field
formats are documented in docs/formats.md and docs/cost-model.md. One concern: every JSON
schema in one place, so that one reader validates them all alike.

``spdnn.io.jsonread.read(path, kind)`` returns the decoded structure or raises one
``InputError`` naming the file and the field: ``m.json: runtime.step_s: expected a number >= 0,
got -1``. msgspec is imported here and there only, when a file is read (``spdnn --help`` does
not load it).
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

from msgspec import UNSET, Meta, Struct, field

from spdnn.model.choices import ValueType

# Numbers bounded so that every value is finite (JSON has no NaN or infinity; 1e400 would be).
Positive = Annotated[float, Meta(gt=0, lt=1e300)]
NonNegative = Annotated[float, Meta(ge=0, lt=1e300)]
Count = Annotated[int, Meta(ge=0, lt=2**62)]
Axis = Annotated[list[Annotated[int, Meta(ge=1, lt=2**62)]], Meta(min_length=1, max_length=64)]
Series = Annotated[list[Positive], Meta(max_length=64)]


def _increasing(values: list, where: str) -> None:
    if any(b <= a for a, b in zip(values, values[1:])):
        raise ValueError(f"{where} must be increasing")


def _shape(value: Any, shape: tuple[int, ...], where: str, axes: str) -> None:  # noqa: ANN401
    def ok(v: Any, s: tuple[int, ...]) -> bool:  # noqa: ANN401
        return not s or (isinstance(v, list) and len(v) == s[0] and all(ok(x, s[1:]) for x in v))
    if not ok(value, shape):
        raise ValueError(f"{where} must be {' x '.join(map(str, shape))} numbers ({axes})")


def _per_batch(record: Any, keys: tuple[str, ...]) -> None:  # noqa: ANN401
    """``record.batches`` increasing, and one number per batch in each of ``keys``."""
    _increasing(record.batches, "batches")
    for k in keys:
        if len(getattr(record, k)) != len(record.batches):
            raise ValueError(f"{k} must hold {len(record.batches)} numbers (one per batch)")


# --------------------------------------------------------------------------- calibration


class DenseTableFile(Struct, kw_only=True):
    nnz: Axis
    batches: Axis
    forward: list[list[Positive]]
    backward: list[list[Positive]]
    gradient: list[list[Positive]]

    def __post_init__(self) -> None:
        _increasing(self.nnz, "nnz")
        _increasing(self.batches, "batches")
        for k in ("forward", "backward", "gradient"):
            _shape(getattr(self, k), (len(self.nnz), len(self.batches)), k, "nnz x batches")


class KernelTableFile(Struct, kw_only=True):
    batches: Axis
    inputs: Axis
    reuses: Axis
    forward: list[list[list[Positive]]]
    backward: list[list[list[Positive]]]
    gradient: list[list[list[Positive]]]
    forward_warm: list[list[list[Positive]]]
    backward_warm: list[list[list[Positive]]]
    gradient_warm: list[list[list[Positive]]]
    dense: DenseTableFile | None = None

    def __post_init__(self) -> None:
        for axis in ("batches", "inputs", "reuses"):
            _increasing(getattr(self, axis), axis)
        shape = (len(self.reuses), len(self.inputs), len(self.batches))
        for k in ("forward", "backward", "gradient", "forward_warm", "backward_warm",
                  "gradient_warm"):
            _shape(getattr(self, k), shape, k, "reuses x inputs x batches")


class RuntimeFile(Struct, kw_only=True):
    layer_forward_s: NonNegative
    layer_backward_s: NonNegative
    step_s: NonNegative
    message_s: NonNegative
    exchange_layer_s: NonNegative
    pack_ns_per_byte: NonNegative
    update_ns_per_value: NonNegative
    elementwise_ns_per_value: NonNegative
    collective_s: NonNegative
    compute_scale_alone: NonNegative
    compute_scale_all: NonNegative
    compute_scale_cold_alone: NonNegative
    compute_scale_cold_all: NonNegative
    cache_bytes: NonNegative
    # Absent from calibrations of 2026-11-23/24: these defaults then.
    compute_scale_spread: NonNegative = 0.0
    gather_ns_per_value: NonNegative = 0.0
    # ns per weight of a bfloat16 step's rounded copy after the update (0: not measured, in
    # files before 2026-12-06 and those without a bfloat16 table)
    round_ns_per_value: NonNegative = 0.0
    # ns per stored value of each optimizer's update (absent before 2026-12-05: SGD's
    # update_ns_per_value stands for every optimizer)
    updates_ns_per_value: dict[str, NonNegative] = {}


class CurveFile(Struct, kw_only=True):
    bytes: Series
    seconds: Annotated[list[NonNegative], Meta(max_length=64)]

    def __post_init__(self) -> None:
        if len(self.bytes) != len(self.seconds):
            raise ValueError("'bytes' and 'seconds' must have one length")
        _increasing(self.bytes, "bytes")


class NetworkFile(Struct, kw_only=True):
    latency_s: NonNegative
    bandwidth_Bps: Positive
    allreduce_latency_s: NonNegative
    allreduce_bandwidth_Bps: Positive
    pingpong: CurveFile = field(default_factory=lambda: CurveFile(bytes=[], seconds=[]))
    allreduce: CurveFile | None = None
    cpu_ns_per_byte: NonNegative = 0.0  # absent before 2026-11-27


class StructureFile(Struct, kw_only=True):
    batches: Axis
    forward: Series
    backward: Series
    gradient: Series
    gap_forward: NonNegative
    gap_backward: NonNegative

    def __post_init__(self) -> None:
        _per_batch(self, ("forward", "backward", "gradient"))


class ScalesFile(Struct, kw_only=True):
    batches: Axis
    alone: Series
    all: Series
    cold_alone: Series
    cold_all: Series

    def __post_init__(self) -> None:
        _per_batch(self, ("alone", "all", "cold_alone", "cold_all"))


class CalibrationFile(Struct, kw_only=True):
    format: Literal["spdnn-calibration/2"]
    ranks: Annotated[int, Meta(ge=1, lt=2**31)]
    kernels: Annotated[dict[ValueType, KernelTableFile], Meta(min_length=1)]
    runtime: RuntimeFile
    network: NetworkFile | None
    host: str = "?"
    backend: str = "?"
    structure: StructureFile | None = None
    scales: ScalesFile | None = None


# --------------------------------------------------------------------------- cluster


# A cluster description is written by hand: a misspelt field (node_memory_gb) is refused, not
# ignored while the model runs on the default it would have replaced.
class LinkFile(Struct, kw_only=True, forbid_unknown_fields=True):
    latency_us: NonNegative
    bandwidth_GBps: Positive


class InterLinkFile(LinkFile, kw_only=True, forbid_unknown_fields=True):
    cpu_ns_per_byte: NonNegative = 0.0  # each end's CPU per byte: TCP's stack (RDMA: 0)


class ClusterFile(Struct, kw_only=True, forbid_unknown_fields=True):
    format: Literal["spdnn-cluster/1"]
    ranks_per_node: Annotated[int, Meta(ge=1, le=2**20)]
    intra_node: LinkFile
    inter_node: InterLinkFile
    name: str = ""
    node_memory_bandwidth_GBps: Positive | None = None
    node_memory_GB: Positive | None = None
    sources: list[str] = []
    assumptions: str = ""


# --------------------------------------------------------------------------- checkpoints


def _file_name(name: str, where: str) -> None:
    if not name or os.path.basename(name) != name:
        raise ValueError(f"{where} must name a file in this directory, not {name!r}")


class ManifestFacts(Struct, kw_only=True, forbid_unknown_fields=True):
    """What a checkpoint's ``manifest.json`` says of itself: its position, its rank files, the
    network it was written for, the optimizer's steps and the facts the run derived (the
    schedule's planned steps, the step updates end at, the lossy state's files). Its run
    settings are the options that declare a checkpoint field (spdnn.schema: ``ManifestFile``
    adds them). Optional fields are absent from checkpoints written before them."""

    format: Literal["spdnn-checkpoint/1", "spdnn-checkpoint/2"]
    step: Count
    epoch: Count
    batch: Count
    nparts: Annotated[int, Meta(ge=1, lt=2**31)]
    files: list[str]
    fingerprint: str | None = None
    # What the network computes beyond its pattern (absent from checkpoints written before).
    activations: list[str] | None = None
    cap: Positive | Literal["none"] | None = None
    output_activation: Literal["linear", "relu"] | None = None
    n_layers: Count | None = None
    optimizer_steps: Count | None = None
    planned_steps: Count | None = None  # the schedule's T (absent for a constant rate)
    update_end: Count | None = None  # the step topology updates end at
    residual_files: list[list[str]] | None = None
    critical: str | None = None

    def __post_init__(self) -> None:
        if len(self.files) != self.nparts:
            raise ValueError(f"'files' must list {self.nparts} file names, one per part")
        if len(set(self.files)) != len(self.files):
            raise ValueError("'files' names one rank file twice")
        for f in self.files:
            _file_name(f, "'files'")
        for row in self.residual_files or []:
            for f in row:
                _file_name(f, "'residual_files'")
        if self.critical is not None:
            _file_name(self.critical, "'critical'")
        for name, declared in recorded_options().items():
            value = getattr(self, name)
            if value is UNSET:
                continue
            if name in FORMAT2_NONE and value == FORMAT2_NONE[name]:
                value = None  # how format 2 wrote "none" before it wrote null
                setattr(self, name, None)
            if value is not None:
                try:
                    setattr(self, name, declared.check(value))
                except ValueError as exc:
                    raise ValueError(f"'{name}' {exc}") from None
        dropout = getattr(self, "dropout", None)
        if isinstance(dropout, tuple) and self.n_layers is not None \
                and len(dropout) != self.n_layers - 1:
            raise ValueError(f"'dropout' must hold one rate per hidden layer "
                             f"({self.n_layers - 1}), not {len(dropout)}")

    def get(self, key: str, default: Any = None) -> Any:  # noqa: ANN401
        """A field by name, or ``default`` when it is unset (None)."""
        value = getattr(self, key, None)
        return default if value is None or value is UNSET else value


# Format 2 wrote these values for an option left unset; read as None.
FORMAT2_NONE: dict[str, Any] = {"clip_grad_norm": 0, "validation_split": 0,
                                "sparse_update": "", "lsh": "none", "dropout": []}


def manifest_file() -> type:
    """The manifest's structure: its facts and every option that declares a checkpoint
    field (values as JSON holds them, checked by their declarations); a field neither
    declares is refused."""
    if _MANIFEST:
        return _MANIFEST[0]
    import msgspec

    fields = [(name, Any, UNSET) for name in recorded_options()]
    kind = msgspec.defstruct("ManifestFile", fields, bases=(ManifestFacts,), kw_only=True,
                             forbid_unknown_fields=True, module=__name__)
    _MANIFEST.append(kind)
    return kind


_MANIFEST: list[type] = []


def recorded_options() -> dict[str, Any]:
    """Every option a checkpoint records, by name (spdnn.schema.Option): the run's, the
    training's and every optimizer's settings."""
    from spdnn.model.options import RunOptions, TrainOptions
    from spdnn.optim import OPTIMIZERS
    from spdnn.schema import recorded

    return recorded(RunOptions, TrainOptions, *(cls.Config for cls in OPTIMIZERS.values()))


# --------------------------------------------------------------------------- metrics


class EpochMetrics(Struct, kw_only=True):
    epoch: Count
    loss: float
    samples_per_second: NonNegative
    train_accuracy: float | None = None
    seconds: NonNegative | None = None
    test_accuracy: float | None = None
    steps: Count = 0
    megabytes_sent: float = 0.0


class TrainMetrics(Struct, kw_only=True):
    """What ``spdnn train --metrics-out`` writes (the fields ``spdnn plot`` reads; the file
    holds more: traffic, timing, the plan and the kernels)."""

    epochs: Annotated[list[EpochMetrics], Meta(min_length=1)]  # "no epochs": refused
    ranks: Annotated[int, Meta(ge=1)] = 1
