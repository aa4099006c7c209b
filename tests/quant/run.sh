#!/usr/bin/env bash
# `kiln quantize` end to end (what `make quant` runs): bash tests/quant/run.sh build/kiln
#
# On the bundled EfficientNet-Lite0 with samples made from its two photos: int8 (entropy) and fp8
# (minmax) QDQ models are written, checked by onnx.checker, run by onnxruntime and by kiln, and
# compared (tests/quant/check.py says what each check asserts); and the accuracy budget on a small
# model. Needs python3 with onnx, numpy and onnxruntime (scripts/install-deps.sh).
set -euo pipefail
if [[ $# -ne 1 ]]; then
  echo "usage: $0 KILN_BINARY" >&2
  exit 2
fi
KILN=$(realpath "$1")
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kiln-quant.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
exec python3 "$HERE/check.py" "$KILN" "$HERE/../../models/efficientnet-lite0" "$TMP"
