"""The three products of a training step, one thread, side by side in one run, with a roofline.

    python scripts/bench/bench_kernels.py [--sizes 4096 16384] [--batch 256] [--repeats 9]

For each n: an n x n CSR matrix W with 32 random nonzeros per row (float32), dense n x B blocks X
and G. Kernels: the forward product W X, the transposed product W^T G and the weight gradient
(G X^T sampled on W's pattern). Implementations: spdnn's numba and scipy backends (W^T G on the
stored transpose, as the runtime does), and, when torch is installed (`pip install
torch==2.13.0`; not a dependency of spdnn), F.embedding_bag (fbgemm; W^T G on the transposed
pattern), torch.sparse.mm on CSR and torch.sparse.sampled_addmm. Times are medians of
interleaved repeats.

Roofline: every product reads nnz x B gathered values (a row of X or G per nonzero), which is
far more than the arrays themselves; ``gathered GB/s`` is that traffic over the time. The
ceilings, measured in the same run on one core: `stream` (a large numpy copy: DRAM), and
`gather` (the same gathers with no arithmetic: sum the rows W names, in W's order). A
gather-bound kernel cannot beat the gather ceiling; the last column says how close each is.
`W^T G + SDDMM` is the backward pass of a hidden layer: spdnn does both in one pass over W^T
(each gathered row of G serves both; its gathered traffic is counted as two products' worth, as
the others move it).
Writes the table to docs/BENCHMARKS.md.
"""

from __future__ import annotations  # noqa: I001 (spdnn before numpy: one BLAS thread)

import spdnn.cli.thread_pools  # noqa: F401  (every pool one thread, as the spdnn command has)

import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numba as nb  # noqa: E402
import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import interleaved, number, parser, publish, summary_row, table  # noqa: E402

from spdnn.kernels import products as kernels  # noqa: E402
from spdnn.model.generate import fixed_fan_in  # noqa: E402


@nb.njit(cache=True, nogil=True)
def gather_rows(indptr, indices, x, out):  # noqa: ANN001, ANN201
    """out[i] = sum of the rows of x that row i of the pattern names: the gathers of W X with
    no multiplications (the ceiling of a gather-bound product)."""
    batch = x.shape[1]
    for i in range(len(indptr) - 1):
        acc = out[i]
        for b in range(batch):
            acc[b] = 0
        e, stop = indptr[i], indptr[i + 1]
        while e + 8 <= stop:
            x0, x1, x2, x3 = x[indices[e]], x[indices[e + 1]], x[indices[e + 2]], x[indices[e + 3]]
            x4, x5, x6, x7 = x[indices[e + 4]], x[indices[e + 5]], x[indices[e + 6]], \
                x[indices[e + 7]]
            for b in range(batch):
                acc[b] += ((x0[b] + x1[b]) + (x2[b] + x3[b])) + ((x4[b] + x5[b]) + (x6[b] + x7[b]))
            e += 8
        while e < stop:
            xr = x[indices[e]]
            for b in range(batch):
                acc[b] += xr[b]
            e += 1


def stream_bandwidth(repeats: int) -> float:
    """Bytes per second of a 256 MB numpy copy (read + write), best of ``repeats``."""
    src = np.ones(1 << 26, np.float32)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best


def torch_ops(w: sp.csr_matrix, x: np.ndarray, d: np.ndarray) -> tuple[dict, str] | None:
    try:
        import torch
    except ImportError:
        return None
    import warnings

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    F = torch.nn.functional
    wt = w.T.tocsr()
    wt.sort_indices()
    long = lambda a: torch.from_numpy(a.astype(np.int64))  # noqa: E731
    tw = torch.sparse_csr_tensor(long(w.indptr), long(w.indices), torch.from_numpy(w.data),
                                 size=w.shape)
    twt = torch.sparse_csr_tensor(long(wt.indptr), long(wt.indices), torch.from_numpy(wt.data),
                                  size=wt.shape)
    pattern = torch.sparse_csr_tensor(long(w.indptr), long(w.indices), torch.ones(w.nnz),
                                      size=w.shape)
    tx, td = torch.from_numpy(x), torch.from_numpy(d)
    cols, offs, vals = long(w.indices), long(w.indptr[:-1]), torch.from_numpy(w.data)
    cols_t, offs_t, vals_t = long(wt.indices), long(wt.indptr[:-1]), torch.from_numpy(wt.data)
    ops = {
        "W X/torch embedding_bag": lambda: F.embedding_bag(cols, tx, offs,
                                                           per_sample_weights=vals, mode="sum"),
        "W X/torch CSR mm": lambda: torch.sparse.mm(tw, tx),
        "W^T G/torch embedding_bag": lambda: F.embedding_bag(cols_t, td, offs_t,
                                                             per_sample_weights=vals_t,
                                                             mode="sum"),
        "W^T G/torch CSR mm": lambda: torch.sparse.mm(twt, td),
        "SDDMM/torch sampled_addmm": lambda: torch.sparse.sampled_addmm(pattern, td, tx.t(),
                                                                        beta=0.0),
    }
    ops["W^T G + SDDMM/torch embedding_bag + sampled_addmm"] = lambda: (
        ops["W^T G/torch embedding_bag"](), ops["SDDMM/torch sampled_addmm"]())
    return ops, torch.__version__


