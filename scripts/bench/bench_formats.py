"""Reading a Graph Challenge network (one TSV file of ``row col value`` triples per layer): the
reader as it is (numpy's C parser, duplicate entries found by sorting) against the reader before
2026-11-25 (every line split in Python, duplicates found by np.unique), side by side. And a
Matrix Market file of challenge input images (``--images`` of ``--neurons`` pixels, about 150
nonzeros each, as MNIST's): scipy's C++ reader behind the byte check (spdnn.io._mtx_fast)
against the line parser it had before 2026-11-27.

    python scripts/bench/bench_formats.py [--neurons 1024] [--layers 120] [--images 60000]
        [--repeats 3] [--no-write]

The network is a generated RadiX-Net of the challenge's shape (32 nonzeros per row), written as
a Graph Challenge directory in a temporary folder, so that ../shared is not needed. Both readers
must give the same network (its fingerprint) before a time is printed. Writes docs/BENCHMARKS.md,
section "Reading Graph Challenge networks".
"""

from __future__ import annotations  # noqa: I001 (spdnn before numpy: one BLAS thread)

import os
import sys
import tempfile
from pathlib import Path

import spdnn.cli.thread_pools  # noqa: F401
from spdnn.io import formats
from spdnn.io import graphchallenge as gc
from spdnn.io.graphchallenge import read_graphchallenge, write_graphchallenge
from spdnn.model.generate import radixnet

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import interleaved, parser, publish, summary_row, table  # noqa: E402


def _before(path: str, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray,
            shape: tuple[int, int]) -> sp.csr_matrix:
    """The duplicate check as it was: np.unique over the entry keys."""
    key = rows * shape[1] + cols
    if len(np.unique(key)) != len(key):
        raise ValueError(path)
    m = sp.csr_matrix((vals, (rows, cols)), shape=shape)
    m.sort_indices()
    return m


def read_as_before(directory: Path) -> object:
    """The reader with the line-by-line parser and np.unique swapped in for the call."""
    saved = formats._parse_rows, gc.coo_to_csr
    formats._parse_rows, gc.coo_to_csr = formats._parse_lines, _before
    try:
        return read_graphchallenge(directory, -0.3, 32)
    finally:
        formats._parse_rows, gc.coo_to_csr = saved


def images_mtx(tmp: Path, n: int, pixels: int, repeats: int) -> tuple[int, dict[str, float]]:
    """A Matrix Market file of ``n`` images read both ways: nonzeros, and median seconds."""
    m = sp.random(n, pixels, density=min(1.0, 150 / pixels), format="csr", random_state=0)
    m.data[:] = 1.0
    path = tmp / "images.mtx"
    formats.write_mtx(path, m)

    def by_lines() -> sp.csr_matrix:
        return formats._read_mtx_lines(str(path), path.read_text().splitlines())

    assert (formats.read_mtx(path) != by_lines()).nnz == 0, "the readers disagree"
    return m.nnz, interleaved({"now": lambda: formats.read_mtx(path), "before": by_lines},
                              repeats=repeats)


def summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """Each file's read time (the reader before 2026-11-25 is the only other measured)."""
    return [summary_row(f"read {r['file']}, {r['nonzeros']} nonzeros (s)", r["now, s"],
                        f"{r['before, s']} (spdnn's line parser before 2026-11-25)",
                        f"{r['speed-up']} faster") for r in tables[0]]


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--neurons", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=120)
    ap.add_argument("--images", type=int, default=60_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "network"
        write_graphchallenge(radixnet(args.neurons, args.layers, seed=0), d)
        now = read_graphchallenge(d, -0.3, 32)
        assert read_as_before(d).fingerprint() == now.fingerprint(), "the readers disagree"
        times = interleaved({"now": lambda: read_graphchallenge(d, -0.3, 32),
                             "before": lambda: read_as_before(d)}, repeats=args.repeats)
        images, mtx_times = images_mtx(Path(tmp), args.images, args.neurons, args.repeats)
    rows = [[f"{args.neurons} x {args.layers} network (TSV)", f"{now.nnz:,}",
             f"{times['before']:.2f}", f"{times['now']:.2f}",
             f"{times['before'] / times['now']:.2f}x"],
            [f"{args.images:,} images (Matrix Market)", f"{images:,}",
             f"{mtx_times['before']:.2f}", f"{mtx_times['now']:.2f}",
             f"{mtx_times['before'] / mtx_times['now']:.2f}x"]]
    header = ["file", "nonzeros", "before, s", "now, s", "speed-up"]
    body = (f"Command: `python scripts/bench/bench_formats.py --neurons {args.neurons} --layers "
            f"{args.layers} --images {args.images} --repeats {args.repeats}` (median of "
            "interleaved repeats, one thread; a generated RadiX-Net written as Graph "
            "Challenge TSV files; both readers give the same fingerprint). `before`: every "
            "line split in Python and duplicates found by np.unique, as the reader was "
            "before 2026-11-25; `now`: numpy's C parser (the line-by-line pass runs only to "
            "name a bad line) and duplicates found by sorting. Images: "
            f"{args.images:,} random images of {args.neurons} pixels, 150 nonzeros each; "
            "`before`: the line parser (numpy's C parser over the decoded lines), `now`: "
            "scipy's fast_matrix_market on one thread behind a check of the bytes "
            "(spdnn.io._mtx_fast); the same matrix.\n\n" + table(header, rows))
    publish(args, "formats", "Reading Graph Challenge networks", body, area="Kernels",
            rows=summary)


if __name__ == "__main__":
    main()
