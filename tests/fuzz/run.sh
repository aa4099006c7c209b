#!/usr/bin/env bash
# Build and run the libFuzzer targets: the ONNX importer and graph passes
# (tests/fuzz/fuzz_import.cc), the .npy reader that `kiln run --input` uses
# (tests/fuzz/fuzz_npy.cc), models run on the CPU backend (tests/fuzz/fuzz_run.cc), and the engine
# file loader (tests/fuzz/fuzz_engine.cc, seeded from tests/fuzz/corpus-engine), the IR text
# parser (tests/fuzz/fuzz_ir_text.cc, seeded with the pass goldens' graphs) and the KServe v2
# request decoder of `kiln serve` (tests/fuzz/fuzz_kserve.cc, seeded from tests/fuzz/corpus-kserve) and
# its gRPC request decoder (tests/fuzz/fuzz_grpc.cc, seeded from tests/fuzz/corpus-grpc), and
# calibration folders with the QDQ models `kiln quantize` writes from them (tests/fuzz/fuzz_calib.cc,
# seeded here with every folder layout and the usual mistakes).
#
#   bash tests/fuzz/run.sh [BUILD_DIR] [SECONDS] [each]  (make fuzz: build-fuzz, 45 s; make
#                                                        fuzz-long SECONDS=N: N s for every target)
#
# Configures BUILD_DIR with clang and ASan+UBSan+libFuzzer instrumentation, builds only the fuzz
# targets, seeds the importer's corpus from Debian's libonnx-testdata and the reader's with .npy
# files of every dtype numpy writes, replays earlier findings, then fuzzes the importer for SECONDS
# and the reader, the CPU runs and the engine loader for a quarter of that each. Exits non-zero on any finding
# (crash, sanitizer report, leak, timeout, OOM); the inputs are kept in BUILD_DIR/artifacts
# (importer), BUILD_DIR/artifacts-npy and BUILD_DIR/artifacts-run. Re-running reuses the build and
# the grown corpora. tests/fuzz/corpus holds committed regression models, read by the importer and
# run targets every time, and QDQ models as users bring them (onnxruntime's quantize_static S8S8 and
# U8S8 per channel, kiln's own int8 and FP8 E4M3: grouped and plain convolutions, MatMul, Gemm).
#
# Layout of BUILD_DIR:
#   tests/kiln_fuzz_import   the importer fuzzer (replay one input: tests/kiln_fuzz_import FILE)
#   tests/kiln_fuzz_npy      the .npy reader fuzzer (likewise)
#   tests/kiln_fuzz_run      the CPU run fuzzer (likewise)
#   tests/kiln_fuzz_engine   the engine-file loader fuzzer (likewise)
#   fuzz-seeds/, npy-seeds/  seeds (regenerated each run; the run target shares fuzz-seeds/)
#   fuzz-corpus/, npy-corpus/, run-corpus/  the corpora libFuzzer grows (kept between runs)
#   artifacts/, artifacts-npy/, artifacts-run/  crash-*, leak-*, timeout-*, oom-*; fixed/ below once they pass
#   fuzz.log, fuzz-npy.log, fuzz-run.log   the fuzzers' output of the last run
#
# Environment: KILN_FUZZ_STRICT=1 also makes "imported but verify_graph fails" and a failed text
# round-trip findings (see fuzz_import.cc); KILN_FUZZ_ARGS adds libFuzzer flags; CC/CXX pick the
# compilers (default clang/clang++).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
BUILD="${1:-build-fuzz}"
DURATION="${2:-60}"
MODE="${3:-}"  # "each": every target fuzzes for SECONDS (make fuzz-long); default: the others a quarter
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
if ! [[ "$DURATION" =~ ^[0-9]+$ ]]; then
  echo "usage: $0 [BUILD_DIR] [SECONDS]" >&2
  exit 2
fi

CXX_BIN="${CXX:-clang++}"
if ! command -v "$CXX_BIN" >/dev/null || ! "$CXX_BIN" --version 2>/dev/null | grep -qi clang; then
  echo "fuzz: needs clang++ with libFuzzer (apt-get install clang); CXX=$CXX_BIN is not clang" >&2
  exit 2
fi

