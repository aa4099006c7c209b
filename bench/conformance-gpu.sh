#!/usr/bin/env bash
# The ONNX node suites on the CUDA backend (issue 27's GPU conformance run), on the GPU machine from
# binaries built here:
#   bash bench/conformance-gpu.sh [BIN_DIR] [ONNX_1.12_DATA] [kiln_conformance args...]
# BIN_DIR holds kiln_conformance (default build/tests); ONNX_1.12_DATA the onnx 1.12 backend test
# data (default: Debian's libonnx-testdata, /usr/share/libonnx-testdata/data; carry a copy to a
# machine without it). The onnx 1.23 node suite is generated from the installed onnx wheel when
# Python has one. Each model runs through the default pipeline, then on the GPU at fp32 with CPU
# fallback forbidden; prints "SUITE: N passed, M failed, K skipped" and writes every non-pass's
# reason to $OUT/conformance-gpu.json (or build/conformance-gpu.json). Exits non-zero when any test
# fails (issue 27's target is 850 of the 932 onnx 1.12 node tests; bench/RESULTS.md has every run).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN="${1:-build/tests}"
DATA12="${2:-/usr/share/libonnx-testdata/data}"
shift 2 || shift $#
# shellcheck source=bench/gpu-env.sh
source bench/gpu-env.sh
nvidia-smi -L 2>/dev/null || echo "conformance-gpu: nvidia-smi not available"
RESULTS="${OUT:-build}"
mkdir -p "$RESULTS"
args=(--device cuda --pipeline --onnx-1.12 "$DATA12" --suite onnx-1.12/node --suite onnx-1.12/pytorch-converted
      --suite onnx-1.12/pytorch-operator --suite onnx-1.12/simple)
GEN=/tmp/kiln-onnx-1.23-node
if [[ -f "$GEN/.stamp" ]] || python3 tools/gen_onnx_tests.py "$GEN" 2>/tmp/kiln-gen-onnx.log; then
  touch "$GEN/.stamp"
  args+=(--onnx-1.23-node "$GEN" --suite onnx-1.23/node)
else
  echo "conformance-gpu: could not generate the onnx 1.23 node suite (no onnx wheel?); 1.12 only" >&2
fi
exec "$BIN/kiln_conformance" "${args[@]}" --json "$RESULTS/conformance-gpu.json" "$@"
