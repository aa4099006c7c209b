#!/usr/bin/env bash
# kiln serve on the GPU machine against issue 26's targets, in one call: ResNet-50 (torchvision,
# exported there) built once as a dynamic fp16 engine for batch 1..64, served with the dynamic batcher
# (max_batch_size 64) on one session (two shared the GPU and formed smaller batches: bench/RESULTS.md,
# thirty-eighth session), driven by kiln-serve-load over gRPC and HTTP at concurrency 1..64, beside
# `kiln bench` of the same engine at batch 1, 32 and 64.
#
#   bash bench/serve-gpu.sh BIN OUT [DELAY_US] [INSTANCES] [SHM] [PROTOCOLS] [CONCURRENCY]
#   (BIN: the unpacked pack's bin/; defaults 200, 1, cuda, grpc,http, 1,8,32,64; SHM: none, system or
#   cuda, comma-separated - where the tensors travel; PROTOCOLS may add grpc-async). SOAK=M (minutes)
#   then keeps the load on and samples the server's host and GPU memory (serve_load.py --soak-minutes).
set -euo pipefail
BIN=$1
OUT=$2
DELAY=${3:-200}
INSTANCES=${4:-1}
SHM=${5:-cuda}
PROTOCOLS=${6:-grpc,http}
CONCURRENCY=${7:-1,8,32,64}
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source bench/gpu-env.sh
mkdir -p "$OUT"
if [[ ! -f /tmp/r50.kiln ]]; then  # made once per machine; later calls reuse it
python3 - <<'PY'
import torch, torchvision
m = torchvision.models.resnet50().eval()
x = torch.randn(1, 3, 224, 224)
torch.onnx.export(m, x, "/tmp/r50.onnx", input_names=["input"], output_names=["logits"], opset_version=17,
                  dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}}, dynamo=False)
PY
t0=$(date +%s)
"$BIN/kiln" build /tmp/r50.onnx --fp16 --shapes input:1..64x3x224x224 -o /tmp/r50.kiln | tail -3
echo "build: $(( $(date +%s) - t0 )) s"
fi
PYTHONUNBUFFERED=1 python3 bench/serve_load.py --kiln "$BIN/kiln" --model /tmp/r50.kiln --device cuda \
  --max-batch-size 64 --delay-us "$DELAY" --input-dims 3x224x224 --input-names input --instances "$INSTANCES" \
  --engine-batches 1,32,64 --engine-shapes 'input:{b}x3x224x224' --client cpp --protocols "$PROTOCOLS" \
  --shared-memory "$SHM" --output-shared-memory-size 4096 --concurrency "$CONCURRENCY" --seconds 8 --soak-minutes "${SOAK:-0}" --out "$OUT/serve-gpu.json"