# ---- configure + build (incremental) ---------------------------------------------------------
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
mkdir -p "$BUILD"
cmake -S "$ROOT" -B "$BUILD" \
  -DCMAKE_CXX_COMPILER="$CXX_BIN" \
  -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link $SAN" \
  -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" \
  -DCMAKE_EXE_LINKER_FLAGS="$SAN" \
  -DCMAKE_PROJECT_INCLUDE="$ROOT/tests/fuzz/fuzz.cmake" \
  -DKILN_FUZZ=ON -DKILN_CUDA=OFF >"$BUILD/fuzz-configure.log" 2>&1 || {
  cat "$BUILD/fuzz-configure.log" >&2
  echo "fuzz: cmake configure failed (log: $BUILD/fuzz-configure.log)" >&2
  exit 2
}
cmake --build "$BUILD" --target kiln_fuzz_import kiln_fuzz_npy kiln_fuzz_run kiln_fuzz_engine kiln_fuzz_ir_text kiln_fuzz_kserve kiln_fuzz_grpc kiln_fuzz_calib -j "$(nproc)"
for t in kiln_fuzz_import kiln_fuzz_npy kiln_fuzz_run kiln_fuzz_engine kiln_fuzz_ir_text kiln_fuzz_kserve kiln_fuzz_grpc \
         kiln_fuzz_calib; do
  [[ -x "$BUILD/tests/$t" ]] || { echo "fuzz: $BUILD/tests/$t was not built" >&2; exit 2; }
done

# ---- seeds -----------------------------------------------------------------------------------
# Small real models from libonnx-testdata: a curated set covering subgraphs (If/Loop/Scan),
# sequences, optionals, strings, initializers, ai.onnx.ml and training ops, topped up with an even
# spread over the rest. Deterministic; every file < 20 KB.
SEEDS="$BUILD/fuzz-seeds"
CORPUS="$BUILD/fuzz-corpus"
ARTIFACTS="$BUILD/artifacts"
rm -rf "$SEEDS"
mkdir -p "$SEEDS" "$CORPUS" "$ARTIFACTS"
TESTDATA=""
if command -v dpkg >/dev/null && dpkg -L libonnx-testdata >/dev/null 2>&1; then
  TESTDATA="$(dpkg -L libonnx-testdata | grep -m1 '/data/node$' || true)"
