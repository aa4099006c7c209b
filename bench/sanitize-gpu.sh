#!/usr/bin/env bash
# kiln's GPU kernels under compute-sanitizer (issue 30), in one device call:
#   bash bench/sanitize-gpu.sh BIN_DIR [TOOLS] [op-check args...]
# BIN_DIR holds kiln_gpu_op_check (built here, sm_90a). TOOLS is a ';'-separated list of memcheck,
# racecheck, initcheck, synccheck (default: all four); TOOL:ARGS runs that tool with its own
# op-check arguments (e.g. "racecheck:--filter attention"), else every tool gets the trailing args. Each tool runs the whole op harness (every case, its
# engine-file round trip, sessions sharing weights, device buffers) and prints compute-sanitizer's
# ERROR SUMMARY plus the harness's own pass count; logs under $OUT. Exits non-zero when a tool
# reports an error or the harness fails under it. TOOL_TIMEOUT (s, default 600) bounds each tool.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN=$(realpath "${1:?usage: sanitize-gpu.sh BIN_DIR [TOOLS] [op-check args...]}")
TOOLS=${2:-memcheck;racecheck;initcheck;synccheck}
shift 2 2>/dev/null || shift $#
OUT=${OUT:-/tmp/sanitize-gpu}
mkdir -p "$OUT"
# shellcheck source=bench/gpu-env.sh
source bench/gpu-env.sh
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
status=0
IFS=';' read -r -a SPECS <<<"$TOOLS"
for spec in "${SPECS[@]}"; do
  tool=${spec%%:*}
  args=("$@")
  if [[ "$spec" == *:* ]]; then read -r -a args <<<"${spec#*:}"; fi
  extra=()
  [[ "$tool" == racecheck ]] && extra=(--racecheck-report all)
  log="$OUT/$tool.log"
  start=$(date +%s)
  # --report-api-errors no: the harness's out_of_memory case fails an allocation on purpose (and
  # checks that the error is handled); API errors are the harness's to judge, device memory errors
  # the tool's.
  timeout "${TOOL_TIMEOUT:-600}" "$CS" --tool "$tool" --report-api-errors no --error-exitcode 99 --print-limit 50 \
    "${extra[@]}" "$BIN/kiln_gpu_op_check" "${args[@]}" >"$log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -1)
  harness=$(grep -E "^[0-9]+ passed, [0-9]+ failed" "$log" | tail -1)
  echo "$spec: ${summary:-no summary} | harness: ${harness:-no result} | exit $rc | ${secs}s"
  [[ $rc -ne 0 ]] && status=1 && grep -m 20 -E "=========  (Invalid|Uninitialized|Race|Barrier|Error|Program hit)" "$log"
done
exit $status
