#!/usr/bin/env bash
# The sanitizer lane (`make test-sanitize`): kiln built with clang, AddressSanitizer and
# UndefinedBehaviorSanitizer (-fno-sanitize-recover=all: the first report fails the run), then
#   - the unit tests (with the pass goldens, tests/passes, which they read),
#   - the bad-input suite (tests/error) and the engine-file suite (tests/engine) against the
#     sanitized CLI,
#   - the conformance suites on the CPU backend through the default pass pipeline
#     (CONFORMANCE=all, the default; CONFORMANCE=sample runs the ONNX 1.12 suites only).
# CPU code only (KILN_CUDA=OFF): the CUDA kernels get compute-sanitizer on the GPU machine
# (bench/sanitize-gpu.sh). Any sanitizer report makes the step that hit it fail, and the lane
# exits non-zero; reports are in BUILD_DIR/*.log.
#
#   bash tests/sanitize/run.sh [BUILD_DIR]          (default build-asan; reuses its build)
#   bash tests/sanitize/run.sh build-fuzz sample     (`make test`: reuses the fuzz build, which is
#       already compiled with ASan + UBSan, adds the CLI and the unit tests to it and runs the unit,
#       bad-input and engine-file suites; no conformance)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
BUILD="${1:-build-asan}"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
CXX_BIN="${CXX:-clang++}"
if ! "$CXX_BIN" --version 2>/dev/null | grep -qi clang; then
  echo "sanitize: needs clang++ (apt-get install clang); CXX=$CXX_BIN is not clang" >&2
  exit 2
fi
JOBS="${JOBS:-$(nproc)}"
SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
MODE="${2:-all}"
TARGETS=(kiln kiln_unit_tests kiln_conformance)
mkdir -p "$BUILD"
if [[ "$MODE" == sample ]]; then
  # The fuzz build's configuration (tests/fuzz/run.sh) is kept: ASan + UBSan everywhere.
  [[ -f "$BUILD/CMakeCache.txt" ]] || { echo "sanitize: $BUILD is not configured (run make fuzz first)" >&2; exit 2; }
  TARGETS=(kiln kiln_unit_tests)
else
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_CXX_COMPILER="$CXX_BIN" -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_CXX_FLAGS="$SAN" -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" -DCMAKE_EXE_LINKER_FLAGS="$SAN" \
    -DCMAKE_SHARED_LINKER_FLAGS="$SAN" -DKILN_CUDA=OFF >"$BUILD/sanitize-configure.log" 2>&1 || {
    cat "$BUILD/sanitize-configure.log" >&2
    echo "sanitize: cmake configure failed" >&2
    exit 2
  }
fi
cmake --build "$BUILD" --target "${TARGETS[@]}" -j "$JOBS" >"$BUILD/sanitize-build.log" 2>&1 || {
  tail -30 "$BUILD/sanitize-build.log" >&2
  echo "sanitize: build failed (log: $BUILD/sanitize-build.log)" >&2
  exit 2
}

# Reports abort the process with a non-zero exit, which each suite counts as a failure.
# intercept_tls_get_addr=0: the sanitizer runtime of clang 14 (up to LLVM 16) takes a dynamic TLS block
# that malloc happened to place at a certain page offset for a pre-2.25 glibc header and reads a
# bogus range from it, so the leak check at exit dies ("Tracer caught signal 11") with no leak found,
# depending on layout (google/sanitizers#1322). Leaks are still checked, dynamic TLS aside.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1:symbolize=1:intercept_tls_get_addr=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1:symbolize=1}"
status=0
step() {  # step NAME COMMAND...: runs it, its output to BUILD/NAME.log, and says how it went
  local name=$1
  shift
  local t0=$SECONDS
  "$@" >"$BUILD/$name.log" 2>&1
  local rc=$?
  local reports
  reports=$(grep -cE "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:" "$BUILD/$name.log")
  echo "sanitize: $name: exit $rc, $reports sanitizer report(s), $((SECONDS - t0)) s ($(tail -1 "$BUILD/$name.log"))"
  if [[ $rc -ne 0 || $reports -ne 0 ]]; then
    status=1
    grep -m 5 -A 12 -E "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:" "$BUILD/$name.log"
  fi
}
step unit "$BUILD/tests/kiln_unit_tests" --gtest_brief=1
step errors bash tests/error/run.sh "$BUILD/kiln"
step engines bash tests/engine/run.sh "$BUILD/kiln"
ONNX123="$ROOT/build/onnx-1.23-node"
if [[ "$MODE" == sample ]]; then
  :  # the conformance suites run under the sanitizers in make test-sanitize
elif [[ "${CONFORMANCE:-all}" == all && -f "$ONNX123/.stamp" ]]; then
  step conformance "$BUILD/tests/kiln_conformance" --onnx-1.23-node "$ONNX123" --jobs "$JOBS" --pipeline \
    --check-targets tests/conformance/targets.txt
else
  step conformance "$BUILD/tests/kiln_conformance" --jobs "$JOBS" --pipeline
fi
if [[ $status -eq 0 ]]; then echo "sanitize ($MODE): no sanitizer reports"; fi
exit $status
