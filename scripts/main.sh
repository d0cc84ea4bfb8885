#!/usr/bin/env bash
# The main job on the embedded default: sets up ./.venv from PyPI, generates a sparse network,
# converts it through Matrix Market and back, trains it on the bundled handwritten digits and
# runs inference. Outputs go to ./out (override with SPDNN_OUT).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/venv.sh
OUT="${SPDNN_OUT:-out}"
mkdir -p "$OUT"

echo "== generate a sparse network: 64 inputs -> 256 -> 256 (16 nonzeros per row) -> 10 classes"
spdnn generate random --sizes 64,256,256 --fan-in 16 --head 10 --seed 0 -o "$OUT/net.npz"

echo "== convert: bundle -> Matrix Market (one file per layer) -> bundle"
spdnn convert network "$OUT/net.npz" --to mtx -o "$OUT/net-mtx"
spdnn convert mtx "$OUT"/net-mtx/layer{1,2,3}.mtx -o "$OUT/net.npz"

echo "== train on the handwritten digits (1,437 train / 360 test images)"
spdnn train --network "$OUT/net.npz" --data digits --epochs 30 --batch-size 32 --lr 0.05 \
    --momentum 0.9 --weight-decay 1e-4 --seed 0 --save "$OUT/trained.npz" \
    --metrics-out "$OUT/train.json"

echo "== inference on the test split"
spdnn infer --network "$OUT/trained.npz" --inputs digits --metrics-out "$OUT/infer.json"
