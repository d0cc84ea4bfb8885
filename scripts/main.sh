#!/usr/bin/env bash
# The main job on the embedded default: sets up ./.venv from PyPI (MPI included; a first run
# installs it, about a minute and a half), generates a
# locally connected sparse network over the 8x8 digits (neurons numbered in a random order, as in
# a pruned network), partitions it for 2 ranks with the partitioner's default method and with the
# block baseline, trains it with `mpirun -n 2` under each plan side by side, runs distributed inference,
# and prints what the plan saves: rows and bytes per step, time per epoch (on one node and, where
# network namespaces are permitted, on 2 emulated nodes over a 100 Mbit/s link), test accuracy.
# It prints one line per step and a summary; every step's output, the plans, the trained
# network and the metrics go to ./out (override with SPDNN_OUT; ranks with SPDNN_RANKS).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/venv.sh
OUT="${SPDNN_OUT:-out}"
P="${SPDNN_RANKS:-2}"
mkdir -p "$OUT"
MPIRUN=(mpirun -n "$P")
TRAIN=(--data digits --epochs 30 --batch-size 32 --lr 0.05 --momentum 0.9 --weight-decay 1e-4
       --seed 0)

# Each step's whole output goes to $OUT/NAME.log; the terminal gets one line per step and the
# summary at the end.
step() {
    local log="$OUT/$1.log"; shift
    if ! "$@" > "$log" 2>&1; then
        echo "   failed; its output ($log):"; tail -n 20 "$log"; exit 1
    fi
}

echo "== 1. generate a locally connected network: 8x8 pixels -> 16x16 -> 16x16 -> 10 ($OUT/generate.log)"
step generate spdnn generate local --image 8x8 --hidden 16x16,16x16 --radius 1 --head 10 \
    --seed 0 -o "$OUT/net.npz"

echo "== 2. partition it for $P ranks: a hypergraph plan and the block plan ($OUT/partition.log)"
step partition spdnn-partition "$OUT/net.npz" -P "$P" -o "$OUT/plan.npz" --compare
step partition-block spdnn-partition "$OUT/net.npz" -P "$P" -o "$OUT/block.npz" --method block

echo "== 3. train 30 epochs with ${MPIRUN[*]} on the digits under each plan ($OUT/train*.log)"
step train "${MPIRUN[@]}" spdnn train --network "$OUT/net.npz" --plan "$OUT/plan.npz" \
    "${TRAIN[@]}" --checkpoint-dir "$OUT/checkpoints" --checkpoint-every 500 \
    --save "$OUT/trained.npz" --metrics-out "$OUT/train.json"
step train-block "${MPIRUN[@]}" spdnn train --network "$OUT/net.npz" --plan "$OUT/block.npz" \
    "${TRAIN[@]}" --metrics-out "$OUT/train-block.json"

# 100 Mbit/s: there the rows each plan cuts cost more than the step's compute (at 1 Gbit/s the
# plans differ less, at 10 Gbit/s not at all: docs/BENCHMARKS.md, Over a network).
LINK=100mbit
if NOTE=$(spdnn emulate --nodes 2 --link "$LINK" --no-measure -- true 2>&1); then
    echo "   and 5 epochs each on 2 emulated nodes over a 100 Mbit/s link ($OUT/train-*-$LINK.log)"
    for plan in plan block; do
        step "train-$plan-$LINK" spdnn emulate --nodes 2 --link "$LINK" -n "$P" \
            $( [ "$plan" = block ] && echo --no-measure ) \
            -- spdnn train --network "$OUT/net.npz" --plan "$OUT/$plan.npz" "${TRAIN[@]}" \
            --epochs 5 --metrics-out "$OUT/train-$plan-$LINK.json"
    done
else
    echo "   (not on emulated nodes: ${NOTE##*error: })"
fi

echo "== 4. distributed inference on the test split ($OUT/infer.log)"
step infer "${MPIRUN[@]}" spdnn infer --network "$OUT/trained.npz" --plan "$OUT/plan.npz" \
    --inputs digits --metrics-out "$OUT/infer.json"

echo "== 5. what the plan saves"
python - "$OUT" <<'PY'
import json, statistics, sys
out = sys.argv[1]
rows = []
for name, f in (("hypergraph", "train.json"), ("block", "train-block.json")):
    m = json.load(open(f"{out}/{f}"))
    c = m["traffic"]["counted"]
    dense = sum(c["forward_bytes"]) + sum(c["backward_bytes"])
    sent = sum(c["forward_sent"]) + sum(c["backward_sent"])
    rows.append((name, m["traffic"]["plan_volume_rows"], dense / 1e6, sent / 1e6,
                 statistics.median(e["seconds"] for e in m["epochs"]),
                 m["epochs"][-1]["test_accuracy"], m["traffic"]["equal"]))
infer = json.load(open(f"{out}/infer.json"))
link = {}
for name, f in (("hypergraph", "train-plan-100mbit.json"), ("block", "train-block-100mbit.json")):
    try:
        link[name] = statistics.median(e["seconds"] for e in json.load(open(f"{out}/{f}"))["epochs"])
    except FileNotFoundError:
        pass
print("rows/step: neuron values (rows) the plan sends between ranks per training step; MB sent")
print("over the run; median seconds per epoch on this machine and over the emulated link")
print(f"{'plan':>10}  {'rows/step':>9}  {'MB sent':>8}  {'s/epoch':>7}  "
      f"{'test acc':>8}  {'s/epoch at 100 Mbit/s':>21}")
for name, r, mb, sent, s, acc, _ in rows:
    over = f"{link[name]:21.3f}" if name in link else f"{'not run':>21}"
    print(f"{name:>10}  {r:9,}  {sent:8.1f}  {s:7.3f}  {acc:8.4f}  {over}")
(_, r0, _, kb0, *_), (_, r1, _, kb1, *_) = rows
print(f"the hypergraph plan moves {r1 / r0:.2f}x fewer rows per step than the block plan "
      f"({kb1 / kb0:.2f}x fewer bytes sent); counted traffic "
      f"{'equals' if all(x[-1] for x in rows) else 'DIFFERS from'} each plan's prediction.")
local = rows[1][4] / rows[0][4]  # block over hypergraph, on this machine: say which way
print(f"on this machine the hypergraph plan's epoch is {max(local, 1 / local):.2f}x "
      f"{'faster' if local >= 1 else 'slower'} than the block plan's (shared memory moves "
      "these rows faster than a step's fixed costs).")
if len(link) == 2:
    ratio = link["block"] / link["hypergraph"]  # a loaded host can turn it: say which way
    print(f"over 100 Mbit/s between 2 emulated nodes the hypergraph plan's epoch is "
          f"{max(ratio, 1 / ratio):.2f}x {'faster' if ratio >= 1 else 'slower'} than the "
          "block plan's.")
else:
    print("the emulated network was not permitted here (it needs root): no times over a link.")
print(f"distributed inference: test accuracy {infer['accuracy']:.4f} on {infer['ranks']} ranks")
PY
