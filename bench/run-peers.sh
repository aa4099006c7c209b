#!/usr/bin/env bash
# Peer benchmark, as the device command:
#   bash bench/run-peers.sh [KILN_BINARY] [extra peers.py args]
# e.g.  bash bench/run-peers.sh build/kiln --models resnet50,bert --batch1-only
# Results (ONNX files, .npy data, results.json, results.md) go to $OUT, else /tmp/kiln-peers;
# with $OUT set the log is also written to $OUT/peers.log. Exit code: peers.py's.
set -uo pipefail
cd "$(dirname "$0")/.."

kiln=build/kiln
if [[ $# -gt 0 && "$1" != -* ]]; then kiln=$1; shift; fi
out=${OUT:-/tmp/kiln-peers}
mkdir -p "$out"
export PYTHONUNBUFFERED=1

commit=()
if rev=$(git describe --always --dirty 2>/dev/null); then commit=(--commit "$rev"); fi
cmd=(python3 bench/peers.py --kiln "$kiln" --out "$out" ${commit[@]+"${commit[@]}"} "$@")

{
  nvidia-smi -L 2>/dev/null || echo "nvidia-smi: not available"
  echo "+ ${cmd[*]}"
} 2>&1 | if [[ -n "${OUT:-}" ]]; then tee "$OUT/peers.log"; else cat; fi

if [[ -n "${OUT:-}" ]]; then
  "${cmd[@]}" 2>&1 | tee -a "$OUT/peers.log"
  exit "${PIPESTATUS[0]}"
fi
exec "${cmd[@]}"
