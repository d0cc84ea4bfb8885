"""``spdnn convert``'s flags."""

from __future__ import annotations

import argparse

from spdnn.cli.options import cap, layers
from spdnn.cli.parsers.common import command
from spdnn.model.choices import VALUE_TYPES


def add_convert(sub) -> None:  # noqa: ANN001 (argparse's subparsers action)
    """``spdnn convert``."""
    conv = command(sub, "convert", "convert between network formats",
                    "Convert a network to or from the spdnn bundle.")
    conv.add_argument("source", choices=["graphchallenge", "mtx", "network", "safetensors"],
                      help="input format: a Graph Challenge directory, Matrix Market files "
                           "(one per layer, rows = outputs), an spdnn bundle, or a PyTorch "
                           ".safetensors file of linear layers (NAME.weight [out, in], "
                           "NAME.bias; the sparsity from NAME.weight_mask as torch's pruning "
                           "stores it, else the weight's zeros)")
    conv.add_argument("inputs", nargs="+", help="directory or files")
    conv.add_argument("-o", "--output", required=True,
                      help="bundle .npz, a directory with --to graphchallenge|mtx, or a "
                           ".safetensors file")
    conv.add_argument("--to", choices=["network", "graphchallenge", "mtx", "safetensors"],
                      default="network",
                      help="output format; safetensors writes dense NAME.weight and NAME.bias "
                           "(or NAME.weight_orig and NAME.weight_mask for a network read from a "
                           "pruned model) for model.load_state_dict")
    conv.add_argument("--bias", type=float, default=0.0, help="bias of every neuron")
    conv.add_argument("--cap", type=cap, default=argparse.SUPPRESS,
                      help="ReLU cap, or none (default: none; safetensors: the one its "
                           "metadata names, as spdnn's export writes it, else none)")
    conv.add_argument("--output-activation", choices=["linear", "relu"], default=None,
                      help="last layer's activation (default: relu for graphchallenge; for "
                           "safetensors the one its metadata names, else linear; linear for "
                           "mtx)")
    conv.add_argument("--plain", action="store_true",
                      help="--to safetensors: dense NAME.weight, which a model without pruning "
                           "loads (default: NAME.weight_orig and NAME.weight_mask for a network "
                           "read from a pruned model)")
    conv.add_argument("--activations", type=lambda t: t.split(","), metavar="A,B,...",
                      help="safetensors: what the hidden layers compute, one per layer but the "
                           "last, or one for all (required unless the file's metadata says, as "
                           "spdnn's export writes it): relu (capped with --cap), leaky_relu[:S], "
                           "tanh, sigmoid, gelu, gelu_tanh, identity")
    conv.add_argument("--layers", type=layers, metavar="L|NAMES",
                      help="read only the first L layers; for safetensors, the layer names in "
                           "order (fc1,fc2,fc3; default: every NAME.weight in natural order, "
                           "and on output the names the network was read with, else fc1, "
                           "fc2, ...)")
    conv.add_argument("--dtype", choices=VALUE_TYPES, default=None,
                      help="value type (default: the one the input declares: a bundle's, "
                           "safetensors' F64 as float64, BF16 (every tensor) as bfloat16, "
                           "F32, F16 and a mix as float32; required for graphchallenge and "
                           "mtx, whose text declares none). bfloat16 rounds the values and "
                           "stores 16 bits (a bundle, or safetensors' BF16)")
