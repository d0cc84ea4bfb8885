"""What each ``spdnn`` subcommand does, given its parsed arguments (the parser is in cli.py).

``train`` and ``infer`` run on every rank of the job (``collectively``); ``convert`` and
``generate`` are serial. Heavy modules are imported inside the commands so that ``--help`` and
argument errors stay fast.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from spdnn.cli._challenge import cmd_generate_images
from spdnn.cli._emulate import cmd_emulate
from spdnn.cli._xc import cmd_generate_xc
from spdnn.cli.options import check_fan_in
from spdnn.errors import InputError, OptionError, SpdnnError
from spdnn.io.paths import check_outputs
from spdnn.model.reports import short_sizes


def cmd_convert(args: argparse.Namespace) -> None:
    from dataclasses import replace

    import numpy as np

    from spdnn.io.bundle import (
        VALUES_KEY,
        as_bfloat16,
        load_network,
        save_network,
        stores_bfloat16,
    )
    from spdnn.io.formats import read_sparse_matrix, write_mtx
    from spdnn.io.graphchallenge import read_graphchallenge, write_graphchallenge
    from spdnn.io.safetensors import FROM_FILE, read_safetensors, write_safetensors
    from spdnn.jobs.progress import Progress
    from spdnn.model.network import Layer, Network

    names = args.layers if isinstance(args.layers, list) else None
    count = args.layers if isinstance(args.layers, int) else None
    if names is not None and "safetensors" not in (args.source, args.to):
        raise InputError(args.inputs[0], "--layers takes names only with safetensors; give "
                                         "a number of layers")
    if args.to in ("network", "safetensors"):
        check_outputs([("-o", args.output)], inputs=[("the input", f) for f in args.inputs])
    else:
        check_outputs([], [("-o", args.output)])
    if args.dtype is None and args.source in ("graphchallenge", "mtx"):
        raise InputError(args.inputs[0], "text values declare no value type: give --dtype "
                                         "float32 or float64")
    if args.source == "graphchallenge":
        if len(args.inputs) != 1:
            raise InputError(args.inputs[1], "graphchallenge takes one directory")
        bar = Progress("reading layers", args.layers or 1)
        net = read_graphchallenge(args.inputs[0], args.bias, getattr(args, "cap", None), count,
                                  args.dtype,
                                  progress=lambda k, n: (setattr(bar, "total", n),
                                                         bar.update(k)))
        bar.close()
        if args.output_activation:
            net = replace(net, output_activation=args.output_activation)
    elif args.source == "mtx":
        layers = []
        for k, f in enumerate(args.inputs[:count], start=1):
            w = read_sparse_matrix(f).tocsr()
            w.sort_indices()
            layers.append(Layer.from_arrays(w.indptr, w.indices, w.data, w.shape,
                                            np.full(w.shape[0], float(args.bias)), f,
                                            f"layer {k}", args.dtype))
        net = Network(layers=tuple(layers), cap=getattr(args, "cap", None),
                      output_activation=args.output_activation or "linear")
        net.validate(" ".join(args.inputs))
    elif args.source == "safetensors":
        if len(args.inputs) != 1:
            raise InputError(args.inputs[1], "safetensors takes one file")
        net = read_safetensors(args.inputs[0], names, args.dtype,
                               getattr(args, "cap", FROM_FILE),
                               args.output_activation or FROM_FILE, args.activations)
    else:
        net = load_network(args.inputs[0], args.dtype)
    if count is not None and args.source in ("safetensors", "network"):
        net = net.truncated(count)
    if args.dtype == "bfloat16":  # asked for: the values rounded, stored in 16 bits
        try:
            net = as_bfloat16(net)
        except ValueError as exc:
            raise InputError(args.inputs[0], str(exc)) from None
    elif args.dtype is not None and stores_bfloat16(net.meta()):  # asked for: widened
        net = replace(net, extra={k: v for k, v in net.extra.items() if k != VALUES_KEY})
    if args.to == "network":
        save_network(net, args.output)
    elif args.to == "safetensors":
        write_safetensors(net, args.output, names if args.source != "safetensors" else None,
                          pruned=False if args.plain else None)
    elif args.to == "graphchallenge":
        write_graphchallenge(net, args.output)
    else:
        Path(args.output).mkdir(parents=True, exist_ok=True)
        for k, layer in enumerate(net.layers, start=1):
            write_mtx(Path(args.output) / f"layer{k}.mtx", layer.weight,
                      f"spdnn layer {k}: rows = output neurons")
    print(f"wrote {args.output}: {net.n_layers} layers, sizes {short_sizes(net.sizes)}, "
          f"{net.nnz:,} nonzeros")


def cmd_generate(args: argparse.Namespace) -> None:
    from spdnn.io.bundle import save_network
    from spdnn.model import generate

    if args.kind == "xc-data":
        cmd_generate_xc(args)
        return
    if args.kind == "challenge-images":
        cmd_generate_images(args)
        return
    check_outputs([("-o", args.output)])
    if args.kind == "random":
        check_fan_in(args.fan_in, args.sizes)
    if args.kind == "radixnet":  # written layer by layer: it may be larger than memory
        cmd_generate_radixnet(args)
        return
    try:
        if args.kind == "random":
            net = generate.random_network(args.sizes, args.fan_in, seed=args.seed,
                                          head=args.head, cap=args.cap, dtype=args.dtype)
        elif args.kind == "local":
            net = generate.local_network(args.image, args.hidden, radius=args.radius,
                                         seed=args.seed, head=args.head,
                                         shuffle=not args.no_shuffle, cap=args.cap,
                                         dtype=args.dtype)
        else:
            from spdnn.io.dense import prune_file

            net = prune_file(args.weights, args.density, args.seed, args.head, args.dtype)
        net = net.with_activations(args.activations)
    except OptionError as exc:  # checked where the network is made, named here by its flag
        raise exc.as_flag() from None
    except ValueError as exc:
        raise SpdnnError(str(exc)) from None
    save_network(net, args.output)
    print(f"wrote {args.output}: {args.kind}, sizes {short_sizes(net.sizes)}, {net.nnz:,} "
          f"nonzeros, fingerprint {net.fingerprint()}")


def cmd_generate_radixnet(args: argparse.Namespace) -> None:
    from spdnn.io.bundle import write_network
    from spdnn.jobs.progress import Progress
    from spdnn.model import generate
    from spdnn.model.network import Network

    sizes = [args.neurons] * (args.layers + 1) + ([args.head] if args.head else [])
    extra = {"generator": "radixnet", "seed": args.seed} | ({"head": args.head}
                                                            if args.head else {})
    meta = Network(layers=(), activations=("relu",) * (len(sizes) - 2), cap=args.cap,
                   output_activation="linear" if args.head else "relu", extra=extra).meta()
    try:
        layers = generate.radixnet_layers(args.neurons, args.layers, seed=args.seed, bias=args.bias,
                                          dtype=args.dtype, head=args.head)
    except ValueError as exc:
        raise SpdnnError(str(exc)) from None
    progress = Progress(f"writing {args.output}", len(sizes) - 1, unit="layers")

    def counted() -> Iterator[Any]:
        for k, layer in enumerate(layers, start=1):
            yield layer
            progress.update(k)

    fingerprint = write_network(args.output, sizes, counted(), meta)
    progress.close()
    nnz = 32 * args.neurons * args.layers + args.neurons * (args.head or 0)
    print(f"wrote {args.output}: radixnet, sizes {short_sizes(sizes)}, {nnz:,} nonzeros, "
          f"fingerprint {fingerprint}")


def collectively(body: Callable[[Any, argparse.Namespace], int]
                 ) -> Callable[[argparse.Namespace], int]:
    """A subcommand that runs on every rank: errors agreed, an exception aborts the job."""
    def run(args: argparse.Namespace) -> int:
        import sys

        import numpy as np

        timeout = getattr(args, "comm_timeout", None)
        dismiss = None
        if timeout and "mpi4py.MPI" not in sys.modules:  # MPI's start-up, watched too
            from spdnn.cli.options import launcher_rank
            from spdnn.comm.watchdog import guard_start

            dismiss = guard_start(float(timeout), rank=launcher_rank())
        from spdnn.comm.collective import run_collectively  # MPI starts here (spdnn.comm)

        if dismiss is not None:
            dismiss()

        # Overflow and NaN are detected and reported as one line (non-finite loss or
        # weights); numpy's warnings about them would only precede that line.
        with np.errstate(all="ignore"):
            return run_collectively(lambda comm: body(comm, args),
                                    timeout=float(timeout) if timeout else None,
                                    finalize=args.finalize_mpi)
    return run


def _run_options(args: argparse.Namespace) -> Any:  # noqa: ANN401 (a RunOptions)
    from spdnn.model.options import RunOptions
    from spdnn.schema import from_args

    plans = args.plan if isinstance(args.plan, list) else ([args.plan] if args.plan else [])
    return from_args(RunOptions, args, plan=plans[0] if plans else None, plans=tuple(plans[1:]))


@collectively
def cmd_train(comm, args: argparse.Namespace) -> int:  # noqa: ANN001
    from spdnn.api import train
    from spdnn.model.options import TrainOptions, check_train_options
    from spdnn.schema import from_args

    options = from_args(TrainOptions, args)
    comm.check(lambda: check_train_options(options))  # named by their flags here
    with _dry_run(comm):
        train(args.network, data=args.data, run=_run_options(args), options=options,
              save=args.save, metrics_out=args.metrics_out, comm=comm, verbose=True)
    return 0


@collectively
def cmd_infer(comm, args: argparse.Namespace) -> int:  # noqa: ANN001
    from spdnn.api import infer

    with _dry_run(comm):
        infer(args.network, inputs=args.inputs, run=_run_options(args), truth=args.truth,
              categories_out=args.categories_out, metrics_out=args.metrics_out, comm=comm,
              verbose=True, lsh=args.lsh)
    return 0


@contextlib.contextmanager
def _dry_run(comm) -> Iterator[None]:  # noqa: ANN001
    """A dry run ends the job with its report (rank 0 prints it) and exit code 0."""
    from spdnn.runtime.memory_budget import DryRun

    try:
        yield
    except DryRun as done:
        if comm.rank == 0:
            print(done, flush=True)


def cmd_plot(args: argparse.Namespace) -> None:
    from spdnn.io.plots import plot_training

    check_outputs([("-o", args.output)])
    plot_training(args.metrics, args.output)
    print(f"wrote {args.output}")


@collectively
def cmd_calibrate(comm, args: argparse.Namespace) -> int:  # noqa: ANN001
    from spdnn.cost.calibrate import FULL, QUICK, run_calibrate

    return run_calibrate(comm, args.output, tuple(args.dtype), grid=QUICK if args.quick else FULL)


COMMANDS: dict[str, Callable[[argparse.Namespace], int | None]] = {
    "convert": cmd_convert, "generate": cmd_generate, "train": cmd_train, "infer": cmd_infer,
    "plot": cmd_plot, "calibrate": cmd_calibrate, "emulate": cmd_emulate}
