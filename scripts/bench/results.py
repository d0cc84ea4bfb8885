"""The results pages, docs/BENCHMARKS.md and docs/SCALING.md, rendered from the benchmarks'
JSON records in docs/results/: one table per area (what, spdnn, the peer, the ratio, the
machine, the date, the command). The benchmark scripts write the records
(``harness.publish``) and re-render the pages; nobody edits the pages by hand.

    python scripts/bench/results.py            # re-render both pages from docs/results/
    python scripts/bench/results.py --check    # exit 1 if a page differs from its records

A record (one per published section, ``docs/results/MARKER.json``)::

    {"format": "spdnn-results/1", "marker": "BENCH_TRAIN", "page": "BENCHMARKS",
     "area": "Training", "title": "...", "command": "python scripts/bench/...",
     "machine": "...", "date": "2026-11-29",
     "rows": [{"what": "...", "spdnn": "...", "peer": "...", "ratio": "..."}],
     "tables": [[{"column": "value", ...}, ...]]}

``rows`` are the summary the page shows; ``tables`` every table the script printed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
FORMAT = "spdnn-results/1"
MAX_LINES = 500
MAX_CELL = 400
ROW_KEYS = ("what", "spdnn", "peer", "ratio")

# page -> (area, what the area measures), in the order the page shows them
AREAS: dict[str, list[tuple[str, str]]] = {
    "BENCHMARKS": [
        ("Kernels", "The local sparse products on one thread, against scipy and PyTorch; "
                    "the exchange's encoders; reading the challenge's files."),
        ("Training", "One SGD step of the 4096 -> 16384 x 3 -> 10 networks (fan-in 32, batch "
                     "256) against the fastest PyTorch formulation, and the recipes' cost."),
        ("Inference", "Graph Challenge inference against GraphBLAS and the scipy loop, "
                      "categories equal."),
        ("Partitioning", "Rows per step under the partitioner's plans (the sweep method, the "
                         "default, and the hypergraph method) against block and cyclic plans, "
                         "the partitioner's time and memory."),
        ("Exchange and grids", "Bytes and time of the sparse exchange; model parts against "
                               "replicas."),
        ("Compression and critical sets", "Lossy gradient sums and critical-set training "
                                          "against exact training, MNIST."),
        ("Extreme classification", "LSH-selected output neurons against the exact step and "
                                   "PyTorch's full softmax."),
        ("Over a network", "Training over an emulated link: the best spdnn grid against "
                           "PyTorch DDP, and the hypergraph plan against block."),
        ("Memory", "Each rank's peak against the prediction, and against one rank."),
        ("Dynamic sparsity", "SET and RigL topology updates against static sparse training at "
                             "equal density, and what the updates cost."),
    ],
    "SCALING": [
        ("Cost model", "The cost model's predicted step time against the measured one."),
        ("Scaling study", "Predicted step time from 1 to 1,024 ranks."),
    ],
}
INTRO = {
    "BENCHMARKS": (
        "# Benchmarks\n\n"
        "Current figures, one table per area. Every figure comes from a script in "
        "`scripts/bench/` (`python scripts/bench/NAME.py --help`), run with the command beside "
        "it, on the machine named beside it (machines below); ratios are taken side by side in "
        "one run, one thread per rank unless the row says otherwise. Each script writes its "
        "record to `docs/results/` (every table it printed, as JSON) and re-renders this page "
        "(`scripts/bench/results.py`); what was measured before lives in git's history.\n\n"
        "Columns: *what* was measured; *spdnn*'s figure; the *peer*'s (the fastest reasonable "
        "alternative a user would run, named in the row); the *ratio* as the row states it.\n"),
    "SCALING": (
        "# Scaling\n\n"
        "How well the cost model (docs/cost-model.md) predicts measured step times, and what it "
        "predicts beyond this machine. Rendered from `docs/results/` like "
        "[BENCHMARKS.md](BENCHMARKS.md); same columns: *spdnn* is the model's prediction or "
        "spdnn's measured figure as the row says, *peer* the measured one it is held against.\n"),
}


# the records an area shows first (the headline figures), then the others by marker
FIRST = ["BENCH_KERNELS", "BENCH_TRAIN", "mnist-mlp", "BENCH_CHALLENGE", "BENCH_INFER",
         "partition-scale", "BENCH_PARTITION_SWEEP", "BENCH_PARTITION",
         "bench-network-main-mlp-random-radixnet16384", "memory-101m",
         "validation"]


class RecordError(ValueError):
    pass


def check_record(record: dict, source: str) -> dict:
    """A record as the pages need it, or RecordError naming the file and the problem."""
    if record.get("format") != FORMAT:
        raise RecordError(f"{source}: format is not {FORMAT}")
    areas = {a for a, _ in AREAS.get(record.get("page", ""), [])}
    if not areas:
        raise RecordError(f"{source}: page must be one of {sorted(AREAS)}")
    if record.get("area") not in areas:
        raise RecordError(f"{source}: area {record.get('area')!r} is not an area of "
                          f"{record['page']}")
    for key in ("marker", "title", "command", "machine", "date"):
        if not isinstance(record.get(key), str) or not record[key]:
            raise RecordError(f"{source}: {key} is missing")
    if not re.fullmatch(r"\d{4}-\d\d-\d\d", record["date"]):
        raise RecordError(f"{source}: date {record['date']!r} is not YYYY-MM-DD")
    rows = record.get("rows")
    if not isinstance(rows, list) or not rows:
        raise RecordError(f"{source}: no summary rows")
    for row in rows:
        if set(row) != set(ROW_KEYS) or not all(isinstance(v, str) for v in row.values()):
            raise RecordError(f"{source}: a row must hold exactly {', '.join(ROW_KEYS)}")
    return record


def load(results: Path = RESULTS) -> list[dict]:
    return [check_record(json.loads(p.read_text()), str(p.relative_to(ROOT)))
            for p in sorted(results.glob("*.json"))]


def short_machine(machine: str) -> str:
    """'Intel(R) Xeon(R) Processor (family 6, model 207), 2 cores, ...' -> 'Intel Xeon
    (6/207)': the CPU and its family/model, which the table cells name."""
    name = machine.split(" (family")[0].replace("(R)", "").replace("(TM)", "")
    name = re.sub(r"\s+(Processor|CPU)\b.*", "", name).strip()
    found = re.search(r"family (\d+), model (\d+)", machine)
    return f"{name} ({found.group(1)}/{found.group(2)})" if found else name


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(page: str, records: list[dict]) -> str:
    mine = [r for r in records if r["page"] == page]
    lines = [INTRO[page]]
    machines: dict[str, str] = {}
    def rank(record: dict) -> tuple[int, str]:
        marker = record["marker"]
        return (FIRST.index(marker) if marker in FIRST else len(FIRST), marker)

    for area, description in AREAS[page]:
        inside = sorted((r for r in mine if r["area"] == area), key=rank)
        if not inside:
            continue
        lines += [f"## {area}", "", description, "",
                  "| what | spdnn | peer | ratio | machine | date | command |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for number, record in enumerate(inside, 1):
            label = short_machine(record["machine"])
            machines.setdefault(label, record["machine"])
            for row in record["rows"]:
                cells = [row[k] for k in ROW_KEYS] + [label, record["date"], f"({number})"]
                lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        lines += ["", "Commands (every table each printed: `docs/results/MARKER.json`):", ""]
        lines += [f"{number}. `{r['command']}` ({r['marker']})"
                  for number, r in enumerate(inside, 1)]
        lines.append("")
    lines += ["## Machines", ""]
    lines += [f"- {label}: {full}" for label, full in sorted(machines.items())]
    return "\n".join(lines).rstrip() + "\n"


def problems(page: str, text: str) -> list[str]:
    """What breaks the page's limits: its length, and any cell over MAX_CELL characters."""
    found = []
    lines = text.splitlines()
    if len(lines) > MAX_LINES:
        found.append(f"{page}: {len(lines)} lines (at most {MAX_LINES})")
    for number, line in enumerate(lines, 1):
        if line.startswith("|"):
            for cell in (c.strip() for c in line.strip().strip("|").split(" | ")):
                if len(cell) > MAX_CELL:
                    found.append(f"{page} line {number}: a cell of {len(cell)} characters")
    return found


def page_path(page: str) -> Path:
    return ROOT / "docs" / f"{page}.md"


def write_pages(results: Path = RESULTS) -> list[Path]:
    from spdnn.io.atomic import write_text  # fsynced, renamed: as every spdnn output

    records = load(results)
    written = []
    for page in AREAS:
        text = render(page, records)
        bad = problems(page, text)
        if bad:
            raise RecordError("; ".join(bad))
        write_text(page_path(page), text, f"docs/{page}.md")
        written.append(page_path(page))
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.split("\n\n")[1].splitlines()))
    ap.add_argument("--check", action="store_true",
                    help="compare the pages with their rendering; exit 1 if they differ")
    args = ap.parse_args(argv)
    try:
        records = load()
    except (RecordError, json.JSONDecodeError) as e:
        print(f"results: {e}", file=sys.stderr)
        return 2
    if args.check:
        stale = [p for p in AREAS if page_path(p).read_text() != render(p, records)]
        bad = [m for p in AREAS for m in problems(p, render(p, records))]
        for line in [*(f"docs/{p}.md differs from docs/results/ (run "
                       "python scripts/bench/results.py)" for p in stale), *bad]:
            print(line, file=sys.stderr)
        return 1 if stale or bad else 0
    for path in write_pages():
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
