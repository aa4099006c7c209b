#!/usr/bin/env bash
# Engine files on the GPU machine, in one device call: `bash bench/engine-check.sh BIN_DIR [1|large] [MODELS]`.
# BIN_DIR holds kiln (this build), optionally kiln-old (an older kiln to compare speed with),
# classify and load_engine (examples/, built against the installed package). Runs bench/engine_check.py
# (build, load, bit-identity, speed: see its header), then, when classify is there, builds and loads
# a ResNet-50 engine inside one process (the warm-process load time), and checks that a GPU memory
# budget under the engine's needs fails before allocating. Results under $OUT.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN=$(realpath "${1:?usage: engine-check.sh BIN_DIR [1|large] [MODELS]}")
BATCH=${2:-1}
MODELS=${3:-resnet50,mobilenet_v2,vit_b_16,bert,gpt2}
OUT=${OUT:-/tmp/engine-check}
mkdir -p "$OUT"
# shellcheck source=bench/gpu-env.sh
source bench/gpu-env.sh
export PYTHONUNBUFFERED=1
OLD=()
[[ -x "$BIN/kiln-old" ]] && OLD=(--old "$BIN/kiln-old")
python3 bench/engine_check.py --kiln "$BIN/kiln" "${OLD[@]}" --batch "$BATCH" --models "$MODELS" --out "$OUT" \
  --rounds "${ROUNDS:-3}" --iters "${ITERS:-200}"
W=/tmp/engine-check-work
if [[ -x "$BIN/classify" && -f "$W/resnet50.onnx" ]]; then
  python3 -c "import numpy as np; np.save('$W/img.npy', np.random.default_rng(1).standard_normal((1,3,224,224)).astype(np.float32))"
  echo "== examples/classify on the GPU (build, save, load in one process)"
  "$BIN/classify" "$W/resnet50.onnx" "$W/img.npy" "$W/classify.kiln" cuda 2>&1 | tail -4
fi
if [[ -x "$BIN/load_engine" ]]; then
  # Each engine loaded three times in one process: the first pays the CUDA context, the others
  # show a warm process's load + session + first inference.
  for e in "$W"/*_b"$BATCH".kiln "$W"/*_b[0-9][0-9]*.kiln; do
    [[ -f "$e" ]] || continue
    echo "== load_engine $(basename "$e")"
    "$BIN/load_engine" "$e" 3 2>&1 | tail -3
  done
fi
if [[ "${HOST_STEP:-1}" == 1 ]]; then
  # A CPU node in the middle of GPU work (CumSum has no GPU lowering yet), 40 small GEMMs around it:
  # graphs around the host step (default) vs every step launched (--no-cuda-graph), ABBA order.
  python3 bench/hoststep_model.py "$W/hoststep.onnx"
  echo "== a CPU node between 2 x 20 GEMM+Tanh steps: graphs around it vs --no-cuda-graph"
  for flag in "" --no-cuda-graph --no-cuda-graph "" "" --no-cuda-graph; do
    "$BIN/kiln" bench "$W/hoststep.onnx" --fp16 $flag --warmup 50 --iterations 500 --report 2>&1 \
      | grep -E "cuda graph:|latency" | sed -e 's/steps per forward.*cuda graph: //' -e 's/latency (CUDA events per forward)://' \
      | tr '\n' ' ' | sed "s/^/${flag:-graphs} /"; echo
  done
fi
if [[ -f "$W/resnet50.onnx" ]]; then
  echo "== --memory-budget 16 (MiB) for ResNet-50 b1: must fail before allocating"
  "$BIN/kiln" build "$W/resnet50.onnx" --fp16 --batch 1 --memory-budget 16 -o "$W/budget.kiln"; echo "exit $?"
  [[ -e "$W/budget.kiln" ]] && echo "FAIL: an engine file was written"
fi
