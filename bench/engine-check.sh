#!/usr/bin/env bash
# Engine files on the GPU machine, in one device call: `bash bench/engine-check.sh BIN_DIR [1|large] [MODELS]`.
# BIN_DIR holds kiln (this build), optionally kiln-old (an older kiln to compare speed with) and
# classify (examples/classify, built against the installed package). Runs bench/engine_check.py
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
if [[ "${HOST_STEP:-1}" == 1 ]]; then
  # A CPU node between GPU work (CumSum has no GPU lowering yet): graphs around it vs none.
  python3 - "$W/hoststep.onnx" <<'PY'
import sys, numpy as np, onnx
from onnx import helper as h, TensorProto as T
rng = np.random.default_rng(0)
w = [h.make_tensor(f"w{i}", T.FLOAT, [1024, 1024], (rng.standard_normal(1024 * 1024) * 0.03).astype(np.float32).tolist()) for i in range(4)]
ax = h.make_tensor("ax", T.INT64, [], [1])
nodes = [h.make_node("MatMul", ["x", "w0"], ["a"]), h.make_node("Relu", ["a"], ["b"]), h.make_node("MatMul", ["b", "w1"], ["c"]),
         h.make_node("CumSum", ["c", "ax"], ["d"], name="cumsum"), h.make_node("MatMul", ["d", "w2"], ["e"]),
         h.make_node("Relu", ["e"], ["f"]), h.make_node("MatMul", ["f", "w3"], ["y"])]
g = h.make_graph(nodes, "hoststep", [h.make_tensor_value_info("x", T.FLOAT, [64, 1024])],
                 [h.make_tensor_value_info("y", T.FLOAT, [64, 1024])], w + [ax])
onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), sys.argv[1])
PY
  echo "== a CPU node between GPU steps: graphs around it (default) vs --no-cuda-graph, 3 rounds"
  for r in 1 2 3; do
    for flag in "" --no-cuda-graph; do
      "$BIN/kiln" bench "$W/hoststep.onnx" --fp16 $flag --warmup 20 --iterations 200 --report 2>&1 \
        | grep -E "cuda graph:|latency" | tr '\n' ' ' | sed "s/^/${flag:-graphs} /"; echo
    done
  done
fi
if [[ -f "$W/resnet50.onnx" ]]; then
  echo "== --memory-budget 16 (MiB) for ResNet-50 b1: must fail before allocating"
  "$BIN/kiln" build "$W/resnet50.onnx" --fp16 --batch 1 --memory-budget 16 -o "$W/budget.kiln"; echo "exit $?"
  [[ -e "$W/budget.kiln" ]] && echo "FAIL: an engine file was written"
fi
