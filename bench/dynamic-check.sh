#!/usr/bin/env bash
# Dynamic GPU engines on the GPU machine, in one device call: `bash bench/dynamic-check.sh BIN_DIR [MODELS]`
# (bench/dynamic_check.py: correctness at three shapes of one engine, errors, the shape sweep against
# static engines). Results under $OUT.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN=$(realpath "${1:?usage: dynamic-check.sh BIN_DIR [MODELS]}")
OUT=${OUT:-/tmp/dynamic-check}
mkdir -p "$OUT"
# shellcheck source=bench/gpu-env.sh
source bench/gpu-env.sh
export PYTHONUNBUFFERED=1
python3 bench/dynamic_check.py --kiln "$BIN/kiln" --models "${2:-resnet50,bert}" --points "${POINTS:-12}" --out "$OUT" \
  2>&1 | tee "$OUT/dynamic_check.log"
