"""PyTorch's full-softmax step of an extreme-classification network, for
scripts/bench/bench_slide.py and bench_xc.py (torch is not a dependency of spdnn; run with a
Python that has torch and sees this checkout, e.g. ./.venv-torch).

    python scripts/bench/torch_xc.py NETWORK.npz XC_DIR [--batch-size 64] [--lr 0.5] \
                               [--momentum 0.9] [--steps 30] [--loss gather]

The network features -> hidden -> labels of spdnn's bundle: the input layer as an
``nn.EmbeddingBag`` over the sample's nonzero features (fbgemm's kernel; weights = W1^T, its
gradient dense by default: ``--embedding-grad``), ReLU, the output layer as a dense
``F.linear`` (every label), softmax cross-entropy against the label mass split over the
sample's labels (SLIDE's loss, as spdnn trains it: by default log-sum-exp minus the label
logits, gathered; ``--loss dense-target`` multiplies a dense target block instead, a little
slower at many labels), ``torch.optim.SGD`` with momentum. One thread. Prints one JSON line: the
median seconds per step over ``--steps`` batches after 3 warm-up steps, in the order of the
file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    import torch
    import torch.nn.functional as F

    from spdnn.io.bundle import load_network
    from spdnn.io.xc import read_xc

    ap = argparse.ArgumentParser()
    ap.add_argument("network")
    ap.add_argument("data")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--embedding-grad", choices=("sparse", "dense"), default="dense",
                    help="the input layer's gradient: the whole matrix (default) or the rows "
                         "of the features present (sparse: with momentum, torch's buffer "
                         "becomes a sparse tensor that grows each step; at 50,000 labels its "
                         "step took 321, 378 and 499 ms over 20, 40 and 80 steps, the dense "
                         "form 259-266 ms at any count)")
    ap.add_argument("--loss", choices=("gather", "dense-target"), default="gather",
                    help="the loss's form (the same values): label logits gathered "
                         "(default, the faster) or a dense target block")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)  # as spdnn's softmax gradient (scripts/bench/bench_train.py)
    net = load_network(args.network)
    if net.n_layers != 2:
        raise SystemExit("expects features -> hidden -> labels")
    x, y = read_xc(Path(args.data) / "train.txt", "float32")
    w1, w2 = net.layers[0], net.layers[1]
    emb = torch.nn.EmbeddingBag.from_pretrained(
        torch.from_numpy(w1.weight.T.toarray().astype(np.float32)), mode="sum", freeze=False,
        sparse=args.embedding_grad == "sparse")
    b1 = torch.nn.Parameter(torch.from_numpy(w1.bias.astype(np.float32)))
    weight2 = torch.nn.Parameter(torch.from_numpy(w2.weight.toarray().astype(np.float32)))
    b2 = torch.nn.Parameter(torch.from_numpy(w2.bias.astype(np.float32)))
    opt = torch.optim.SGD([emb.weight, b1, weight2, b2], lr=args.lr, momentum=args.momentum)
    n_labels = net.sizes[-1]

    def step(start: int) -> float:
        rows = slice(start, start + args.batch_size)
        xb, yb = x[rows], y[rows]
        t0 = time.perf_counter()
        samples = torch.from_numpy(yb.samples())
        counts = np.maximum(yb.counts, 1)
        mass = torch.from_numpy((1.0 / counts)[yb.samples()].astype(np.float32))
        h = torch.relu(emb(torch.from_numpy(xb.indices.astype(np.int64)),
                           torch.from_numpy(xb.indptr[:-1].astype(np.int64)),
                           per_sample_weights=torch.from_numpy(xb.data)) + b1)
        logits = F.linear(h, weight2, b2)
        if args.loss == "dense-target":  # the textbook form: a (batch x labels) target
            target = torch.zeros(xb.shape[0], n_labels)
            target[samples, torch.from_numpy(yb.indices)] = mass
            loss = -(target * F.log_softmax(logits, dim=1)).sum(dim=1).mean()
        else:  # the same loss without the dense target: log-sum-exp minus the label logits
            picked = logits[samples, torch.from_numpy(yb.indices)] * mass
            has = torch.from_numpy((yb.counts > 0).astype(np.float32))
            loss = ((torch.logsumexp(logits, dim=1) * has).sum()
                    - picked.sum()) / xb.shape[0]
        opt.zero_grad()
        loss.backward()
        opt.step()
        return time.perf_counter() - t0

    starts = [(i * args.batch_size) % max(x.shape[0] - args.batch_size, 1)
              for i in range(args.steps + 3)]
    times = [step(s) for s in starts][3:]
    print(json.dumps({"seconds_per_step": statistics.median(times), "steps": len(times),
                      "batch_size": args.batch_size, "threads": torch.get_num_threads()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
