"""Write the option tables of the docs from the options' declarations (spdnn.schema): the
whole of docs/options.md, and the blocks between ``<!-- options: NAME -->`` and
``<!-- /options -->`` in the other pages. ``--check``: exit 1 when a page differs from what it
would write (the test suite runs it so).

    python scripts/option_tables.py           # rewrite the pages
    python scripts/option_tables.py --check   # are they current?
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from partition.options import PartitionOptions
from spdnn.model.options import RunOptions, TrainOptions
from spdnn.optim import OPTIMIZERS
from spdnn.schema import options, shown_default, table

DOCS = Path(__file__).resolve().parents[1] / "docs"
_BLOCK = re.compile(r"(<!-- options: ([a-z-]+) -->\n)(.*?)(<!-- /options -->)", re.S)


def _group(cls: type, group: str | None, skip: tuple[str, ...] = ()) -> str:
    return table(o for o in options(cls).values()
                 if o.group == group and o.name not in skip)


def optimizers() -> str:
    """One row per optimizer: its settings and defaults, and the torch.optim class."""
    lines = ["| `--optimizer` | settings (default) | the update, as torch.optim's |",
             "| --- | --- | --- |"]
    for name, cls in OPTIMIZERS.items():
        settings = ", ".join(f"`{o.cli}` ({shown_default(o)})"
                             for o in options(cls.Config).values())
        update = " ".join((cls.__doc__ or "").split("\n\n")[0].split()).replace("``", "`")
        lines.append(f"| `{name}`{' (the default)' if name == 'sgd' else ''} | {settings} "
                     f"| {update.replace('|', chr(92) + '|')} |")
    return "\n".join(lines) + "\n"


SPARSE = ("sparse_update", "update_every", "drop_fraction", "update_until", "update_scope",
          "replan", "grow_locality", "save_plan")


def blocks() -> dict[str, str]:
    train = options(TrainOptions)
    return {"optimizers": optimizers(),
            "sparse-update": table(train[n] for n in SPARSE)}


def options_page() -> str:
    groups = dict.fromkeys(o.group for o in options(TrainOptions).values() if o.group)
    parts = ["# Every option\n",
             "Each option of `spdnn train`, `spdnn infer` and `spdnn-partition` is declared once"
             " in the code (`spdnn.schema`): its flag, its keyword in `spdnn.RunOptions`, "
             "`spdnn.TrainOptions` or `partition.PartitionOptions`, its default, its check and "
             "whether a checkpoint records it. The tables below are written from those "
             "declarations (`python scripts/option_tables.py`). A bad value is refused in one "
             "line naming the option as you gave it: the flag on the command line, the keyword "
             "in Python.\n",
             "## Where and how a job runs (`RunOptions`)\n",
             "`--plan` is given once per candidate with `--replicas auto`; in Python, `plan` "
             "and `plans`.\n",
             table(o for o in options(RunOptions).values() if o.cli is not None),
             "## Training (`TrainOptions`)\n",
             _group(TrainOptions, None)]
    for group in groups:
        parts += [f"## {group[0].upper()}{group[1:]}\n", _group(TrainOptions, group)]
    parts += ["## Which optimizer takes which setting\n", optimizers()]
    parts += ["## Partitioning (`spdnn-partition`, `partition.PartitionOptions`)\n",
              "Besides the network, `-P` and `-o`; `reserve` has no flag (a time limit's "
              "seconds kept back to write the plan).\n",
              table(o for o in options(PartitionOptions).values() if o.cli is not None)]
    recorded = [o.cli or o.name for cls in (RunOptions, TrainOptions)
                for o in options(cls).values() if o.record == "same"]
    parts += ["## What a checkpoint records\n",
              "A checkpoint records these options, and a resume with another value of one of "
              "them is refused unless `--resume-with-changes`: "
              + ", ".join(f"`{r}`" for r in recorded)
              + ", and the optimizer's settings. It also records `--replicas`, `--replan` and "
              "the lossy options, which a resume may change. A manifest field that no option "
              "declares is refused.\n"]
    return "\n".join(parts)


def pages() -> dict[Path, str]:
    """Every page this script writes, as it would write it."""
    out = {DOCS / "options.md": options_page()}
    made = blocks()
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text()
        new = _BLOCK.sub(lambda m: m.group(1) + made[m.group(2)] + m.group(4), text)
        if new != text or _BLOCK.search(text):
            out[page] = new
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="report pages that are not current")
    args = ap.parse_args()
    stale = [p for p, text in pages().items() if not p.is_file() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(f"{p.relative_to(DOCS.parent)} is not current: run python "
                  "scripts/option_tables.py", file=sys.stderr)
        return 1 if stale else 0
    for p, text in pages().items():
        p.write_text(text)
    print(f"wrote {len(stale)} page(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
