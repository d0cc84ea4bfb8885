"""The ``spdnn`` command: convert, generate, train, infer.

Errors in the user's input print one line (``spdnn: error: FILE[:LINE]: problem``) and exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from . import _threads  # noqa: F401  (pins BLAS threads before numpy loads)
from .errors import InputError, SpdnnError

EXAMPLES = """\
examples:
  spdnn generate random --sizes 64,256,256 --fan-in 16 --head 10 -o net.npz
  spdnn train --network net.npz --data digits --epochs 30 --batch-size 32 --lr 0.05 \\
      --momentum 0.9 --save trained.npz
  spdnn infer --network trained.npz --inputs digits
  spdnn convert graphchallenge ../shared/data/graphchallenge/neuron1024 --bias -0.3 --cap 32 \\
      -o gc1024.npz
  spdnn infer --network gc1024.npz \\
      --inputs ../shared/data/graphchallenge/sparse-images-1024_subset.mtx \\
      --categories-out categories.tsv
"""


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text}")
    return value


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"sizes must be integers: {text}") from None
    if len(sizes) < 2 or min(sizes) < 1:
        raise argparse.ArgumentTypeError("need at least two positive sizes, e.g. 784,1024,1024")
    return sizes


def _cap(text: str) -> float | None:
    return None if text.lower() in ("none", "null", "") else float(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spdnn",
        description="Sparse DNN training and inference, distributed over MPI ranks by a plan.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    # convert ----------------------------------------------------------------
    conv = sub.add_parser("convert", help="convert between network formats",
                          description="Convert a network to or from the spdnn bundle.",
                          epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    conv.add_argument("source", choices=["graphchallenge", "mtx", "network"],
                      help="input format: a Graph Challenge directory, Matrix Market files "
                           "(one per layer, rows = outputs), or an spdnn bundle")
    conv.add_argument("inputs", nargs="+", help="directory or files")
    conv.add_argument("-o", "--output", required=True,
                      help="bundle .npz, or a directory with --to graphchallenge|mtx")
    conv.add_argument("--to", choices=["network", "graphchallenge", "mtx"], default="network")
    conv.add_argument("--bias", type=float, default=0.0, help="bias of every neuron (default 0)")
    conv.add_argument("--cap", type=_cap, default=None, help="ReLU cap (default none)")
    conv.add_argument("--output-activation", choices=["linear", "relu"], default=None,
                      help="default: relu for graphchallenge, linear for mtx")
    conv.add_argument("--layers", type=_positive_int, help="read only the first L layers")
    conv.add_argument("--dtype", choices=["float32", "float64"], default="float32")

    # generate ---------------------------------------------------------------
    gen = sub.add_parser("generate", help="generate a sparse network",
                         description="Generate a sparse network bundle.")
    gen.add_argument("kind", choices=["radixnet", "random", "prune"])
    gen.add_argument("-o", "--output", required=True, help="network bundle to write (.npz)")
    gen.add_argument("--neurons", type=int, default=1024, help="radixnet: 1024/4096/16384/65536")
    gen.add_argument("--layers", type=_positive_int, default=120, help="radixnet: depth")
    gen.add_argument("--sizes", type=_sizes, help="random: layer sizes n_0,n_1,...,n_L")
    gen.add_argument("--fan-in", type=_positive_int, default=32, help="random: nonzeros per row")
    gen.add_argument("--weights", help="prune: dense weights (.npz with W1..WL, or .npy)")
    gen.add_argument("--density", type=float, default=0.05, help="prune: fraction kept")
    gen.add_argument("--head", type=_positive_int, help="add a dense classifier with C outputs")
    gen.add_argument("--bias", type=float, default=-0.3, help="radixnet bias (default -0.3)")
    gen.add_argument("--cap", type=_cap, default=None,
                     help="ReLU cap (radixnet default 32, otherwise none)")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--dtype", choices=["float32", "float64"], default="float32")

    # train ------------------------------------------------------------------
    tr = sub.add_parser("train", help="train with minibatch SGD",
                        description="Minibatch SGD (torch.optim.SGD semantics).",
                        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    tr.add_argument("--network", required=True, help="network bundle (.npz)")
    tr.add_argument("--plan", help="plan from spdnn-partition (required with more than 1 rank)")
    tr.add_argument("--data", default="digits", help="digits | npz:FILE | mnist:DIR")
    tr.add_argument("--epochs", type=_positive_int, default=10)
    tr.add_argument("--batch-size", type=_positive_int, default=64)
    tr.add_argument("--lr", type=float, default=0.05)
    tr.add_argument("--momentum", type=float, default=0.9)
    tr.add_argument("--weight-decay", type=float, default=0.0)
    tr.add_argument("--loss", choices=["cross_entropy", "mse"], default="cross_entropy")
    tr.add_argument("--seed", type=int, default=0, help="seed of the sample shuffling")
    tr.add_argument("--no-shuffle", action="store_true", help="batches in file order")
    tr.add_argument("--max-steps", type=_positive_int, help="stop after this many SGD steps")
    tr.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    tr.add_argument("--save", help="write the trained network as one bundle")
    tr.add_argument("--checkpoint-dir", help="write checkpoints here (every N steps, and at the "
                                             "end)")
    tr.add_argument("--checkpoint-every", type=_positive_int, help="steps between checkpoints")
    tr.add_argument("--resume", help="continue from this checkpoint directory (any P and plan)")
    tr.add_argument("--metrics-out", help="write per-epoch metrics as JSON")

    # infer ------------------------------------------------------------------
    inf = sub.add_parser("infer", help="run inference",
                         description="Classification accuracy on a data set, or Graph Challenge "
                                     "inference on input images (TSV or Matrix Market).",
                         epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    inf.add_argument("--network", required=True)
    inf.add_argument("--plan", help="plan from spdnn-partition (required with more than 1 rank)")
    inf.add_argument("--inputs", required=True,
                     help="digits | npz:FILE | mnist:DIR (test split), or an images .tsv/.mtx")
    inf.add_argument("--categories-out", help="Graph Challenge: write categories (1-based)")
    inf.add_argument("--truth", help="Graph Challenge: compare with an official category file")
    inf.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    inf.add_argument("--metrics-out", help="write metrics as JSON")
    return parser


def _write_json(path: str | None, payload: dict) -> None:
    if path:
        from .atomic import write_text

        write_text(path, json.dumps(payload, indent=2, sort_keys=True) + "\n")


def _check_output(path: str) -> None:
    parent = Path(path).parent
    if not parent.is_dir():
        raise InputError(path, f"output directory {parent} does not exist")


def cmd_convert(args: argparse.Namespace) -> None:
    from .bundle import load_network, save_network
    from .formats import read_graphchallenge, read_sparse_matrix, write_graphchallenge, write_mtx
    from .network import Layer, Network
    from .progress import Progress

    if args.source == "graphchallenge":
        if len(args.inputs) != 1:
            raise InputError(args.inputs[1], "graphchallenge takes one directory")
        bar = Progress("reading layers", args.layers or 1)
        net = read_graphchallenge(args.inputs[0], args.bias, args.cap, args.layers, args.dtype,
                                  progress=lambda k, n: (setattr(bar, "total", n),
                                                         bar.update(k)))
        bar.close()
        if args.output_activation:
            net = Network(net.layers, net.activation, net.cap, args.output_activation, net.extra)
    elif args.source == "mtx":
        import numpy as np

        layers = []
        for f in args.inputs[: args.layers]:
            w = read_sparse_matrix(f).astype(args.dtype)
            layers.append(Layer(w, np.full(w.shape[0], args.bias, dtype=args.dtype)))
        net = Network(tuple(layers), cap=args.cap,
                      output_activation=args.output_activation or "linear")
        net.validate(" ".join(args.inputs))
    else:
        net = load_network(args.inputs[0], args.dtype)
    if args.to == "network":
        _check_output(args.output)
        save_network(net, args.output)
    elif args.to == "graphchallenge":
        write_graphchallenge(net, args.output)
    else:
        Path(args.output).mkdir(parents=True, exist_ok=True)
        for k, layer in enumerate(net.layers, start=1):
            write_mtx(Path(args.output) / f"layer{k}.mtx", layer.weight,
                      f"spdnn layer {k}: rows = output neurons")
    print(f"wrote {args.output}: {net.n_layers} layers, sizes {_short(net.sizes)}, "
          f"{net.nnz:,} nonzeros")


def _short(sizes: Sequence[int]) -> str:
    if len(sizes) <= 6:
        return "x".join(map(str, sizes))
    return f"{sizes[0]}x...x{sizes[-1]} ({len(sizes) - 1} layers)"


def cmd_generate(args: argparse.Namespace) -> None:
    from . import generate
    from .bundle import save_network

    _check_output(args.output)
    try:
        if args.kind == "radixnet":
            cap = 32.0 if args.cap is None else args.cap
            net = generate.radixnet(args.neurons, args.layers, args.seed, args.bias, cap,
                                    args.dtype)
            if args.head:
                net = generate.add_head(net, args.head, args.seed)
        elif args.kind == "random":
            if not args.sizes:
                raise SpdnnError("generate random needs --sizes, e.g. --sizes 784,1024,1024")
            net = generate.random_network(args.sizes, args.fan_in, args.seed, args.head,
                                          args.cap, args.dtype)
        else:
            if not args.weights:
                raise SpdnnError("generate prune needs --weights FILE (.npz or .npy)")
            net = generate.prune_file(args.weights, args.density, args.seed, args.head,
                                      args.dtype)
    except ValueError as exc:
        raise SpdnnError(str(exc)) from None
    save_network(net, args.output)
    print(f"wrote {args.output}: {args.kind}, sizes {_short(net.sizes)}, {net.nnz:,} nonzeros, "
          f"fingerprint {net.fingerprint()}")


def _epoch_printer(rank: int):  # noqa: ANN202
    def report(r) -> None:  # noqa: ANN001
        if rank != 0:
            return
        test = f", test accuracy {r.test_accuracy:.4f}" if r.test_accuracy is not None else ""
        print(f"epoch {r.epoch:3d}: loss {r.loss:.4f}, train accuracy {r.train_accuracy:.4f}"
              f"{test}, {r.samples_per_second:,.0f} samples/s, {r.megabytes_sent:,.1f} MB "
              "exchanged", flush=True)
    return report


def cmd_train(args: argparse.Namespace) -> int:
    from .comm import run_collectively

    return run_collectively(lambda comm: _train(comm, args))


def _train(comm, args: argparse.Namespace) -> int:  # noqa: ANN001
    from .datasets import load_dataset
    from .kernels import backend as kernels_backend
    from .progress import Progress
    from .reference import SGDConfig
    from .runtime import (
        TrainConfig,
        accounting,
        format_accounting,
        format_timing,
        load_checkpoint,
        open_network,
        report_dict,
        save_trained,
        timing,
        train,
        write_json,
    )

    if args.checkpoint_every and not args.checkpoint_dir:
        raise SpdnnError("--checkpoint-every needs --checkpoint-dir")
    for out in (args.save, args.metrics_out):
        if out:
            comm.check(lambda out=out: _check_output(out))
    bundle, plan, dnet = open_network(comm, args.network, args.plan, args.dtype)
    data = comm.check(lambda: load_dataset(args.data, args.dtype))

    def check_data() -> None:
        if data.n_features != bundle.sizes[0]:
            raise InputError(args.data, f"data has {data.n_features} features but the "
                                        f"network's layer 0 has {bundle.sizes[0]} neurons")
        if data.n_classes > bundle.sizes[-1]:
            raise InputError(args.data, f"data has {data.n_classes} classes but the network "
                                        f"has {bundle.sizes[-1]} outputs")

    comm.check(check_data)
    position, momentum = None, None
    if args.resume:
        position, momentum = comm.check(lambda: load_checkpoint(comm, dnet, args.resume))
    cfg = TrainConfig(args.epochs, args.batch_size,
                      SGDConfig(args.lr, args.momentum, args.weight_decay), args.seed,
                      not args.no_shuffle, args.loss, args.max_steps, args.checkpoint_dir,
                      args.checkpoint_every)
    if comm.rank == 0:
        resumed = f", resumed at step {position.step}" if position else ""
        print(f"training {_short(bundle.sizes)} ({_nnz(bundle):,} weights) on {data.name} "
              f"with {comm.size} rank(s), plan "
              f"{plan.meta.get('method', '?')}: {len(data.x_train):,} samples, batch "
              f"{args.batch_size}, lr {args.lr}, momentum {args.momentum}, weight decay "
              f"{args.weight_decay}{resumed}", flush=True)
    bar = Progress("  steps", 1, enabled=comm.rank == 0, log_lines=False)

    def on_step(done: int, total: int) -> None:
        bar.total = total
        bar.update(done)
        if done == total:
            bar.close()

    reports = train(comm, dnet, data, cfg, position, momentum, _epoch_printer(comm.rank),
                    on_step)
    acc = accounting(comm, dnet, bundle)
    tm = timing(comm, dnet)
    if comm.rank == 0:
        print(format_accounting(acc), flush=True)
        print(format_timing(tm), flush=True)
    if args.save:
        save_trained(comm, dnet, args.save, {"trained_by": "spdnn train", "data": data.name})
        if comm.rank == 0:
            print(f"saved {args.save}")
    write_json(comm, args.metrics_out, {"ranks": comm.size, "epochs": [report_dict(r) for r
                                                                       in reports],
                                        "traffic": acc, "timing": tm,
                                        "plan": plan.meta.get("method"),
                                        "kernels": kernels_backend()})
    return 0


def _nnz(bundle) -> int:  # noqa: ANN001
    return sum(len(bundle.pattern(k)[1]) for k in range(1, bundle.n_layers + 1))


def cmd_infer(args: argparse.Namespace) -> int:
    from .comm import run_collectively

    return run_collectively(lambda comm: _infer(comm, args))


def _infer(comm, args: argparse.Namespace) -> int:  # noqa: ANN001
    import time

    import numpy as np

    from .datasets import load_dataset
    from .formats import read_categories, read_inputs, write_categories
    from .runtime import (
        accounting,
        challenge_infer,
        evaluate,
        format_accounting,
        local_inputs,
        open_network,
        timing,
        write_json,
    )

    for out in (args.categories_out, args.metrics_out):
        if out:
            comm.check(lambda out=out: _check_output(out))
    bundle, plan, dnet = open_network(comm, args.network, args.plan, args.dtype)
    spec = args.inputs
    if spec == "digits" or spec.startswith(("npz:", "mnist:")):
        data = comm.check(lambda: load_dataset(spec, args.dtype))
        x, y = (data.x_test, data.y_test) if data.x_test is not None else (data.x_train,
                                                                            data.y_train)
        x_local = comm.check(lambda: local_inputs(dnet, x, spec))
        t0 = time.perf_counter()
        acc = evaluate(dnet, x_local, y)
        seconds = comm.max_scalar(time.perf_counter() - t0)
        traffic = accounting(comm, dnet, bundle)
        if comm.rank == 0:
            print(f"accuracy {acc:.4f} on {len(y):,} samples with {comm.size} rank(s) "
                  f"({len(y) / seconds:,.0f} samples/s)")
            print(format_accounting(traffic))
        write_json(comm, args.metrics_out, {"accuracy": acc, "samples": len(y),
                                            "seconds": seconds, "ranks": comm.size,
                                            "traffic": traffic})
        return 0
    truth = comm.check(lambda: read_categories(args.truth)) if args.truth else None
    images = comm.check(lambda: read_inputs(spec, bundle.sizes[0]))
    result = challenge_infer(comm, dnet, images, _nnz(bundle))
    traffic = accounting(comm, dnet, bundle)
    metrics = {"categories": len(result.categories), "inputs": result.n_inputs,
               "seconds": result.seconds, "rate": result.rate, "ranks": comm.size,
               "traffic": traffic, "timing": timing(comm, dnet)}
    if comm.rank == 0:
        print(f"{len(result.categories)} categories from {result.n_inputs:,} inputs with "
              f"{comm.size} rank(s); inference {result.seconds:.3f} s, rate "
              f"{result.rate:.4g} edges/s")
        print(format_accounting(traffic))
    if args.categories_out:
        comm.check(lambda: write_categories(args.categories_out, result.categories)
                   if comm.rank == 0 else None)
    if truth is not None:
        match = bool(np.array_equal(truth, result.categories))
        metrics["truth_match"] = match
        if comm.rank == 0:
            print("categories match the truth file" if match else
                  f"categories DIFFER from the truth file ({len(truth)} expected)")
        write_json(comm, args.metrics_out, metrics)
        if not match:
            comm.agree(f"{args.truth}: categories do not match")
        return 0
    write_json(comm, args.metrics_out, metrics)
    return 0


COMMANDS = {"convert": cmd_convert, "generate": cmd_generate, "train": cmd_train,
            "infer": cmd_infer}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args) or 0
    except SpdnnError as exc:
        print(f"spdnn: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("spdnn: interrupted", file=sys.stderr)
        return 130
    except MemoryError:
        print("spdnn: error: out of memory", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

