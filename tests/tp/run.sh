#!/usr/bin/env bash
# Tensor parallelism end to end (what `make tp` runs): bash tests/tp/run.sh build/kiln [--device cuda --ranks 1,2]
# tests/tp/check.py says what each check asserts. Needs python3 with onnx, numpy and onnxruntime
# (scripts/install-deps.sh).
set -euo pipefail
if [[ $# -lt 1 ]]; then
  echo "usage: $0 KILN_BINARY [--device cpu|cuda] [--ranks 1,2,4]" >&2
  exit 2
fi
KILN=$(realpath "$1")
shift
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kiln-tp.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
python3 "$HERE/check.py" "$KILN" "$TMP" "$@"
