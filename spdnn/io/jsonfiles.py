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

from msgspec import Meta, Struct, field

from spdnn.model.choices import Dtype

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
    kernels: Annotated[dict[Dtype, KernelTableFile], Meta(min_length=1)]
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


class ManifestFile(Struct, kw_only=True):
    """A checkpoint's ``manifest.json``; the run settings and the lossy fields are optional
    (absent from checkpoints written before them)."""

    format: Literal["spdnn-checkpoint/1", "spdnn-checkpoint/2"]
    step: Count
    epoch: Count
    batch: Count
    nparts: Annotated[int, Meta(ge=1, lt=2**31)]
    files: list[str]
    fingerprint: str | None = None
    dtype: str | None = None
    n_layers: Count | None = None
    batch_size: Count | None = None
    seed: Count | None = None
    shuffle: bool | None = None
    compress: str = "none"
    compress_min_values: Count = 0
    replicas: Annotated[int, Meta(ge=1, lt=2**31)] | None = None
    residual_files: list[list[str]] | None = None
    critical_set: float | None = None
    refresh: Count | None = None
    critical: str | None = None
    lsh: str = "none"
    rehash: Count | None = None
    # The optimizer (format 2; format 1 was SGD's), its settings and its steps taken.
    optimizer: str | None = None
    lr: NonNegative | None = None
    momentum: NonNegative | None = None
    nesterov: bool | None = None
    betas: Annotated[list[Annotated[float, Meta(ge=0, lt=1)]],
                     Meta(min_length=2, max_length=2)] | None = None
    eps: Positive | None = None
    weight_decay: NonNegative | None = None
    optimizer_steps: Count | None = None
    # The rate's schedule (planned_steps: its T, absent for a constant rate) and clipping (0:
    # none).
    lr_schedule: str | None = None
    warmup_steps: Count | None = None
    min_lr: NonNegative | None = None
    step_size: Count | None = None
    gamma: Positive | None = None
    planned_steps: Count | None = None
    clip_grad_norm: NonNegative | None = None
    dropout: list[Annotated[float, Meta(ge=0, lt=1)]] | None = None  # per hidden layer
    validation_split: Annotated[float, Meta(ge=0, lt=1)] | None = None  # 0: none
    # The topology updates ("": none; spdnn.model.sparsity) and the step they end at.
    sparse_update: Literal["", "set", "rigl"] | None = None
    update_every: Count | None = None
    drop_fraction: Annotated[float, Meta(gt=0, lt=1)] | None = None
    update_until: Positive | None = None  # a fraction of the planned steps, or a step
    update_scope: Literal["row", "layer"] | None = None
    update_end: Count | None = None
    grow_locality: Positive | None = None
    replan: str | None = None

    def __post_init__(self) -> None:
        if len(self.files) != self.nparts:
            raise ValueError(f"'files' must list {self.nparts} file names, one per part")
        for f in self.files:
            _file_name(f, "'files'")
        for row in self.residual_files or []:
            for f in row:
                _file_name(f, "'residual_files'")
        if self.critical is not None:
            _file_name(self.critical, "'critical'")

    def get(self, key: str, default: Any = None) -> Any:  # noqa: ANN401
        """A field by name, or ``default`` when it is unset (None)."""
        value = getattr(self, key, None)
        return default if value is None else value


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
