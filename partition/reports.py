"""The tables and phrases spdnn-partition prints: per-layer statistics, plans beside the
baselines, the values of a training step."""

from __future__ import annotations

from collections.abc import Sequence


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows)


def objective_volume(stats, objective: str) -> str:  # noqa: ANN001
    """The volume the plan was optimised for first, the other beside it."""
    if objective == "infer":
        return (f"forward volume {stats.forward_total:,} rows per pass (the objective; "
                f"{stats.volume:,} with training's backward)")
    return f"volume {stats.volume:,} rows per training step ({stats.forward_total:,} forward)"


def format_stats(stats, sizes: Sequence[int],  # noqa: ANN001
                 limits: Sequence[float] | None = None, objective: str = "train") -> str:
    rows = [["layer", "neurons", "forward", "backward", "rank pairs", "imbalance"]
            + (["limit"] if limits is not None else [])]
    for k in range(1, len(sizes)):
        imb = stats.imbalance[k - 1]
        row = [str(k), f"{sizes[k]:,}", f"{stats.forward[k - 1]:,}",
               f"{stats.backward[k - 1]:,}", str(stats.pairs[k - 1]), f"{100 * imb:.2f}%"]
        if limits is not None:
            row.append(f"{100 * limits[k - 1]:.2f}%" + (" OVER" if imb > limits[k - 1] + 1e-9
                                                        else ""))
        rows.append(row)
    rows.append(["total", f"{sum(sizes):,}", f"{stats.forward_total:,}",
                 f"{stats.backward_total:,}", str(sum(stats.pairs)),
                 f"{100 * stats.max_imbalance:.2f}% max"] + ([""] if limits is not None else []))
    s = stats.summary()
    return (_table(rows) + f"\n{objective_volume(stats, objective)} (bytes: rows x batch "
            f"x item size); per rank sent max {s['max_sent']:,} mean {s['mean_sent']:,.0f}, "
            f"received max {s['max_received']:,} mean {s['mean_received']:,.0f}; "
            f"{stats.messages:,} messages per training step")


def format_compare(named: dict, ref: str) -> str:
    rows = [["plan", "volume", "forward", "vs " + ref, "max sent/rank", "max received/rank",
             "messages", "max imbalance"]]
    base = named[ref].volume
    for name, st in named.items():
        rows.append([name, f"{st.volume:,}", f"{st.forward_total:,}",
                     f"{base / max(st.volume, 1):.2f}x less" if name != ref else "1.00x",
                     f"{max(st.sent):,}", f"{max(st.received):,}", f"{st.messages:,}",
                     f"{100 * st.max_imbalance:.2f}%"])
    return _table(rows)


def named_stats(patterns, owners, nparts: int, name: str, seed: int) -> dict:  # noqa: ANN001
    """The plan's statistics, then each baseline's."""
    from spdnn.model.plan import plan_statistics

    from .methods import BASELINES, baseline_owners

    named = {name: plan_statistics(patterns, owners, parts=nparts)}
    for b in BASELINES:
        if b != name:
            owners = baseline_owners(b, patterns, parts=nparts, seed=seed)
            named[b] = plan_statistics(patterns, owners, parts=nparts)
    return named


def format_step_values(v) -> str:  # noqa: ANN001
    lines = [f"values per training step, batch {v.batch} on {v.replicas} replica(s) "
             f"({v.ALGORITHM}):",
             "layer        expand          fold   gradient sum in   gradient sum sent"]
    for k, row in enumerate(zip(v.expand, v.fold, v.gradient_in, v.gradient_sent), start=1):
        lines.append(f"{k:5d}  {row[0]:>12,}  {row[1]:>12,}  {row[2]:>16,}  {row[3]:>18,.0f}")
    lines.append(f"total  {sum(v.expand):>12,}  {sum(v.fold):>12,}  {sum(v.gradient_in):>16,}"
                 f"  {sum(v.gradient_sent):>18,.0f}")
    return "\n".join(lines)