def case(n: int, batch: int, rng: np.random.Generator) -> tuple:
    """An n x n W with 32 nonzeros per row (int32 indices), blocks X and G of n x batch, and
    the outputs of the products: (w, x, d, outs)."""
    w = fixed_fan_in(n, n, 32, rng, "float32")
    w = sp.csr_matrix((w.data, w.indices.astype(np.int32), w.indptr.astype(np.int32)),
                      shape=w.shape)
    x = rng.standard_normal((n, batch)).astype(np.float32)
    d = rng.standard_normal((n, batch)).astype(np.float32)
    outs = {"z": np.empty((n, batch), np.float32), "g": np.empty((n, batch), np.float32),
            "s": np.empty(w.nnz, np.float32)}
    return w, x, d, outs


def candidates(w: sp.csr_matrix, x: np.ndarray, d: np.ndarray, outs: dict) -> dict:
    t = kernels.transpose(w)
    wt = t.matrix(w.data)  # W^T with values, for the plain product

    def with_backend(name: str, fn):  # noqa: ANN001, ANN202
        def run():  # noqa: ANN202
            kernels.set_backend(name)
            return fn()
        return run

    fns = {"gather ceiling/no arithmetic": lambda: gather_rows(w.indptr, w.indices, x,
                                                               outs["z"])}
    for be in ("numba", "scipy"):
        fns[f"W X/spdnn {be}"] = with_backend(be, lambda: kernels.spmm(w, x, None, outs["z"]))
        fns[f"W^T G/spdnn {be}"] = with_backend(be, lambda: kernels.spmm(wt, d, None,
                                                                        outs["g"]))
        fns[f"SDDMM/spdnn {be}"] = with_backend(be, lambda: kernels.sddmm(w, d, x, outs["s"]))
        fns[f"W^T G + SDDMM/spdnn {be}, one pass"] = with_backend(
            be, lambda: kernels.backward_products(t, w.data, d, x, outs["g"], outs["s"]))
    return fns


def summary(tables: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """Each kernel's spdnn time against the fastest other implementation, at each size."""
    rows = []
    for row in tables[0]:
        if row["implementation"].startswith("spdnn numba"):
            peers = [r for r in tables[0] if r["n"] == row["n"] and r["kernel"] == row["kernel"]
                     and not r["implementation"].startswith("spdnn")]
            best = min(peers, key=lambda r: number(r["ms"]))
            rows.append(summary_row(f"{row['kernel']}, n = {row['n']}, batch 256 (ms)",
                                    row["ms"], f"{best['ms']} ({best['implementation']})",
                                    f"{row['vs fastest other']} faster"))
    return rows


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--sizes", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    kernels.set_threads(1)
    rng = np.random.default_rng(0)
    stream = stream_bandwidth(args.repeats)
    rows = []
    torch_version = None
    for n in args.sizes:
        w, x, d, outs = case(n, args.batch, rng)
        fns = candidates(w, x, d, outs)
        t = torch_ops(w, x, d)
        if t:
            ops, torch_version = t
            fns.update(ops)
        secs = interleaved(fns, args.repeats)
        ceiling = w.nnz * args.batch * 4 / secs["gather ceiling/no arithmetic"]
        for kernel in ("gather ceiling", "W X", "W^T G", "SDDMM", "W^T G + SDDMM"):
            names = [k for k in secs if k.startswith(kernel + "/")]
            fastest_other = min((secs[k] for k in names if "spdnn" not in k), default=None)
            for name in sorted(names, key=secs.get):
                s = secs[name]
                gathered = w.nnz * args.batch * 4 * (2 if kernel == "W^T G + SDDMM" else 1)
                vs = f"{fastest_other / s:.2f}x" if fastest_other and "spdnn" in name else ""
                flop = 2 * w.nnz * args.batch * (2 if kernel == "W^T G + SDDMM" else 1)
                rows.append([str(n), kernel, name.split("/", 1)[1], f"{s * 1e3:.2f}",
                             f"{flop / s / 1e9:.1f}",
                             f"{gathered / s / 1e9:.1f}", f"{gathered / s / ceiling:.2f}", vs])
                print(" | ".join(rows[-1]), flush=True)
    body = ("Command: `python scripts/bench/bench_kernels.py --sizes "
            f"{' '.join(map(str, args.sizes))} "
            f"--batch {args.batch} --repeats {args.repeats}` (float32, one thread, 32 nonzeros "
            f"per row, median of {args.repeats} interleaved repeats; torch "
            f"{torch_version or 'not installed'}). Stream bandwidth of one core in this run (a "
            f"256 MB numpy copy, read + write): {stream / 1e9:.1f} GB/s. `gathered GB/s`: the "
            "nnz x B values each product reads through the cache over its time; `of gather "
            "ceiling`: that rate over the gather ceiling's (the same gathers, no arithmetic); "
            "`vs fastest other`: the fastest non-spdnn implementation's time over spdnn's "
            "(above 1: spdnn is faster).\n\n"
            + table(["n", "kernel", "implementation", "ms", "GFLOP/s", "gathered GB/s",
                     "of gather ceiling", "vs fastest other"], rows))
    publish(args, "BENCH_KERNELS", "Local kernels", body, area="Kernels", rows=summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
