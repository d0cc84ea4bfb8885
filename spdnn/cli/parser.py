"""The ``spdnn`` command line: the parser and ``main`` (the commands are in commands.py).

Errors in the user's input print one line (``spdnn: error: FILE[:LINE]: problem``) and exit 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from spdnn.cli._challenge import add_parser as add_challenge_images
from spdnn.cli._emulate import add_parser as add_emulate
from spdnn.cli._examples import EXAMPLES, EXAMPLES_BY_COMMAND
from spdnn.cli._lossy import add_lossy
from spdnn.cli._xc import add_parser as add_xc_data
from spdnn.cli.options import (
    OneLineParser,
    betas,
    cap,
    fan_ins,
    layer_sizes,
    layers,
    memory_limit,
    non_negative,
    positive_int,
    rates,
    replica_count,
    report,
    seed,
    step_or_fraction,
)
from spdnn.comm.threads import default_threads, reserve_threads
from spdnn.errors import SpdnnError, options_named_by_flag, say_error
from spdnn.model.choices import DTYPE_NAMES, EXCHANGES
from spdnn.model.records import TrainOptions

# The defaults of ``spdnn train``'s options are the record's (written once, there).
_TRAIN = TrainOptions()


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Examples kept as written; every option that has a default shows it after its help."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default not in (None, False, argparse.SUPPRESS) and action.option_strings \
                and "%(default)" not in text:
            text += " (default: %(default)s)"
        return text


DTYPES = list(DTYPE_NAMES)


def _command(sub, name: str, help: str, description: str,  # noqa: ANN001, A002
             examples: str | None = None) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=help, description=description,
                          epilog=EXAMPLES_BY_COMMAND.get(examples or name),
                          formatter_class=_Formatter)


def _run_options(p: argparse.ArgumentParser, replicas: str, auto: bool = False) -> None:
    """Options of the commands that run on P ranks: the network, plan, grid and dtype."""
    p.add_argument("--network", required=True, help="network bundle (.npz)")
    if auto:
        p.add_argument("--plan", action="append",
                       help="plan from spdnn-partition (required with more ranks than "
                            "replicas); with --replicas auto, once per candidate")
        p.add_argument("--replicas", type=replica_count, default=1, metavar="R|auto",
                       help=f"replicas of the partitioned network: {replicas}; auto: the grid "
                            "the cost model predicts fastest for this P, among the --plan "
                            "candidates and pure data parallelism (needs --calibration)")
        p.add_argument("--calibration", help="from spdnn calibrate, for --replicas auto")
        p.add_argument("--cluster", help="cluster description for --replicas auto "
                                         "(docs/cost-model.md)")
    else:
        p.add_argument("--plan", help="plan from spdnn-partition (required with more ranks "
                                      "than replicas)")
        p.add_argument("--replicas", type=positive_int, default=1, metavar="R",
                       help=f"replicas of the partitioned network: {replicas}")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="arithmetic type")
    p.add_argument("--exchange", choices=EXCHANGES, default="auto",
                   help="how cut rows travel (the results are the same): auto (default), per "
                        "message the smaller of dense rows and a sparse form (forward: the "
                        "values that are neither 0 nor at the cap, with bitmaps; backward: only "
                        "the entries with a nonzero activation slope); dense; or sparse "
                        "(docs/sparse-exchange.md)")
    p.add_argument("--threads", type=positive_int, default=default_threads(), metavar="N",
                   help="threads of each rank's sparse kernels (default: SPDNN_THREADS, else "
                        "1); keep ranks per node x N <= cores")
    p.add_argument("--memory-limit", type=memory_limit, default=None, metavar="BYTES",
                   help="bytes a rank may hold, with K, M or G (e.g. 4G); a job whose "
                        "predicted peak passes it is refused before it loads (default: the "
                        "cgroup's limit, else the node's memory / its ranks; none: no limit)")
    p.add_argument("--dry-run", action="store_true",
                   help="print each rank's predicted peak memory and stop before loading")
    p.add_argument("--comm-timeout", type=non_negative, default=600.0, metavar="SECONDS",
                   help="end the job when one wait for other ranks lasts longer (a stalled "
                        "peer, a lost link, a dead rank); 0: wait forever")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="spdnn",
        description="Sparse DNN training and inference, distributed over MPI ranks by a plan.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_convert, _add_generate, _add_train, _add_infer, _add_calibrate):
        add(sub)
    add_emulate(sub, _Formatter)
    _add_plot(sub)
    return parser


def _add_convert(sub) -> None:  # noqa: ANN001 (argparse's subparsers action)
    """``spdnn convert``."""
    conv = _command(sub, "convert", "convert between network formats",
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
    conv.add_argument("--cap", type=cap, default=None, help="ReLU cap (none: uncapped)")
    conv.add_argument("--output-activation", choices=["linear", "relu"], default=None,
                      help="last layer's activation (none: relu for graphchallenge, linear "
                           "otherwise)")
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
    conv.add_argument("--dtype", choices=DTYPES, default="float32", help="value type")


def _add_generate(sub) -> None:  # noqa: ANN001 (argparse's subparsers action)
    """``spdnn generate KIND``, one parser per kind."""
    gen = sub.add_parser("generate", help="generate a sparse network",
                         description="Generate a sparse network bundle: `spdnn generate KIND "
                                     "--help` for each kind.", formatter_class=_Formatter)
    kinds = gen.add_subparsers(dest="kind", required=True, metavar="KIND")
    rx = _command(kinds, "radixnet", "RadiX-Net (the Graph Challenge structure)",
                  "RadiX-Net layers: kron(ones(16,16), I + S^p)/16 for p = 1, 2, 4, ..., with "
                  "random row and column permutations from layer 7 on (seeded).")
    rx.add_argument("--neurons", type=int, default=1024, help="1024, 4096, 16384 or 65536")
    rx.add_argument("--layers", type=positive_int, default=120, help="depth")
    rx.add_argument("--bias", type=float, default=-0.3, help="bias of every neuron")
    rx.add_argument("--cap", type=cap, default=32.0, help="ReLU cap")
    rnd = _command(kinds, "random", "random fixed fan-in layers",
                   "Layers with a fixed number of random inputs per neuron (seeded).")
    rnd.add_argument("--sizes", type=layer_sizes, required=True,
                     help="layer sizes n_0,n_1,...,n_L")
    rnd.add_argument("--fan-in", type=fan_ins, default=32, metavar="F[,F...]",
                     help="nonzeros per row: one count, or one per layer (e.g. 4096,128)")
    rnd.add_argument("--cap", type=cap, default=None, help="ReLU cap (none: uncapped)")
    loc = _command(kinds, "local", "locally connected layers over an image",
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
    pr = _command(kinds, "prune", "magnitude-pruned dense weights",
                  "Keep the largest weights of dense layers (and one per row).")
    pr.add_argument("--weights", required=True,
                    help="dense weights: .npz with W1..WL (n_k x n_{k-1}), optional b1..bL, or "
                         "one .npy matrix")
    pr.add_argument("--density", type=float, default=0.05, help="fraction of weights kept")
    add_xc_data(kinds, _Formatter)
    add_challenge_images(kinds, _Formatter)
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


def _add_train(sub) -> None:  # noqa: ANN001 (argparse's subparsers action)
    """``spdnn train``."""
    tr = _command(sub, "train", "train with minibatch SGD, Adam or AdamW",
                  "Minibatch training with torch.optim's semantics (SGD, Adam, AdamW), on one "
                  "process or on P ranks under mpirun (P = replicas x the plan's parts).")
    _run_options(tr, "mpirun -n R x the plan's parts; the ranks of one replica are "
                     "consecutive", auto=True)
    tr.add_argument("--data", default="digits",
                    help="digits | npz:FILE | mnist:DIR | xc:DIR (multi-label)")
    tr.add_argument("--epochs", type=positive_int, default=_TRAIN.epochs,
                    help="epochs in all (a resumed run counts the ones already done)")
    tr.add_argument("--batch-size", type=positive_int, default=_TRAIN.batch_size,
                    help="samples per optimizer step")
    _optimizer_options(tr)
    tr.add_argument("--loss", choices=["cross_entropy", "mse"], default=_TRAIN.loss,
                    help="softmax cross-entropy (mean over the batch) or mean squared error")
    tr.add_argument("--seed", type=seed, default=_TRAIN.seed,
                    help="seed of the sample shuffling and of dropout's masks")
    tr.add_argument("--no-shuffle", action="store_true", help="batches in file order")
    tr.add_argument("--max-steps", type=positive_int,
                    help="stop after this many SGD steps in all")
    tr.add_argument("--save", help="write the trained network as one bundle")
    tr.add_argument("--checkpoint-dir", help="write checkpoints here (every N steps, and at the "
                                             "end)")
    tr.add_argument("--checkpoint-every", type=positive_int, help="steps between checkpoints")
    tr.add_argument("--resume", help="continue from this checkpoint directory (any P and plan)")
    tr.add_argument("--resume-with-changes", action="store_true",
                    help="resume even though --batch-size, --seed, --no-shuffle, --dtype, "
                         "the optimizer or its settings differ from the run that wrote the "
                         "checkpoint (the result then differs from an uninterrupted run; "
                         "another optimizer starts from fresh state)")
    tr.add_argument("--metrics-out", help="write per-epoch metrics, traffic and timing as JSON")
    add_lossy(tr)


def _optimizer_options(tr: argparse.ArgumentParser) -> None:
    """``--optimizer`` and its settings; each left out takes the chosen optimizer's default
    (spdnn.model.optim, where they are checked)."""
    from dataclasses import fields

    from spdnn.model.optim import OPTIMIZERS

    def defaults(name: str) -> str:
        found = []
        for opt, cls in OPTIMIZERS.items():
            for f in fields(cls.Config):
                if f.name == name:
                    value = ",".join(map(str, f.default)) if isinstance(f.default, tuple) \
                        else f.default
                    found.append(f"{opt} {value}")
        return "default: " + ", ".join(found)

    tr.add_argument("--optimizer", choices=list(OPTIMIZERS), default="sgd",
                    help="torch.optim's optimizer (one parameter group)")
    tr.add_argument("--lr", type=float, help=f"learning rate ({defaults('lr')})")
    tr.add_argument("--momentum", type=float,
                    help=f"SGD's momentum, no dampening ({defaults('momentum')})")
    tr.add_argument("--nesterov", action="store_const", const=True,
                    help="SGD: Nesterov momentum")
    tr.add_argument("--betas", type=betas, metavar="B1,B2",
                    help=f"Adam's and AdamW's moment decays ({defaults('betas')})")
    tr.add_argument("--eps", type=float,
                    help=f"Adam's and AdamW's term added to sqrt(v) ({defaults('eps')})")
    tr.add_argument("--weight-decay", type=float,
                    help="weight decay on every parameter, biases included; AdamW's decoupled "
                         f"({defaults('weight_decay')})")
    from spdnn.model.schedule import SCHEDULES
    from spdnn.model.sparsity import MODES, SCOPES

    tr.add_argument("--lr-schedule", choices=SCHEDULES, default=_TRAIN.lr_schedule,
                    help="the rate over the job's planned steps T (--epochs x steps per "
                         "epoch), stepped once per optimizer step; docs/recipes.md")
    tr.add_argument("--warmup-steps", type=seed, default=_TRAIN.warmup_steps, metavar="W",
                    help="multiply the rate by (t + 1) / W for the first W steps")
    tr.add_argument("--min-lr", type=float, default=_TRAIN.min_lr,
                    help="cosine: the rate it decays to at step T")
    tr.add_argument("--step-size", type=positive_int,
                    help="step: multiply the rate by --gamma every this many steps")
    tr.add_argument("--gamma", type=float, default=_TRAIN.gamma, help="step: the factor")
    tr.add_argument("--dropout", type=rates, metavar="P[,P...]",
                    help="inverted dropout on the hidden layers' outputs in training: one "
                         "rate, or one per hidden layer (masks that do not depend on P)")
    tr.add_argument("--validation-split", type=float, metavar="F",
                    help="hold out the last F of the training samples (file order, before "
                         "shuffling) and score them each epoch; the test split is then scored "
                         "once, after training")
    tr.add_argument("--save-best", metavar="FILE",
                    help="write the network of the epoch with the lowest validation loss")
    tr.add_argument("--early-stopping", type=positive_int, metavar="N",
                    help="end training after N epochs without a lower validation loss")
    tr.add_argument("--clip-grad-norm", type=float, metavar="X",
                    help="scale the gradients to an L2 norm of at most X over every parameter "
                         "and rank, as torch.nn.utils.clip_grad_norm_")
    tr.add_argument("--sparse-update", choices=MODES,
                    help="dynamic sparsity (docs/dynamic-sparsity.md): every --update-every "
                         "steps each row drops its smallest |w| and grows as many, at random "
                         "(set) or where |dL/dw| is largest (rigl)")
    tr.add_argument("--update-every", type=int, default=_TRAIN.update_every, metavar="N",
                    help="steps between topology updates")
    tr.add_argument("--drop-fraction", type=float, default=_TRAIN.drop_fraction,
                    metavar="F", help="the fraction dropped at the first update, decayed by "
                                      "a cosine to zero at --update-until")
    tr.add_argument("--update-until", type=step_or_fraction, default=_TRAIN.update_until,
                    metavar="T", help="the step at which updates end: a step, or a fraction "
                                      "of the job's planned steps")
    tr.add_argument("--grow-locality", type=float, default=_TRAIN.grow_locality, metavar="W",
                    help="growth that knows the plan: a column the row's rank already holds "
                         "(owns or receives) is W times as likely (set) or scores W times "
                         "higher (rigl)")
    tr.add_argument("--replan", default=_TRAIN.replan, metavar="never|auto|every:K",
                    help="after an update, refine the plan for the current topology and move "
                         "the rows that change owner: every K updates, or when the rows saved "
                         "over the steps to the next update outweigh the bytes moved (auto)")
    tr.add_argument("--save-plan", metavar="FILE",
                    help="write the plan in force at the end, with its rows per step for the "
                         "final topology (for spdnn infer on the network --save writes)")
    tr.add_argument("--update-scope", choices=SCOPES, default=_TRAIN.update_scope,
                    help="row: every row drops and grows the same count (each neuron keeps "
                         "its fan-in); layer: the whole layer is ranked at once")


def _add_infer(sub) -> None:  # noqa: ANN001 (argparse's subparsers action)
    """``spdnn infer``."""
    inf = _command(sub, "infer", "run inference",
                   "Classification accuracy on a data set, or Graph Challenge inference on "
                   "input images (TSV or Matrix Market), on one process or on P ranks.")
    _run_options(inf, "each takes a share of the inputs")
    inf.add_argument("--inputs", required=True,
                     help="digits | npz:FILE | mnist:DIR | xc:DIR (test split), or an images "
                          ".tsv/.mtx/.npz (docs/formats.md)")
    inf.add_argument("--categories-out", help="Graph Challenge: write categories (1-based)")
    inf.add_argument("--truth", help="Graph Challenge: compare with an official category file")
    inf.add_argument("--metrics-out", help="write metrics as JSON")
    inf.add_argument("--lsh", metavar="LAYER:K:L[:dwta|simhash]",
                     help="multi-label data: P@k among the output neurons that LSH tables "
                          "built from the network's weights retrieve (default: every neuron); "
                          "on a hidden layer, only its retrieved neurons are computed")
    inf.add_argument("--stream-layers", type=positive_int, default=None, metavar="N",
                     help="read the weights in blocks of at most N layers, every input "
                          "passing through a block before the next is read (the same results; "
                          "default: only when the weights pass --memory-limit; "
                          "docs/memory.md)")


def _add_calibrate(sub) -> None:  # noqa: ANN001 (argparse's subparsers action)
    """``spdnn calibrate``."""
    cal = _command(sub, "calibrate", "measure this machine for the cost model",
                   "Measure, on every rank at once, the time per nonzero x sample of the local "
                   "products over a grid of batch sizes, input rows and reuse, from cold and "
                   "warm caches, the runtime's fixed costs per layer, step and message, and (on "
                   "2 or more ranks) the latency and bandwidth between ranks 0 and 1 and of the "
                   "all-reduce. Run it with as many ranks as a node will run; it takes about "
                   "two minutes (--quick: about a third of that). The file feeds "
                   "spdnn-partition model and spdnn train --replicas auto.")
    cal.add_argument("-o", "--output", required=True, help="calibration to write (.json)")
    cal.add_argument("--dtype", choices=DTYPES + ["both"], default="both",
                     help="kernel tables to measure")
    cal.add_argument("--quick", action="store_true",
                     help="a coarse grid, one call a cold cell and one round of reference "
                          "steps: to try the cost model out; predictions from it carry more "
                          "error")


def _add_plot(sub) -> None:  # noqa: ANN001 (argparse's subparsers action)
    """``spdnn plot``."""
    pl = _command(sub, "plot", "plot a training run",
                  "Loss, train and test accuracy and samples/s per epoch of a run, from its "
                  "--metrics-out file (needs matplotlib: pip install matplotlib).")
    pl.add_argument("metrics", help="JSON from spdnn train --metrics-out")
    pl.add_argument("-o", "--output", required=True, help="image to write: .png, .pdf or .svg")


def main(argv: Sequence[str] | None = None, *, finalize_mpi: bool = False) -> int:
    """``spdnn ARGV``; ``finalize_mpi``: a distributed command ends MPI itself, watched by
    ``--comm-timeout`` (the console script, whose process then exits; in-process callers go on
    using MPI)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.finalize_mpi = finalize_mpi
    if getattr(args, "threads", None):
        reserve_threads(args.threads)  # before anything loads numba
    from spdnn.cli.stdout import guarded_stdout

    with guarded_stdout("spdnn") as failed:
        code = _run(args)
    return failed[0] if failed and code == 0 else code


def _run(args: argparse.Namespace) -> int:
    with options_named_by_flag():
        try:
            from spdnn.cli.commands import COMMANDS

            return COMMANDS[args.command](args) or 0
        except SpdnnError as exc:
            report("spdnn", str(exc))
            return exc.exit_code
        except KeyboardInterrupt:
            from spdnn.comm.interrupt import interrupted

            # One line from rank 0 (the launcher interrupts every rank), and out at once: a
            # normal exit would wait in MPI_Finalize for peers that are gone.
            interrupted("spdnn")
            return 130
        except MemoryError:
            say_error("spdnn", "out of memory")
            return 1


if __name__ == "__main__":
    sys.exit(main())

