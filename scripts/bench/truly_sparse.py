"""The Truly Sparse code's SET-MLP (set_mlp_sequential.py) on the MNIST spdnn reads, for
bench_sparsity.py --peer: its own SET_MLP class, driven with the settings of its __main__.

    python scripts/bench/truly_sparse.py CHECKOUT MNIST_DIR EPOCHS OUT.json

CHECKOUT is a checkout of github.com/SelimaC/large-scale-sparse-neural-networks. Its data
loader imports keras and its monitor psutil; neither is used here (the data comes from spdnn's
MNIST reader, the same x / 255 spdnn trains on, monitoring off), so both modules are stood in
for by empty ones before its module is imported. One numba thread (NUMBA_NUM_THREADS=1, set by
the caller), as every spdnn rank has. Its evolution calls np.in1d, which numpy 2.4 removed:
np.isin of the flattened first argument (in1d's definition) stands in for it.
"""

from __future__ import annotations  # noqa: I001 (spdnn before numpy: one BLAS thread)

import spdnn.cli.thread_pools  # noqa: F401  (every pool one thread, as the spdnn command has)

import argparse
import json
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

from spdnn.io.mnist import load_mnist


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkout", type=Path, help="a checkout of the Truly Sparse code")
    ap.add_argument("mnist", help="the directory of MNIST's four idx files")
    ap.add_argument("epochs", type=int)
    ap.add_argument("out", help="the JSON file to write")
    args = ap.parse_args()
    checkout, mnist, epochs, out = args.checkout, args.mnist, args.epochs, args.out
    for name in ("utils.load_data", "wasap_sgd.train.monitor"):
        stub = types.ModuleType(name)
        stub.load_fashion_mnist_data = stub.Monitor = None
        sys.modules[name] = stub
    if not hasattr(np, "in1d"):
        np.in1d = lambda a, b, *args, **kwargs: np.isin(np.ravel(a), b, *args, **kwargs)
    sys.path.insert(0, str(checkout))
    import set_mlp_sequential as peer  # noqa: PLC0415  (from the checkout, after the stubs)

    data = load_mnist(mnist, dtype="float32")
    onehot = np.eye(10, dtype=np.float32)
    y_train, y_test = onehot[data.y_train], onehot[data.y_test]
    np.random.seed(0)
    hidden = (peer.AlternatedLeftReLU(-0.6), peer.AlternatedLeftReLU(0.6),
              peer.AlternatedLeftReLU(-0.6), peer.Softmax)
    net = peer.SET_MLP((784, 1000, 1000, 1000, 10), hidden, epsilon=20)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        net.fit(data.x_train, y_train, data.x_test, y_test, loss=peer.CrossEntropy,
                epochs=epochs, batch_size=128, learning_rate=0.01, momentum=0.9,
                weight_decay=0.0002, zeta=0.3, dropoutrate=0.3, testing=False,
                save_filename=str(Path(tmp) / "run"), monitor=False)
        seconds = time.perf_counter() - start
    accuracy, _ = net.predict(data.x_test, y_test, batch_size=100)
    Path(out).write_text(json.dumps({"seconds": seconds, "epochs": epochs,
                                     "evolution_seconds": net.evolution_time,
                                     "test_accuracy": float(accuracy)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
