"""The training options of the lossy speed-ups: compressed gradient sums, critical sets and
LSH-selected output neurons (docs/lossy.md)."""

from __future__ import annotations

import argparse

from spdnn.cli.options import fraction, positive_int, seed

# --compress and --lsh stay text here: the job parses each once, with the options that go with
# it (spdnn.jobs.train), and reports a bad one as ``--compress: ...`` / ``--lsh: ...``.


def add_lossy(tr: argparse.ArgumentParser) -> None:
    lossy = tr.add_argument_group("lossy speed-ups (opt-in; docs/lossy.md)")
    lossy.add_argument("--compress", default="none", metavar="SPEC",
                       help="compress the gradient sums over replicas, with error feedback: "
                            "none, topk:RATIO, dgc:RATIO, sidco:RATIO[:exp|gamma|gpareto] or "
                            "hylo (2 bits per value); RATIO = fraction of the values a rank "
                            "sends, e.g. 0.01")
    lossy.add_argument("--compress-min-values", type=seed, default=0, metavar="N",
                       help="sum layers with fewer gradient values than N on a rank exactly")
    lossy.add_argument("--critical-set", type=fraction, metavar="FRACTION",
                       help="between full passes, train only on this fraction of the samples "
                            "with the highest loss in the last full pass")
    lossy.add_argument("--refresh", type=positive_int, metavar="K",
                       help="with --critical-set: a full pass every K epochs (default 2)")
    lossy.add_argument("--lsh", metavar="LAYER:K:L[:dwta|simhash]",
                       help="SLIDE: compute and train only the neurons of layer LAYER that L "
                            "hash tables of K functions retrieve for each sample (on the output "
                            "layer, plus its labels), e.g. 2:6:50 (DWTA) or 2:9:50:simhash; a "
                            "hidden layer's other neurons are zero")
    lossy.add_argument("--lsh-max-active", type=positive_int, metavar="M",
                       help="with --lsh: keep at most M retrieved neurons per sample (those "
                            "most tables retrieved; ties in a seeded order), labels, random and "
                            "top-bias neurons besides")
    lossy.add_argument("--lsh-random", type=seed, default=0, metavar="N",
                       help="with --lsh: add N random output neurons to each sample's active "
                            "set in training (SLIDE tops its retrieved sets up so; the same on "
                            "every grid)")
    lossy.add_argument("--lsh-top-bias", type=seed, default=0, metavar="N",
                       help="with --lsh: add the N output neurons of largest bias (found at "
                            "each rebuild) to every sample's active set in training, so that "
                            "frequent labels are pushed down as in exact training; without it "
                            "they drift up and can become every sample's prediction (about "
                            "100 at 200,000 labels)")
    lossy.add_argument("--lsh-estimate-tail", action="store_true",
                       help="with --lsh-random: in training the random output neurons stand "
                            "for every output not retrieved, their softmax terms weighted by "
                            "(outputs not retrieved) / (random ones): the loss and gradients "
                            "of the full softmax, estimated (sampled softmax); holds at "
                            "learning rates where the softmax over the active outputs alone "
                            "kills the hidden layer (docs/lossy.md)")
    lossy.add_argument("--rehash", type=positive_int, default=50, metavar="N",
                       help="with --lsh: rebuild the tables after 1, 2, 4, ... steps up to "
                            "N, then after N steps, each later period 10%% longer")
