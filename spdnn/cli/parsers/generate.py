"""``spdnn generate KIND``'s flags, one parser per kind."""

from __future__ import annotations

from spdnn.cli._challenge import add_parser as add_challenge_images
from spdnn.cli._xc import add_parser as add_xc_data
from spdnn.cli.options import (
    cap,
    fan_ins,
    layer_sizes,
    positive_int,
    seed,
)
from spdnn.cli.parsers.common import DTYPES, Formatter, command


def add_generate(sub) -> None:  # noqa: ANN001 (argparse's subparsers action)
    """``spdnn generate KIND``, one parser per kind."""
    gen = sub.add_parser("generate", help="generate a sparse network",
                         description="Generate a sparse network bundle: `spdnn generate KIND "
                                     "--help` for each kind.", formatter_class=Formatter)
    kinds = gen.add_subparsers(dest="kind", required=True, metavar="KIND")
    rx = command(kinds, "radixnet", "RadiX-Net (the Graph Challenge structure)",
                  "RadiX-Net layers: kron(ones(16,16), I + S^p)/16 for p = 1, 2, 4, ..., with "
                  "random row and column permutations from layer 7 on (seeded).")
    rx.add_argument("--neurons", type=int, default=1024, help="1024, 4096, 16384 or 65536")
    rx.add_argument("--layers", type=positive_int, default=120, help="depth")
    rx.add_argument("--bias", type=float, default=-0.3, help="bias of every neuron")
    rx.add_argument("--cap", type=cap, default=32.0, help="ReLU cap")
    rnd = command(kinds, "random", "random fixed fan-in layers",
                   "Layers with a fixed number of random inputs per neuron (seeded).")
    rnd.add_argument("--sizes", type=layer_sizes, required=True,
                     help="layer sizes n_0,n_1,...,n_L")
    rnd.add_argument("--fan-in", type=fan_ins, default=32, metavar="F[,F...]",
                     help="nonzeros per row: one count, or one per layer (e.g. 4096,128)")
    rnd.add_argument("--cap", type=cap, default=None, help="ReLU cap (none: uncapped)")
    loc = command(kinds, "local", "locally connected layers over an image",
                   "Locally connected layers (a convolution without weight sharing): each "
                   "neuron of a hidden grid reads a (2R+1) x (2R+1) window of the grid below; "
                   "the input grid is the image's pixels, row-major. Hidden neurons are "
                   "numbered in a seeded random order unless --no-shuffle, as a pruned "
                   "network's neurons have no spatial order (a block plan then cuts about half "
                   "the connections; the hypergraph plan finds the spatial split).")
    loc.add_argument("--image", default="8x8", metavar="HxW", help="input grid (the pixels)")
    loc.add_argument("--hidden", type=lambda t: t.split(","), default="16x16,16x16",
                     metavar="HxW,...", help="hidden grids, comma-separated")
    loc.add_argument("--radius", type=int, default=1, help="window radius R")
    loc.add_argument("--no-shuffle", action="store_true",
                     help="number hidden neurons row-major instead of in a random order")
    loc.add_argument("--cap", type=cap, default=None, help="ReLU cap (none: uncapped)")
    pr = command(kinds, "prune", "magnitude-pruned dense weights",
                  "Keep the largest weights of dense layers (and one per row).")
    pr.add_argument("--weights", required=True,
                    help="dense weights: .npz with W1..WL (n_k x n_{k-1}), optional b1..bL, or "
                         "one .npy matrix")
    pr.add_argument("--density", type=float, default=0.05, help="fraction of weights kept")
    add_xc_data(kinds, Formatter)
    add_challenge_images(kinds, Formatter)
    for kind in (rnd, loc, pr):
        kind.add_argument("--activations", metavar="A[,A...]", default="relu",
                          help="the hidden layers' activation, one for all or one per layer: "
                               "relu (capped by --cap), leaky_relu[:SLOPE], tanh, sigmoid, "
                               "gelu, gelu_tanh, identity")
    for kind in (rx, rnd, loc, pr):
        kind.add_argument("-o", "--output", required=True, help="network bundle to write (.npz)")
        kind.add_argument("--head", type=positive_int,
                          help="add a dense linear classifier with C outputs")
        kind.add_argument("--seed", type=seed, default=0, help="random seed")
        kind.add_argument("--dtype", choices=DTYPES, default="float32", help="value type")
