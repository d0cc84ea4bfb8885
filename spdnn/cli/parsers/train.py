"""``spdnn train``'s flags: TrainOptions' declarations (spdnn.model.options, spdnn.optim), and
the job's own (data, outputs)."""

from __future__ import annotations

from spdnn.cli.parsers.common import command, run_options


def add_train(sub) -> None:  # noqa: ANN001 (argparse's subparsers action)
    """``spdnn train``."""
    from spdnn.model.options import TrainOptions
    from spdnn.optim import OPTIMIZERS
    from spdnn.schema import add_flags, options

    names = ", ".join(cls.TORCH for cls in OPTIMIZERS.values())
    tr = command(sub, "train", f"train with torch.optim's {names}",
                 f"Minibatch training with torch.optim's semantics ({names}), on one process "
                 "or on P ranks under mpirun (P = replicas x the plan's parts).")
    run_options(tr, auto=True)
    tr.add_argument("--data", default="digits",
                    help="digits | npz:FILE | mnist:DIR | xc:DIR (multi-label)")
    tr.add_argument("--save", help="write the trained network as one bundle")
    tr.add_argument("--metrics-out", help="write per-epoch metrics, traffic and timing as JSON")
    groups = {group: tr.add_argument_group(group) for group in
              dict.fromkeys(o.group for o in options(TrainOptions).values() if o.group)}
    add_flags(tr, TrainOptions, groups=groups)
