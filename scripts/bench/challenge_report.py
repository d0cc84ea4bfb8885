"""The tables, growth fits and plot of scripts/bench/bench_challenge.py, from its results.json."""

from __future__ import annotations  # noqa: I001 (spdnn before numpy: one BLAS thread)

import spdnn.cli.thread_pools  # noqa: F401  (every pool one thread, as the spdnn command has)

from pathlib import Path

import numpy as np
from harness import table

ONE_CORE_BASELINES = ("GraphBLAS 1 thread", "scipy loop")
TWO_CORE_SPDNN = ("spdnn 1 rank x 2 threads", "spdnn 2 ranks, hypergraph plan",
                  "spdnn 2 ranks, data parallel")
_ORDER = ("GraphBLAS 1 thread", "GraphBLAS 2 threads", "scipy loop", "spdnn P=1",
          "spdnn 1 rank x 2 threads", "spdnn 2 ranks, data parallel",
          "spdnn 2 ranks, hypergraph plan", "spdnn P=1 (baseline inputs)")


def _ratios(r: dict) -> tuple[float, float]:
    """spdnn at one core over the better one-thread baseline; spdnn's best at two cores over
    GraphBLAS at two threads (on the baselines' inputs when they are a subset)."""
    e = r["engines"]
    one = e.get("spdnn P=1 (baseline inputs)", e["spdnn P=1"])["rate"]
    base1 = max(e[k]["rate"] for k in ONE_CORE_BASELINES)
    two = max(e[k]["rate"] for k in TWO_CORE_SPDNN if k in e)
    if "spdnn P=1 (baseline inputs)" in e:  # scale the full-input two-core rate to the subset
        two *= one / e["spdnn P=1"]["rate"]
    return one / base1, two / e["GraphBLAS 2 threads"]["rate"]


def _rounds(r: dict) -> str:
    """spdnn's rounds / the other engines' rounds (the fewest of each side's engines)."""
    sides = [[m.get("rounds", r.get("rounds")) for k, m in r["engines"].items()
              if k.startswith("spdnn") == spdnn] for spdnn in (True, False)]
    return " / ".join(str(min(x)) if x and None not in x else "-" for x in sides)


def _fit(x: list[float], y: list[float]) -> str:
    if len(x) < 2 or len(set(x)) < 2:
        return "-"
    slope = np.polyfit(np.log(x), np.log(y), 1)[0]
    return f"{slope:.2f}"


def report(results: dict, figure: Path) -> str:
    rows, skipped, summary = [], [], []
    for spec, r in results.items():
        if "skipped" in r:
            skipped.append(f"- {spec}: not run, {r['skipped']}.")
            continue
        if not r.get("plan", True):
            skipped.append(f"- {spec}: no hypergraph plan (partitioning {r['edges']:,} edges "
                           "is beyond this benchmark's --max-plan-edges).")
        e = r["engines"]
        for name, m in sorted(e.items(), key=lambda kv: _ORDER.index(kv[0])
                              if kv[0] in _ORDER else len(_ORDER)):
            rows.append([spec, name, f"{m['inputs']:,}", f"{m['rate']:.3g}",
                         f"{m['seconds']:.2f}", f"{m['peak'] / 2**30:.2f}",
                         f"{m['categories']:,}"])
        one, two = _ratios(r)
        live = r.get("live_fraction")
        summary.append([spec, f"{r['edges']:,}", f"{one:.2f}x", f"{two:.2f}x",
                        f"{e['spdnn P=1']['categories']:,} of {r['inputs']:,}",
                        f"{live:.3f}" if live is not None else "-", _rounds(r)])
    engines = sorted({k for r in results.values() if "engines" in r for k in r["engines"]})
    growth = []
    series = {}
    for name in engines:
        pts = [(r["edges"] * r["engines"][name]["inputs"], r["engines"][name]["seconds"],
                r["edges"], r["engines"][name]["peak"])
               for r in results.values() if "engines" in r and name in r["engines"]]
        if not pts:
            continue
        work, secs, edges, peak = (list(t) for t in zip(*sorted(pts)))
        series[name] = (work, secs)
        per_edge = [s / w * 1e12 for s, w in zip(secs, work)]
        growth.append([name, str(len(pts)), _fit(work, secs), _fit(edges, peak),
                       ", ".join(f"{p:.1f}" for p in per_edge)])
    _plot(series, figure)
    commands = sorted({r["command"] for r in results.values() if "command" in r})
    commits: dict[str, list[str]] = {}
    for spec, r in results.items():
        commits.setdefault(r.get("commit", "before the commit was recorded"), []).append(spec)
    text = ("Commands: " + "; ".join(f"`python scripts/bench/bench_challenge.py {c}`"
                                     for c in commands)
            + ". Code measured: " + "; ".join(f"{', '.join(specs)} at {c}"
                                              for c, specs in commits.items())
            + ". RadiX-Net networks (`spdnn generate radixnet`, the challenge's bias per size, "
              "cap 32), MNIST training images made challenge inputs (`spdnn generate "
              "challenge-images`). Rate = inputs x edges / seconds of the inference loop "
              "(median of the rounds); peak = the largest resident memory of the engine's "
              "process tree; float32.\n\n"
            + table(["network", "engine", "inputs", "rate (edges/s)", "seconds", "peak GB",
                     "categories"], rows)
            + "\n\n**Targets.** spdnn P=1 over the better of GraphBLAS and scipy at one thread "
              "(target 5x), and spdnn's best at two cores over GraphBLAS at two threads "
              "(target 5x); categories: inputs alive after the last layer; live: the mean "
              "fraction of inputs alive per layer (scipy loop); rounds: interleaved rounds, "
              "spdnn's / the other engines' (each side can be rerun alone: --only-spdnn, "
              "--only-baselines).\n\n"
            + table(["network", "edges", "1 core vs best baseline", "2 cores vs GraphBLAS 2t",
                     "categories", "live", "rounds"], summary))
    if skipped:
        text += "\n\n" + "\n".join(skipped)
    text += ("\n\n**Cost growth.** Exponent b of time ~ (edges x inputs)^b and of peak memory "
             "~ edges^b, fitted over the networks run; time per edge per input in "
             "picoseconds, in the order of edges x inputs.\n\n"
             + table(["engine", "networks", "time exponent", "memory exponent",
                      "ps per edge x input"], growth))
    if figure.exists():
        text += f"\n\n![cost growth]({figure.relative_to(figure.parents[1]).as_posix()})"
    return text


def _plot(series: dict[str, tuple[list[float], list[float]]], figure: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, (work, secs) in series.items():
        ax.loglog(work, secs, marker="o", label=name)
    ax.set_xlabel("edges x inputs")
    ax.set_ylabel("seconds of the inference loop")
    ax.set_title("Graph Challenge: time against work")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    figure.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(figure, dpi=110)
    plt.close(fig)
