#!/usr/bin/env bash
# `make demo`: the main job on the bundled EfficientNet-Lite0 (models/efficientnet-lite0/README.md):
# import and summarize the model, classify two real photos on the best backend present, print the
# top-5 classes and the latency, and check the logits against onnxruntime's; without a GPU, the
# reference kernels' latency beside the fast CPU backend's.
set -euo pipefail
KILN=${1:-build/kiln}
M=models/efficientnet-lite0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "== kiln inspect $M/model.onnx"
"$KILN" inspect "$M/model.onnx"
for img in chelsea coffee; do
  echo
  echo "== kiln run: $img.png (preprocessed to $M/$img.npy)"
  "$KILN" run "$M/model.onnx" --input "input=$M/$img.npy" --top-k 5 --labels "$M/labels.txt" \
    --warmup 2 --iterations 10 --output-dir "$tmp/$img"
  # The same inputs through `kiln compare`, against onnxruntime's logits for this photo.
  mkdir -p "$tmp/$img-in" "$tmp/$img-ref"
  cp "$M/$img.npy" "$tmp/$img-in/input.npy"
  cp "$M/${img}_expected_logits.npy" "$tmp/$img-ref/logits.npy"
  echo "== kiln compare against onnxruntime 1.31.1's logits"
  "$KILN" compare "$M/model.onnx" --inputs "$tmp/$img-in" --reference "$tmp/$img-ref" --atol 1e-4 --rtol 1e-4
done
# Without a GPU the run above is the fast CPU backend (oneDNN); the reference kernels it is checked
# against (the oracle) run the same photo for comparison.
if ! "$KILN" run "$M/model.onnx" --input "input=$M/chelsea.npy" --iterations 1 2>/dev/null | grep -q "^backend: cuda"; then
  echo
  echo "== kiln run --device cpu-ref: the reference kernels (the oracle) on chelsea.png, beside the first run's latency"
  "$KILN" run "$M/model.onnx" --device cpu-ref --input "input=$M/chelsea.npy" --top-k 1 --labels "$M/labels.txt" \
    --warmup 1 --iterations 3 | grep -E "^(backend|latency|  1\.)"
fi
