"""PyTorch DistributedDataParallel training steps of a spdnn network: what a user would pick
instead of a partition (benchmarks only; torch is not a dependency of spdnn).

    mpiexec -n 2 python scripts/bench/torch_ddp.py --net NET.npz --batch 32 --steps 10 \
        [--master 127.0.0.1] [--iface lo]

The network in the ``embedding_bag`` formulation of scripts/bench/torch_baselines.py (fbgemm's
sparse x dense kernel; sampled_addmm for the weight gradients), its parameters in a Module
wrapped by ``torch.nn.parallel.DistributedDataParallel`` over the gloo backend (TCP): every step
sums every stored weight's gradient over the ranks, bucketed and overlapped with the backward pass
as DDP does. ``--batch`` is the global batch (each rank takes its share). Rank and size come from
the MPI launcher's environment (PMI_RANK / OMPI_COMM_WORLD_RANK), so that the same launcher, and
``spdnn emulate``, start it. Rank 0 prints ``{"median": s}``: the median over ``steps`` steps
(after 2 warm-up steps) of the slowest rank's step, one thread per rank.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _env(*names: str) -> int:
    for n in names:
        if n in os.environ:
            return int(os.environ[n])
    raise SystemExit(f"none of {names} set: start this under an MPI launcher")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--net", required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--master", default="127.0.0.1", help="rank 0's address")
    ap.add_argument("--iface", default="lo", help="the interface gloo uses")
    ap.add_argument("--port", type=int, default=29517)
    args = ap.parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", args.iface)
    import torch
    import torch.distributed as dist
    from torch_baselines import TorchNet

    from spdnn.io.bundle import load_network

    torch.set_num_threads(1)
    rank = _env("PMI_RANK", "OMPI_COMM_WORLD_RANK")
    size = _env("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}:{args.port}", rank=rank,
                            world_size=size)
    net = load_network(args.net, dtype="float32")
    inner = TorchNet(net, "embedding_bag", lr=0.001, momentum=0.9, grad_only=True)

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.params = torch.nn.ParameterList(inner.values + inner.biases)

        def forward(self, x, y):  # noqa: ANN001, ANN202
            return inner.loss(x, y)

    model = torch.nn.parallel.DistributedDataParallel(Model())
    opt = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
    rng = np.random.default_rng(rank)
    local = args.batch // size + (rank < args.batch % size)
    x = rng.standard_normal((local, net.sizes[0])).astype(np.float32)
    y = rng.integers(0, net.sizes[-1], local)
    slowest = torch.zeros(1, dtype=torch.float64)

    def step() -> float:
        dist.barrier()
        t0 = time.perf_counter()
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        slowest[0] = time.perf_counter() - t0
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        return float(slowest[0])

    for _ in range(2):
        step()
    times = [step() for _ in range(args.steps)]
    if rank == 0:
        print(json.dumps({"median": statistics.median(times)}), flush=True)
    dist.barrier()
    # gloo's threads sometimes abort the process at teardown ("terminate called without an
    # active exception", 2 runs in 6 here): leave without it, the work being done.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
