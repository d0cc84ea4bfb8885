"""Compile spdnn's numba kernels into their on-disk cache, in two processes side by side.

    python scripts/compile_kernels.py

A fresh checkout has no cache: every process that finds none compiles the kernels it uses, and
the test suite starts dozens of processes at once (without the cache filled the serial tests
took longer than this step and they take together). scripts/test.sh runs this first; the
kernels a later process needs are then loaded, not built.
"""

from __future__ import annotations  # noqa: I001 (spdnn before numpy: one BLAS thread)

import spdnn.cli.thread_pools  # noqa: F401  (one thread: set before numpy loads)

import subprocess
import sys
import time

import numpy as np

# Two halves of about equal compile time (the products of both value types take the most, then
# LSH, the encoding, the run of narrow layers, the compressors and the partitioner's passes).
# The halves run the parts they share in opposite orders: numba's cache index of a function is
# read, extended and rewritten by each process that adds a signature, so two processes
# compiling the same function at the same moment could each write an index without the
# other's signature (and that kernel was then compiled again by a test process: in CI,
# spmm_cols and sddmm_cols, one value type each, every run).
HALVES = {
    "float32": (lambda: _warm("products", np.float32), lambda: _warm("encoding", np.float32),
                lambda: _warm("layers", np.float32), lambda: _hashing(),
                lambda: _partitioner(), lambda: _activations(np.float32), lambda: _selection()),
    "float64": (lambda: _activations(np.float64), lambda: _lossy(), lambda: _lsh(),
                lambda: _update(np.float32), lambda: _update(np.float64),
                lambda: _warm("layers", np.float64), lambda: _warm("encoding", np.float64),
                lambda: _warm("products", np.float64)),
}


def _warm(module: str, dtype: type) -> None:
    from importlib import import_module

    import_module(f"spdnn.kernels.{module}").warm_up((dtype,))


def _selection() -> None:
    """RigL's growth: each row's largest scores (spdnn.kernels.selection), both value types."""
    from spdnn.kernels import selection

    selection.warm_up()


def _update(dtype: type) -> None:
    """The SGD update's kernels, which run on arrays of PARALLEL_MIN values or more (a job that
    compiles them itself holds LLVM's compiler state above its prediction): the signatures a
    training job and a sampled layer load (spdnn.optim.load_kernels)."""
    from spdnn.kernels.update import PARALLEL
    from spdnn.optim import load_kernels

    load_kernels(("sgd",), (dtype,), rows=True, parallel=PARALLEL)


def _partitioner() -> None:
    """spdnn-partition's passes over the pins, through small partitions: the sweep's
    (partition/_multilevel_kernels.py; on groups of identical rows, partition/groups.py) and the
    hypergraph method's (partition/_kernels.py), with the plan's statistics
    (spdnn/model/_plan_counts.py): their arrays are the types a real one passes."""
    import spdnn
    from partition import partition

    net = spdnn.random_network([64, 64, 64, 8], fan_in=4, seed=0)
    partition(net, parts=2)
    partition(net, parts=2, method="hypergraph")
    partition(spdnn.radixnet(1024, 2, seed=0), parts=2)


def _activations(dtype: type) -> None:
    """The activations other than ReLU (spdnn.kernels._numba_activations)."""
    from spdnn.backends import active

    if (half := active().compiled("activations")) is not None:
        half.warm_up((dtype,))


def _lossy() -> None:
    from spdnn.lossy import compress, hylo

    compress.warm_up()
    hylo.warm_up()


def _hashing() -> None:
    """LSH's hashing kernels (both offset widths), apart from its sampled products: one half
    that compiled both took nearly twice as long as the other."""
    from spdnn.backends import active

    if (half := active().compiled("hashing")) is not None:
        half.warm_up()


def _lsh() -> None:
    from spdnn.backends import active

    if (half := active().compiled("lsh")) is not None:
        half.warm_up(hashing=False)
        # int64 keys (codes beyond 2**31: SimHash with K > 30), which jobs compile when first
        # used, and tests/test_lsh.py's retrieval test uses
        keys = np.zeros((1, 1), np.int64)
        half.retrieve(keys, keys, np.zeros((1, 1), np.int32), np.zeros((1, 2), np.int32),
                            0, np.array([0, 1]), np.array([0]), np.ones(1), 1)


def main() -> int:
    if len(sys.argv) == 2 and sys.argv[1] in HALVES:
        for compile_part in HALVES[sys.argv[1]]:
            compile_part()
        return 0
    if len(sys.argv) != 1:
        print(f"usage: python {sys.argv[0]}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    halves = [subprocess.Popen([sys.executable, __file__, half]) for half in HALVES]
    codes = [p.wait() for p in halves]
    if any(codes):
        return next(code for code in codes if code)  # a half killed by a signal: < 0
    halves_done = time.perf_counter()
    # Every part once more, in this process alone: each kernel loads from the cache (about
    # 2 s for all), and one whose signature a concurrent write lost is compiled here.
    for half in HALVES.values():
        for compile_part in half:
            compile_part()
    print(f"kernels compiled (or loaded from the cache) in {halves_done - t0:.0f} s, checked "
          f"in {time.perf_counter() - halves_done:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
