#!/usr/bin/env bash
# Tensor-parallel micro-batches against one batch, same GPUs, same process order:
#   bash bench/tp_micro.sh KILN [RANKS] [BATCHES]      e.g. bash bench/tp_micro.sh /tmp/k/bin/kiln 4 "8 16 32"
# Exports the Llama-7B-shaped model of bench/tp_gpu.py (two layers, fp32 weights, seed 0) once (or
# takes tp_gpu.py's export), then for each batch builds `--fp16 --tensor-parallel RANKS` with the
# default micro-batches (its report line printed), `--micro-batches 2` and `... 1`, and times each
# with `kiln bench` (10 warm-up, 50 timed: median and p99 ms). NCCL's environment passes through
# (the twenty-ninth session's NCCL_MAX_CTAS/NCCL_MIN_CTAS trial set it around the bench).
set -euo pipefail
K=$1; N=${2:-4}; BATCHES=${3:-"8 16 32"}
W=/tmp/tp_work; mkdir -p $W
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[ -f $W/llama-7b-shape.onnx ] || python3 - "$HERE" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import tp_gpu, peers
m, vocab, _ = tp_gpu.build("llama-7b-shape")
peers.export_onnx(m, peers.make_inputs(["input_ids"], vocab, 2), "/tmp/tp_work/llama-7b-shape.onnx")
PY
for b in $BATCHES; do
  for mb in 0 2 1; do
    e=$W/micro_b${b}_m${mb}.kiln
    "$K" build $W/llama-7b-shape.onnx --fp16 --batch "$b" --tensor-parallel "$N" --micro-batches $mb -o "$e" --report 2>&1 \
      | grep "^micro-batches" | sed "s/^/batch $b, --micro-batches $mb: /" || true
    [ $mb = 0 ] && { rm -f "$e"; continue; }
    "$K" bench "$e" --warmup 10 --iterations 50 --json $W/micro.json > /dev/null
    python3 -c "import json; j=json.load(open('$W/micro.json')); print('batch $b, micro-batches $mb: median %.3f ms, p99 %.3f ms' % (j['median_ms'], j['p99_ms']))"
    rm -f "$e"
  done
done