fi
[[ -n "$TESTDATA" && -d "$TESTDATA" ]] || TESTDATA=/usr/share/libonnx-testdata/data/node
MAX_SEEDS=48
if [[ -d "$TESTDATA" ]]; then
  CURATED=(
    test_if test_if_seq test_if_opt test_loop11 test_loop13_seq test_loop16_seq_none
    test_scan_sum test_scan9_sum test_sequence_map_add_2_sequences test_sequence_insert_at_back
    test_optional_get_element test_optional_has_element_empty test_constant test_constantofshape_int_zeros
    test_cast_FLOAT_to_STRING test_castlike_FLOAT_to_BFLOAT16_expanded test_strnormalizer_export_monday_casesensintive_lower
    test_conv_with_strides_padding test_convtranspose_output_shape test_lstm_with_peepholes test_gru_seq_length
    test_dequantizelinear_axis test_quantizelinear test_layer_normalization_4d_axis1_expanded test_einsum_batch_diagonal
    test_gathernd_example_int32_batch_dim1 test_nonmaxsuppression_two_classes test_resize_downsample_scales_linear
    test_split_variable_parts_1d test_reshape_allowzero_reordered test_slice_default_steps test_range_float_type_positive_delta_expanded
    test_ai_onnx_ml_label_encoder_string_int test_ai_onnx_ml_binarizer test_tfidfvectorizer_tf_batch_onlybigrams_skip5
    test_adagrad_multiple test_momentum test_bernoulli_seed_expanded test_dft_axis test_stft
  )
  n=0
  add_seed() {  # add_seed DIR: copies DIR/model.onnx when present and small
    local f="$1/model.onnx" name
    name="$(basename "$1")"
    [[ -f "$f" && ! -e "$SEEDS/$name.onnx" ]] || return 1
    (( $(stat -c %s "$f") < 20480 )) || return 1
    cp "$f" "$SEEDS/$name.onnx"
    n=$((n + 1))
  }
  for t in "${CURATED[@]}"; do add_seed "$TESTDATA/$t" || true; done
  mapfile -t ALL < <(find "$TESTDATA" -mindepth 1 -maxdepth 1 -type d | LC_ALL=C sort)
  if (( ${#ALL[@]} > 0 && n < MAX_SEEDS )); then
    step=$(( ${#ALL[@]} / (MAX_SEEDS - n) + 1 ))
    for (( i = 0; i < ${#ALL[@]} && n < MAX_SEEDS; i += step )); do add_seed "${ALL[$i]}" || true; done
  fi
  # PyTorch's converted modules hold their weights as initializers: what the fast CPU backend's
  # oneDNN steps take (the node tests feed weights as inputs, which stay on the reference kernels).
  for d in "$(dirname "$TESTDATA")"/pytorch-converted/*; do add_seed "$d" || true; done
  echo "fuzz: $n seed models from $TESTDATA and its pytorch-converted neighbour"
else
  echo "fuzz: warning: libonnx-testdata not installed; fuzzing from the kept corpus only" >&2
fi
# .npy seeds: every dtype kiln reads, C and Fortran order, rank 0..4, format versions 1 and 2.
NPY_SEEDS="$BUILD/npy-seeds"
rm -rf "$NPY_SEEDS"
mkdir -p "$NPY_SEEDS"
python3 - "$NPY_SEEDS" <<'PY'
import os, sys
import numpy as np
from numpy.lib import format as npf
out = sys.argv[1]
rng = np.random.default_rng(0)
shapes = [(), (3,), (2, 3), (2, 1, 3), (1, 2, 2, 2)]
for dt in ["<f4", "<f8", "<f2", "<i8", "<i4", "<i2", "|i1", "|u1", "<u2", "<u4", "<u8", "|b1", ">f4"]:
    for i, shape in enumerate(shapes):
        a = (rng.standard_normal(shape) * 10).astype(dt)
        np.save(os.path.join(out, f"{dt.strip('<>|')}_{i}{'_be' if dt[0] == '>' else ''}.npy"), a)
np.save(os.path.join(out, "fortran.npy"), np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)))
with open(os.path.join(out, "v2.npy"), "wb") as f:
    npf.write_array(f, np.ones((2, 2), np.float32), version=(2, 0))
np.save(os.path.join(out, "empty.npy"), np.zeros((0, 3), np.float32))
PY
# Committed regression inputs (if any) are read as well, never written to.
EXTRA_CORPORA=()
[[ -d "$ROOT/tests/fuzz/corpus" ]] && EXTRA_CORPORA+=("$ROOT/tests/fuzz/corpus")

# intercept_tls_get_addr=0: tests/sanitize/run.sh says why (a sanitizer-runtime bug, not a leak).
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:symbolize=1:intercept_tls_get_addr=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1:symbolize=1}"
command -v llvm-symbolizer >/dev/null && export ASAN_SYMBOLIZER_PATH="$(command -v llvm-symbolizer)"

FLAGS=(-rss_limit_mb=2048 -timeout=10 -max_len=65536)

# ---- replay earlier findings, then fuzz -------------------------------------------------------
shopt -s nullglob
# fuzz_target NAME SECONDS ARTIFACTS LOG CORPUS...: replays NAME's earlier findings, fuzzes it for
# SECONDS; returns non-zero on any finding.
fuzz_target() {
  local name="$1" secs="$2" artifacts="$3" log="$4"
  shift 4
  local fuzzer="$BUILD/tests/$name" a
  mkdir -p "$artifacts"
  local old=("$artifacts"/crash-* "$artifacts"/leak-* "$artifacts"/timeout-* "$artifacts"/oom-* "$artifacts"/slow-unit-*)
  local still=()
  for a in "${old[@]}"; do
    [[ "$a" == *.replay.log ]] && continue
    if "$fuzzer" "${FLAGS[@]}" "$a" >"$a.replay.log" 2>&1; then
      mkdir -p "$artifacts/fixed"
      mv "$a" "$artifacts/fixed/"
      rm -f "$a.replay.log"
      echo "fuzz: earlier finding $(basename "$a") of $name no longer reproduces (moved to $artifacts/fixed/)"
    else
      still+=("$a")
    fi
  done
  if (( ${#still[@]} > 0 )); then
    for a in "${still[@]}"; do
      echo "---- $a (log: $a.replay.log)"
      grep -E "ERROR: |SUMMARY: |runtime error|kiln: |kiln_fuzz_[a-z]*: |^    #[0-9] " "$a.replay.log" | head -20 || true
    done
    echo "fuzz: ${#still[@]} earlier finding(s) of $name still reproduce: ${still[*]}"
    return 1
  fi

  echo "fuzz: running $fuzzer for ${secs}s (log: $log)"
  local start rc elapsed runs cov findings
  start=$(date +%s)
  set +e
  # shellcheck disable=SC2086
  timeout --kill-after=30 $((secs + 300)) "$fuzzer" "${FLAGS[@]}" \
    -max_total_time="$secs" -print_final_stats=1 -artifact_prefix="$artifacts/" \
    ${KILN_FUZZ_ARGS:-} "$@" >"$log" 2>&1
  rc=$?
  set -e
  elapsed=$(( $(date +%s) - start ))

  runs="$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$log" | tail -1)"
  [[ -n "$runs" ]] || runs="$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$log" | tail -1)"
  [[ -n "$runs" ]] || runs="?"
  cov="$(grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[0-9a-zA-Z]+' "$log" | tail -1 || true)"
  local new=("$artifacts"/crash-* "$artifacts"/leak-* "$artifacts"/timeout-* "$artifacts"/oom-* "$artifacts"/slow-unit-*)
  findings=0
  for a in "${new[@]}"; do [[ "$a" == *.replay.log ]] || findings=$((findings + 1)); done

  if (( rc == 0 && findings == 0 )); then
    echo "fuzz: $name: $runs runs in ${elapsed} s, 0 findings (${cov:-no coverage line}; corpus $1)"
    return 0
  fi
  echo "---- fuzzer output (tail of $log)"
  grep -E "ERROR: |SUMMARY: |runtime error|kiln: |kiln_fuzz_[a-z]*: |^    #[0-9]+ |Test unit written|out-of-memory|timeout" "$log" | head -40 || tail -40 "$log"
  if (( findings == 0 )); then
    echo "fuzz: $name: $runs runs in ${elapsed} s, fuzzer exited with status $rc and wrote no artifact (see $log)"
  else
    echo "fuzz: $name: $runs runs in ${elapsed} s, $findings finding(s): ${new[*]} (replay: $fuzzer FILE)"
  fi
  return 1
}

NPY_CORPUS="$BUILD/npy-corpus" RUN_CORPUS="$BUILD/run-corpus" ENGINE_CORPUS="$BUILD/engine-corpus"
mkdir -p "$NPY_CORPUS" "$RUN_CORPUS" "$ENGINE_CORPUS"
QUARTER=$(( DURATION / 4 > 5 ? DURATION / 4 : 5 ))
[[ "$MODE" == each ]] && QUARTER=$DURATION
# IR text seeds: every graph of the pass goldens, one file each.
IR_SEEDS="$BUILD/ir-seeds" IR_CORPUS="$BUILD/ir-corpus"
rm -rf "$IR_SEEDS"
mkdir -p "$IR_SEEDS" "$IR_CORPUS"
python3 - "$ROOT/tests/passes" "$IR_SEEDS" <<'PY'
import os, re, sys
src, out = sys.argv[1:3]
n = 0
for name in sorted(os.listdir(src)):
    if not name.endswith(".kir"):
        continue
    text = open(os.path.join(src, name)).read()
    for m in re.finditer(r"^graph .*?^}$", text, re.S | re.M):
        n += 1
        open(os.path.join(out, f"{name[:-4]}_{n}.kir"), "w").write(m.group(0) + "\n")
PY
status=0
fuzz_target kiln_fuzz_import "$DURATION" "$ARTIFACTS" "$BUILD/fuzz.log" "$CORPUS" "$SEEDS" "${EXTRA_CORPORA[@]}" || status=1
fuzz_target kiln_fuzz_npy "$QUARTER" "$BUILD/artifacts-npy" "$BUILD/fuzz-npy.log" "$NPY_CORPUS" "$NPY_SEEDS" || status=1
fuzz_target kiln_fuzz_run "$QUARTER" "$BUILD/artifacts-run" "$BUILD/fuzz-run.log" "$RUN_CORPUS" "$SEEDS" \
  "${EXTRA_CORPORA[@]}" || status=1
fuzz_target kiln_fuzz_engine "$QUARTER" "$BUILD/artifacts-engine" "$BUILD/fuzz-engine.log" "$ENGINE_CORPUS" \
  "$ROOT/tests/fuzz/corpus-engine" || status=1
fuzz_target kiln_fuzz_ir_text "$QUARTER" "$BUILD/artifacts-ir" "$BUILD/fuzz-ir.log" "$IR_CORPUS" "$IR_SEEDS" || status=1
KSERVE_CORPUS="$BUILD/kserve-corpus"
mkdir -p "$KSERVE_CORPUS"
fuzz_target kiln_fuzz_kserve "$QUARTER" "$BUILD/artifacts-kserve" "$BUILD/fuzz-kserve.log" "$KSERVE_CORPUS" \
  "$ROOT/tests/fuzz/corpus-kserve" || status=1
GRPC_CORPUS="$BUILD/grpc-corpus"
mkdir -p "$GRPC_CORPUS"
fuzz_target kiln_fuzz_grpc "$QUARTER" "$BUILD/artifacts-grpc" "$BUILD/fuzz-grpc.log" "$GRPC_CORPUS" \
  "$ROOT/tests/fuzz/corpus-grpc" || status=1
# Calibration folders in fuzz_calib.cc's record format: the three layouts calibration.h reads, each
# quantization option, and the mistakes users make (wrong dtype, shape or name, NaN, constant data).
CALIB_SEEDS="$BUILD/calib-seeds" CALIB_CORPUS="$BUILD/calib-corpus"
rm -rf "$CALIB_SEEDS"
mkdir -p "$CALIB_SEEDS" "$CALIB_CORPUS"
python3 - "$CALIB_SEEDS" <<'PY'
import io, os, struct, sys
import numpy as np
out = sys.argv[1]
rng = np.random.default_rng(1)
def npy(a):
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()
def seed(name, options, files):
    data = bytes([options])
    for path, a in files:
        body = a if isinstance(a, bytes) else npy(a)
        data += bytes([len(path)]) + path.encode() + struct.pack("<I", len(body)) + body
    open(os.path.join(out, name), "wb").write(data)
img = lambda *lead: rng.standard_normal(lead + (3, 6, 6)).astype(np.float32)
off = lambda *lead: rng.standard_normal(lead + (10,)).astype(np.float32)
per_sample = [(f"s{i}/{n}", a) for i in range(3) for n, a in (("image.npy", img(1)), ("offset_1.npy", off(1)))]
for opt in (0x00, 0x01, 0x02, 0x04, 0x05, 0x08, 0x10, 0x20, 0x31):
    seed(f"per-sample-{opt:02x}", opt, per_sample)
seed("stacked-new-axis", 0x00, [("image.npy", img(4, 1)), ("offset_1.npy", off(4, 1))])
seed("stacked-own-axis", 0x04, [("image.npy", img(4)), ("offset_1.npy", off(4))])
seed("wrong-dtype", 0x00, [("image.npy", img(2).astype(np.float64)), ("offset_1.npy", off(2))])
seed("wrong-shape", 0x00, [("image.npy", rng.standard_normal((2, 3, 5, 6)).astype(np.float32)), ("offset_1.npy", off(2))])
nan = img(2); nan[1, 2, 3, 4] = np.nan
seed("nan", 0x00, [("image.npy", nan), ("offset_1.npy", off(2))])
seed("constant", 0x02, [("image.npy", np.ones((2, 3, 6, 6), np.float32)), ("offset_1.npy", np.ones((2, 10), np.float32))])
seed("missing-input", 0x00, [("s0/image.npy", img(1))])
seed("row-mismatch", 0x00, [("image.npy", img(3)), ("offset_1.npy", off(2))])
seed("truncated", 0x00, [("image.npy", npy(img(2))[:200]), ("offset_1.npy", off(2))])
seed("empty-folder", 0x00, [])
PY
fuzz_target kiln_fuzz_calib "$QUARTER" "$BUILD/artifacts-calib" "$BUILD/fuzz-calib.log" "$CALIB_CORPUS" "$CALIB_SEEDS" || status=1
exit "$status"
