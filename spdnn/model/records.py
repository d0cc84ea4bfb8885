"""Results of the Python API (``spdnn.train``, ``spdnn.infer``) and of the commands built on
it: what a job returns and what ``--metrics-out`` writes. The options are spdnn.model.options."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from spdnn.model.reports import EpochReport

if TYPE_CHECKING:
    from spdnn.model.network import Network

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
    # with ``train(..., return_network=True)``: the trained network, whole, on every rank
    network: Network | None = None

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
