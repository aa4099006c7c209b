#!/usr/bin/env bash
# The CUDA op harness on the GPU machine. Builds nothing: build here (`make build`, sm_90a), carry
# the binaries, then run
#   bash bench/gpu-check.sh [BIN_DIR] [kiln_gpu_op_check args...]
# BIN_DIR holds kiln_gpu_op_check (default build/tests). Prints one line per case and precision,
# then `N passed, M failed`; exits non-zero on any failure.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN="${1:-build/tests}"
shift || true
# shellcheck source=bench/gpu-env.sh
source bench/gpu-env.sh
nvidia-smi -L 2>/dev/null || echo "gpu-check: nvidia-smi not available"
exec "$BIN/kiln_gpu_op_check" "$@"
