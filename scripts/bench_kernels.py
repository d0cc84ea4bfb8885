"""Local kernel throughput, single thread, side by side in one run.

    python scripts/bench_kernels.py [--sizes 4096 16384] [--batch 256] [--repeats 7]

For each n: an n x n CSR matrix with 32 random nonzeros per row (float32) times a dense
n x B block. GFLOP/s = 2 nnz B / seconds (median of interleaved repeats). Backends: spdnn's
scipy and numba kernels, and torch.sparse CSR when torch is installed (`pip install
torch==2.13.0`; it is not a dependency of spdnn). SDDMM is compared with the best numpy/scipy
formulations that fit in memory: chunked einsum over the pattern, and a dense D X^T then
sampled. Writes the table to docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import interleaved, table, write_section  # noqa: E402

from spdnn import kernels  # noqa: E402
from spdnn.generate import fixed_fan_in  # noqa: E402


def torch_ops(w, x, d):  # noqa: ANN001, ANN201
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)
    tw = torch.sparse_csr_tensor(torch.from_numpy(w.indptr.astype(np.int64)),
                                 torch.from_numpy(w.indices.astype(np.int64)),
                                 torch.from_numpy(w.data), size=w.shape)
    twt = tw.t().to_sparse_csr()
    tx, td = torch.from_numpy(x), torch.from_numpy(d)
    ops = {"spmm": lambda: torch.sparse.mm(tw, tx), "spmm_t": lambda: torch.sparse.mm(twt, td)}
    try:
        torch.sparse.sampled_addmm(tw, td, tx.t())
        ops["sddmm"] = lambda: torch.sparse.sampled_addmm(tw, td, tx.t())
    except (RuntimeError, NotImplementedError):
        pass
    return ops, torch.__version__


def candidates(w, x, d, b, out, outt, outs) -> dict:  # noqa: ANN001
    """The timed callables of one problem size."""
    coo = w.tocoo()

    def with_backend(name, fn):  # noqa: ANN001, ANN202
        def run():  # noqa: ANN202
            kernels.set_backend(name)
            return fn()
        return run

    fns = {}
    for be in ("scipy", "numba"):
        fns[f"spmm/{be}"] = with_backend(be, lambda: kernels.spmm(w, x, b, out))
        fns[f"spmm_t/{be}"] = with_backend(be, lambda: kernels.spmm_t(w, d, outt))
        fns[f"sddmm/{be}"] = with_backend(be, lambda: kernels.sddmm(w, d, x, outs))
    if w.shape[0] * w.shape[1] * 4 <= 2**31:
        fns["sddmm/dense-then-sample"] = lambda: (d @ x.T)[coo.row, coo.col]
    return fns


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    torch_version = None
    for n in args.sizes:
        w = fixed_fan_in(n, n, 32, rng, "float32")
        w = w.__class__((w.data, w.indices.astype(np.int32), w.indptr.astype(np.int32)),
                        shape=w.shape)
        x = rng.standard_normal((n, args.batch)).astype(np.float32)
        d = rng.standard_normal((n, args.batch)).astype(np.float32)
        b = np.zeros(n, np.float32)
        out, outt, outs = (np.empty((n, args.batch), np.float32),
                           np.empty((n, args.batch), np.float32), np.empty(w.nnz, np.float32))
        fns = candidates(w, x, d, b, out, outt, outs)
        t = torch_ops(w, x, d)
        if t:
            ops, torch_version = t
            for k, fn in ops.items():
                fns[f"{k}/torch"] = fn
        secs = interleaved(fns, args.repeats)
        flop = 2 * w.nnz * args.batch
        for kernel in ("spmm", "spmm_t", "sddmm"):
            base = secs[f"{kernel}/scipy"]
            for name, s in secs.items():
                if name.startswith(kernel + "/"):
                    rows.append([str(n), kernel, name.split("/", 1)[1],
                                 f"{flop / s / 1e9:.1f}", f"{base / s:.2f}x"])
                    print(" | ".join(rows[-1]), flush=True)
    body = (f"Command: `python scripts/bench_kernels.py --sizes {' '.join(map(str, args.sizes))} "
            f"--batch {args.batch} --repeats {args.repeats}` (float32, one thread, 32 nonzeros "
            f"per row; torch {torch_version or 'not installed'}).\n\n"
            + table(["n", "kernel", "implementation", "GFLOP/s", "vs scipy"], rows))
    if not args.no_write:
        write_section("BENCH_KERNELS", "Local kernels", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
