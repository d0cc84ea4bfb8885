"""What each ``spdnn`` subcommand does, given its parsed arguments (the parser is in cli.py).

``train`` and ``infer`` run on every rank of the job (``collectively``); ``convert`` and
``generate`` are serial. Heavy modules are imported inside the commands so that ``--help`` and
argument errors stay fast.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from .errors import InputError, SpdnnError
from .options import check_fan_in, check_outputs


def _short(sizes: Sequence[int]) -> str:
    if len(sizes) <= 6:
        return "x".join(map(str, sizes))
    return f"{sizes[0]}x...x{sizes[-1]} ({len(sizes) - 1} layers)"


def cmd_convert(args: argparse.Namespace) -> None:
    import numpy as np

    from .bundle import load_network, save_network
    from .formats import read_sparse_matrix, write_mtx
    from .graphchallenge import read_graphchallenge, write_graphchallenge
    from .network import Layer, Network
    from .progress import Progress
    from .safetensors_io import read_safetensors, write_safetensors

    names = args.layers if isinstance(args.layers, list) else None
    count = args.layers if isinstance(args.layers, int) else None
    if names is not None and "safetensors" not in (args.source, args.to):
        raise InputError(args.inputs[0], "--layers takes names only with safetensors; give "
                                         "a number of layers")
    if args.to in ("network", "safetensors"):
        check_outputs([("-o", args.output)])
    else:
        check_outputs([], [("-o", args.output)])
    if args.source == "graphchallenge":
        if len(args.inputs) != 1:
            raise InputError(args.inputs[1], "graphchallenge takes one directory")
        bar = Progress("reading layers", args.layers or 1)
        net = read_graphchallenge(args.inputs[0], args.bias, args.cap, count, args.dtype,
                                  progress=lambda k, n: (setattr(bar, "total", n),
                                                         bar.update(k)))
        bar.close()
        if args.output_activation:
            net = Network(net.layers, net.activation, net.cap, args.output_activation, net.extra)
    elif args.source == "mtx":
        layers = []
        for f in args.inputs[:count]:
            w = read_sparse_matrix(f).astype(args.dtype)
            layers.append(Layer(w, np.full(w.shape[0], args.bias, dtype=args.dtype)))
        net = Network(tuple(layers), cap=args.cap,
                      output_activation=args.output_activation or "linear")
        net.validate(" ".join(args.inputs))
    elif args.source == "safetensors":
        if len(args.inputs) != 1:
            raise InputError(args.inputs[1], "safetensors takes one file")
        net = read_safetensors(args.inputs[0], names if args.to == "network" else None,
                               args.dtype, args.cap, args.output_activation or "linear")
    else:
        net = load_network(args.inputs[0], args.dtype)
    if count is not None and args.source in ("safetensors", "network"):
        net = Network(net.layers[:count], net.activation, net.cap, net.output_activation,
                      net.extra)
    if args.to == "network":
        save_network(net, args.output)
    elif args.to == "safetensors":
        write_safetensors(net, args.output, names if args.source != "safetensors" else None)
    elif args.to == "graphchallenge":
        write_graphchallenge(net, args.output)
    else:
        Path(args.output).mkdir(parents=True, exist_ok=True)
        for k, layer in enumerate(net.layers, start=1):
            write_mtx(Path(args.output) / f"layer{k}.mtx", layer.weight,
                      f"spdnn layer {k}: rows = output neurons")
    print(f"wrote {args.output}: {net.n_layers} layers, sizes {_short(net.sizes)}, "
          f"{net.nnz:,} nonzeros")


def cmd_generate(args: argparse.Namespace) -> None:
    from . import generate
    from .bundle import save_network

    check_outputs([("-o", args.output)])
    if args.kind == "random":
        check_fan_in(args.fan_in, args.sizes)
    try:
        if args.kind == "radixnet":
            net = generate.radixnet(args.neurons, args.layers, args.seed, args.bias, args.cap,
                                    args.dtype)
            if args.head:
                net = generate.add_head(net, args.head, args.seed)
        elif args.kind == "random":
            net = generate.random_network(args.sizes, args.fan_in, args.seed, args.head,
                                          args.cap, args.dtype)
        elif args.kind == "local":
            net = generate.local_network(args.image, args.hidden, args.radius, args.seed,
                                         args.head, not args.no_shuffle, args.cap, args.dtype)
        else:
            net = generate.prune_file(args.weights, args.density, args.seed, args.head,
                                      args.dtype)
    except ValueError as exc:
        raise SpdnnError(str(exc)) from None
    save_network(net, args.output)
    print(f"wrote {args.output}: {args.kind}, sizes {_short(net.sizes)}, {net.nnz:,} nonzeros, "
          f"fingerprint {net.fingerprint()}")


def collectively(body: Callable[[Any, argparse.Namespace], int]
                 ) -> Callable[[argparse.Namespace], int]:
    """A subcommand that runs on every rank: errors agreed, an exception aborts the job."""
    def run(args: argparse.Namespace) -> int:
        import numpy as np

        from .comm import run_collectively

        # Overflow and NaN are detected and reported as one line (non-finite loss or
        # weights); numpy's warnings about them would only precede that line.
        with np.errstate(all="ignore"):
            return run_collectively(lambda comm: body(comm, args))
    return run


def _open(comm, args: argparse.Namespace, files: Sequence[tuple[str, str | None]],  # noqa: ANN001
          dirs: Sequence[tuple[str, str | None]] = ()):  # noqa: ANN202
    """Check the options on rank 0 (the decision is agreed), then open the network."""
    from . import kernels
    from .session import open_network

    def check() -> None:
        check_outputs(files, dirs)
        kernels.backend()  # an unknown SPDNN_KERNELS value is an error now, not mid-run

    def threads() -> None:
        cores = os.cpu_count() or 1
        if args.threads > cores:
            raise SpdnnError(f"--threads {args.threads}: more than the {cores} cores of this "
                             "node (threads per rank x ranks per node should not exceed them)")
        try:
            kernels.set_threads(args.threads)
        except ValueError as exc:
            raise SpdnnError(f"--threads: {exc}") from None

    comm.check(lambda: check() if comm.rank == 0 else None)
    comm.check(threads)
    plan, replicas = args.plan, args.replicas
    if isinstance(plan, list) or replicas == "auto":  # spdnn train: --plan once per candidate
        from .autogrid import choose_grid

        plan, replicas = choose_grid(comm, args)
    return open_network(comm, args.network, plan, args.dtype, replicas, args.exchange)


def _lossy_note(cfg: Any, replicas: int) -> str:  # noqa: ANN401 (a TrainConfig)
    note = ""
    if cfg.compress.enabled:
        note += f"; gradient sums compressed {cfg.compress.text()}" if replicas > 1 else \
            f"; --compress {cfg.compress.text()} has no effect with one replica (no sums)"
    if cfg.critical_set:
        note += f"; critical set {cfg.critical_set:g}, full pass every {cfg.refresh} epochs"
    return note


@collectively
def cmd_train(comm, args: argparse.Namespace) -> int:  # noqa: ANN001
    from contextlib import nullcontext

    from .accounting import accounting, format_timing, format_traffic, plan_volume, timing
    from .checkpoint import check_position, directory_lock, load_checkpoint
    from .datasets import check_fits, load_dataset
    from .kernels import backend as kernels_backend
    from .optim import SGDConfig
    from .progress import Progress
    from .session import save_trained, write_json
    from .training import TrainConfig, resumed_lossy, train

    if args.checkpoint_every and not args.checkpoint_dir:
        raise SpdnnError("--checkpoint-every needs --checkpoint-dir")
    if args.refresh is not None and args.critical_set is None:
        raise SpdnnError("--refresh needs --critical-set")
    run = _open(comm, args, [("--save", args.save), ("--metrics-out", args.metrics_out)],
                [("--checkpoint-dir", args.checkpoint_dir)])
    sizes, dnet = run.bundle.sizes, run.dnet
    data = comm.check(lambda: load_dataset(args.data, args.dtype))

    comm.check(lambda: check_fits(data, sizes, args.data))
    cfg = TrainConfig(args.epochs, args.batch_size,
                      SGDConfig(args.lr, args.momentum, args.weight_decay), args.seed,
                      not args.no_shuffle, args.loss, args.max_steps, args.checkpoint_dir,
                      args.checkpoint_every,
                      replace(args.compress, min_values=args.compress_min_values),
                      args.critical_set, args.refresh or 2)
    position, momentum, lossy = None, None, None
    if args.resume:
        position, momentum = comm.check(lambda: load_checkpoint(
            dnet, args.resume, cfg.settings(), args.resume_with_changes))
        lossy = comm.check(lambda: resumed_lossy(dnet, args.resume, cfg, len(data.y_train),
                                                 args.resume_with_changes))
        comm.check(lambda: check_position(position, args.resume, args.batch_size,
                                           args.max_steps, len(data.y_train)))
        if position.epoch >= args.epochs or args.max_steps == position.step:
            if comm.rank == 0:
                limit = f"--epochs {args.epochs}" if position.epoch >= args.epochs else \
                    f"--max-steps {args.max_steps}"
                print(f"{args.resume} is at step {position.step} (epoch {position.epoch + 1}, "
                      f"batch {position.batch}), already at {limit}: nothing to do; nothing "
                      "written", flush=True)
            return 0
    if comm.rank == 0:
        resumed = f", resumed at step {position.step}" if position else ""
        grid = f" ({dnet.grid.parts} part(s) x {dnet.grid.replicas} replicas)" \
            if dnet.grid.replicas > 1 else ""
        print(f"training {_short(sizes)} ({run.nnz:,} weights) on {data.name} "
              f"with {comm.size} rank(s){grid}, plan "
              f"{run.plan.meta.get('method', '?')}: {len(data.x_train):,} samples, batch "
              f"{args.batch_size}, lr {args.lr}, momentum {args.momentum}, weight decay "
              f"{args.weight_decay}{resumed}{_lossy_note(cfg, dnet.grid.replicas)}", flush=True)
    bars: list = []

    def on_step(done: int, total: int) -> None:
        """A progress bar (lines in a log) per epoch, on rank 0."""
        if not bars or done <= bars[-1].done:
            bars.append(Progress("  steps", total, enabled=comm.rank == 0, unit="samples",
                                 per_item=args.batch_size))
            bars[-1].start = done  # timing starts after this step
        bars[-1].done = done
        bars[-1].update(done)
        if done == total:
            bars[-1].close()

    result: dict[str, Any] = {}

    def finish() -> None:
        """Report the traffic and save the trained network, before the final checkpoint."""
        volume = plan_volume(dnet.comm, run.plan, [lay.exchange.n_ghost for lay in dnet.layers])
        result["traffic"] = acc = accounting(comm, dnet.traffic, volume, dnet.dtype.itemsize,
                                             dnet.grid.data)
        result["timing"] = tm = timing(comm, dnet.timers)
        if comm.rank == 0:
            print(format_traffic(acc, dnet.grid.parts, dnet.grid.replicas), flush=True)
            print(format_timing(tm), flush=True)
        if args.save:
            save_trained(comm, dnet, args.save, {"trained_by": "spdnn train",
                                                 "data": data.name})
            if comm.rank == 0:
                print(f"saved {args.save}")

    lock = directory_lock(comm, args.checkpoint_dir) if args.checkpoint_dir else nullcontext()
    with lock:
        on_epoch = (lambda r: print(r.line(), flush=True)) if comm.rank == 0 else None
        reports = train(comm, dnet, data, cfg, position, momentum, lossy, on_epoch, on_step,
                        finish)
    acc, tm = result["traffic"], result["timing"]
    write_json(comm, args.metrics_out, {"ranks": comm.size,
                                        "epochs": [r.as_dict() for r in reports],
                                        "traffic": acc, "timing": tm,
                                        "plan": run.plan.meta.get("method"),
                                        "kernels": kernels_backend()})
    return 0


@collectively
def cmd_infer(comm, args: argparse.Namespace) -> int:  # noqa: ANN001
    import time

    import numpy as np

    from .accounting import accounting, format_traffic, plan_volume, timing
    from .datasets import check_fits, load_dataset
    from .formats import read_categories, read_inputs, write_categories
    from .inference import challenge_infer, evaluate, local_inputs
    from .session import write_json

    run = _open(comm, args, [("--categories-out", args.categories_out),
                             ("--metrics-out", args.metrics_out)])
    dnet = run.dnet

    def traffic() -> dict[str, Any]:
        volume = plan_volume(dnet.comm, run.plan, [lay.exchange.n_ghost for lay in dnet.layers])
        return accounting(comm, dnet.traffic, volume, dnet.dtype.itemsize, dnet.grid.data)

    spec = args.inputs
    if spec == "digits" or spec.startswith(("npz:", "mnist:")):
        data = comm.check(lambda: load_dataset(spec, args.dtype))
        x, y = (data.x_test, data.y_test) if data.x_test is not None else (data.x_train,
                                                                            data.y_train)
        comm.check(lambda: check_fits(data, run.bundle.sizes, spec))
        x_local = comm.check(lambda: local_inputs(dnet, x, spec))
        t0 = time.perf_counter()
        acc = evaluate(dnet, x_local, y)
        seconds = comm.allreduce_scalar(time.perf_counter() - t0, "max")
        counted = traffic()
        if comm.rank == 0:
            print(f"accuracy {acc:.4f} on {len(y):,} samples with {comm.size} rank(s) "
                  f"({len(y) / seconds:,.0f} samples/s)")
            print(format_traffic(counted, dnet.grid.parts, dnet.grid.replicas))
        write_json(comm, args.metrics_out, {"accuracy": acc, "samples": len(y),
                                            "seconds": seconds, "ranks": comm.size,
                                            "traffic": counted})
        return 0
    truth = comm.check(lambda: read_categories(args.truth)) if args.truth else None
    images = comm.check(lambda: read_inputs(spec, run.bundle.sizes[0]))
    result = challenge_infer(comm, dnet, images, run.nnz)
    counted = traffic()
    metrics = {"categories": len(result.categories), "inputs": result.n_inputs,
               "seconds": result.seconds, "rate": result.rate, "ranks": comm.size,
               "traffic": counted, "timing": timing(comm, dnet.timers)}
    if comm.rank == 0:
        print(f"{len(result.categories)} categories from {result.n_inputs:,} inputs with "
              f"{comm.size} rank(s); inference {result.seconds:.3f} s, rate "
              f"{result.rate:.4g} edges/s")
        print(format_traffic(counted, dnet.grid.parts, dnet.grid.replicas))
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


def cmd_plot(args: argparse.Namespace) -> None:
    from .plots import plot_training

    check_outputs([("-o", args.output)])
    plot_training(args.metrics, args.output)
    print(f"wrote {args.output}")


@collectively
def cmd_calibrate(comm, args: argparse.Namespace) -> int:  # noqa: ANN001
    from .calibrate import run_calibrate

    return run_calibrate(comm, args.output, args.dtype)


COMMANDS: dict[str, Callable[[argparse.Namespace], int | None]] = {
    "convert": cmd_convert, "generate": cmd_generate, "train": cmd_train, "infer": cmd_infer,
    "plot": cmd_plot, "calibrate": cmd_calibrate}
