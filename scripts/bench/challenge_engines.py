"""The other engines of scripts/bench/bench_challenge.py, each run as its own process so that
its peak memory is its own: SuiteSparse:GraphBLAS through python-graphblas (pip install
'spdnn[bench]') and the plain scipy CSR loop. Both compute the challenge's recurrence on sparse
Y (samples x neurons): Y <- Y W; the bias on the stored entries; keep the positive ones; cap.

    python scripts/bench/challenge_engines.py graphblas|scipy --network NET.npz \\
        --inputs IMAGES.npz \\
        --threads T --out RESULT.json [--method tuned|reference]

GraphBLAS is used at its best as measured (1024 x 120, 60,000 inputs, one thread): the
Gustavson saxpy (its own choice; hash and plain saxpy were slower, dot far slower), and, for
the challenge's uniform bias, ``tuned``: select Y > -b first, then add b and cap (typed float32
scalars; an untyped Python scalar makes GraphBLAS add in float64 and changes the categories),
faster than ``reference``, the LAGraph form (bias as Y times diag(b) over the PLUS_PLUS
semiring, then select, then cap).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from spdnn.io.atomic import write_text  # noqa: E402
from spdnn.io.bundle import load_network  # noqa: E402
from spdnn.io.images import read_images  # noqa: E402


def _uniform_bias(net) -> float:  # noqa: ANN001
    biases = np.concatenate([layer.bias for layer in net.layers])
    if biases.max() > 0 or biases.min() != biases.max():
        raise SystemExit("the engines here take the challenge's uniform negative bias")
    return float(biases[0])


def run_graphblas(net, x: sp.csr_matrix, threads: int, method: str) -> tuple[float, np.ndarray]:  # noqa: ANN001
    import graphblas as gb
    from graphblas import Matrix, binary, select, semiring

    gb.ss.config["nthreads"] = threads
    weights = []
    for layer in net.layers:  # the challenge's W: W(i, j) = edge from neuron i to neuron j
        w = layer.weight.T.tocsr().astype(np.float32)
        weights.append(Matrix.from_csr(w.indptr, w.indices, w.data, nrows=w.shape[0],
                                       ncols=w.shape[1]))
    b = np.float32(_uniform_bias(net))
    bias = gb.Scalar.from_value(b, dtype="FP32")
    above = gb.Scalar.from_value(-b, dtype="FP32")
    zero = gb.Scalar.from_value(0, dtype="FP32")
    cap = gb.Scalar.from_value(net.cap if net.cap is not None else np.inf, dtype="FP32")
    n = net.sizes[0]
    diag = Matrix.from_coo(np.arange(n), np.arange(n), np.full(n, b, np.float32))
    y = Matrix.from_csr(x.indptr, x.indices, x.data.astype(np.float32), nrows=x.shape[0],
                        ncols=x.shape[1])
    t0 = time.perf_counter()
    for w in weights:
        y << y.mxm(w, semiring.plus_times)
        if method == "tuned":
            y << select.valuegt(y, above)
            y << y.apply(binary.plus, right=bias)
        else:
            y << y.mxm(diag, semiring.plus_plus)
            y << select.valuegt(y, zero)
        y << y.apply(binary.min, right=cap)
    seconds = time.perf_counter() - t0
    rows = np.unique(y.to_coo()[0])
    return seconds, rows


def run_scipy(net, x: sp.csr_matrix) -> tuple[float, np.ndarray, float]:  # noqa: ANN001
    b = np.float32(_uniform_bias(net))
    weights = [layer.weight.T.tocsr().astype(np.float32) for layer in net.layers]
    y = x.astype(np.float32).tocsr()
    live = 0
    t0 = time.perf_counter()
    for w in weights:
        y = (y @ w).tocsr()
        y.data += b
        np.maximum(y.data, 0, out=y.data)
        if net.cap is not None:
            np.minimum(y.data, np.float32(net.cap), out=y.data)
        y.eliminate_zeros()
        live += int(np.count_nonzero(np.diff(y.indptr)))
    seconds = time.perf_counter() - t0
    return seconds, np.flatnonzero(np.diff(y.indptr)), live / (x.shape[0] * len(weights))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("engine", choices=["graphblas", "scipy"])
    ap.add_argument("--network", required=True)
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--count", type=int, help="the first COUNT inputs (default: all)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--method", choices=["tuned", "reference"], default="tuned")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    net = load_network(args.network)
    x = read_images(args.inputs, net.sizes[0])
    if args.count:
        x = x[:args.count]
    result: dict[str, object] = {}
    if args.engine == "graphblas":
        seconds, rows = run_graphblas(net, x, args.threads, args.method)
    else:
        seconds, rows, live = run_scipy(net, x)
        result["live_fraction"] = live
    result |= {"seconds": seconds, "rate": x.shape[0] * net.nnz / seconds,
               "categories": (rows + 1).tolist()}
    write_text(args.out, json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
