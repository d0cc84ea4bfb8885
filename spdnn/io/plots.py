"""Pictures of a run and of a plan (matplotlib, an optional extra: ``pip install spdnn[plot]``).

``plot_training``: loss, accuracy and samples/s per epoch from ``spdnn train --metrics-out``.
``plot_plan``: per-layer forward and backward volume of a plan beside baselines, and each rank's
rows sent and received. Files are written under a temporary name and renamed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from spdnn.errors import InputError, SpdnnError
from spdnn.io.atomic import atomic_path


def _pyplot():  # noqa: ANN202
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display
        import matplotlib.pyplot as plt
    except ImportError:
        raise SpdnnError("plots need matplotlib, an optional extra: pip install matplotlib "
                         "(or spdnn[plot])") from None
    return plt


def _save(fig: Any, path: str | os.PathLike) -> None:
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    if suffix not in (".png", ".pdf", ".svg"):
        raise InputError(path, "plot files end in .png, .pdf or .svg")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=suffix[1:], dpi=120, bbox_inches="tight")


def read_training_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The per-epoch records of a ``spdnn train --metrics-out`` file, validated
    (``spdnn.io.jsonfiles.TrainMetrics``)."""
    from spdnn.io.jsonfiles import TrainMetrics
    from spdnn.io.jsonread import as_dict, read

    return [as_dict(e) for e in read(path, TrainMetrics).epochs]


def plot_training(metrics: str | os.PathLike, output: str | os.PathLike) -> None:
    epochs = read_training_metrics(metrics)
    plt = _pyplot()
    x = [e["epoch"] for e in epochs]
    fig, (loss, acc, speed) = plt.subplots(1, 3, figsize=(13, 3.6))
    loss.plot(x, [e["loss"] for e in epochs], marker="o")
    loss.set(title="training loss", xlabel="epoch", yscale="log")
    drawn = 0
    for key, label in (("train_accuracy", "train"), ("test_accuracy", "test")):
        pts = [(e["epoch"], e[key]) for e in epochs if isinstance(e.get(key), (int, float))]
        if pts:
            acc.plot(*zip(*pts), marker="o", label=label)
            drawn += 1
    acc.set(title="accuracy", xlabel="epoch", ylim=(0, 1.02))
    if drawn:  # a legend of nothing would only warn
        acc.legend(loc="lower right")
    speed.plot(x, [e["samples_per_second"] for e in epochs], marker="o")
    speed.set(title="training speed", xlabel="epoch", ylabel="samples / s")
    speed.set_ylim(bottom=0)
    for ax in (loss, acc, speed):
        ax.grid(alpha=0.3)
    fig.suptitle(os.path.basename(os.fspath(metrics)), y=1.03)
    _save(fig, output)
    plt.close(fig)


def plot_plan(named: Mapping[str, Any], sizes: Sequence[int], title: str,
              output: str | os.PathLike) -> None:
    """``named``: plan name -> PlanStats, the plan first."""
    plt = _pyplot()
    layers = list(range(1, len(sizes)))
    fig, (fwd, bwd, ranks) = plt.subplots(1, 3, figsize=(14, 3.8))
    width = 0.8 / len(named)
    for i, (name, st) in enumerate(named.items()):
        shift = [k - 0.4 + (i + 0.5) * width for k in layers]
        fwd.bar(shift, st.forward, width, label=name)
        bwd.bar(shift, st.backward, width, label=name)
    fwd.set(title="forward (expand) rows per layer", xlabel="layer", ylabel="rows per pass")
    bwd.set(title="backward (fold) rows per layer", xlabel="layer")
    fwd.legend()
    first = next(iter(named.values()))
    r = list(range(first.parts))
    ranks.bar([p - 0.2 for p in r], first.sent, 0.4, label="sent")
    ranks.bar([p + 0.2 for p in r], first.received, 0.4, label="received")
    ranks.set(title=f"{next(iter(named))}: rows per rank and step", xlabel="rank")
    ranks.legend(loc="lower right")
    for ax in (fwd, bwd, ranks):
        ax.grid(alpha=0.3, axis="y")
    if len(layers) <= 20:
        for ax in (fwd, bwd):
            ax.set_xticks(layers)
    fig.suptitle(title, y=1.03)
    _save(fig, output)
    plt.close(fig)


def best_by_ranks(points: Sequence[tuple[int, float]]) -> dict[int, float]:
    """The smallest value for every rank count."""
    best: dict[int, float] = {}
    for ranks, value in points:
        best[ranks] = min(value, best.get(ranks, value))
    return best


def plot_scaling(curves: Mapping[str, Sequence[tuple[int, float]]], title: str,
                 output: str | os.PathLike, extrapolated_from: int | None = None) -> None:
    """Predicted speed-up against ranks, one line per curve plus the best at every P (log-log);
    points beyond ``extrapolated_from`` ranks are marked as extrapolated."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    best: dict[int, float] = {}
    for name, points in curves.items():
        pts = sorted(points)
        ax.plot([p for p, _ in pts], [s for _, s in pts], marker="o", ms=3, lw=1, label=name)
        for p, s in pts:
            best[p] = max(s, best.get(p, s))
    pts = sorted(best.items())
    ax.plot([p for p, _ in pts], [s for _, s in pts], color="black", lw=2.5, alpha=0.35,
            label="best grid")
    top = max(p for p, _ in pts)
    ax.plot([1, top], [1, top], color="grey", ls=":", lw=1, label="linear")
    if extrapolated_from is not None and extrapolated_from < top:
        ax.axvspan(extrapolated_from, top, color="grey", alpha=0.08,
                   label=f"beyond P = {extrapolated_from}: plans not partitioned")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("ranks P")
    ax.set_ylabel("predicted speed-up over P = 1")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    _save(fig, output)
    plt.close(fig)
