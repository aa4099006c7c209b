#!/usr/bin/env bash
# Engine files through the CLI (`make engines`): `bash tests/engine/run.sh build/kiln`.
#
# Builds CPU engines of the bundled EfficientNet-Lite0 and of small models with a subgraph and
# integer/bool inputs, and checks that
#   - `kiln run model.kiln` writes outputs byte-identical to `kiln run model.onnx` (same inputs),
#   - `kiln inspect model.kiln` shows how it was built, `kiln compare model.kiln` passes at 0 tolerance,
#   - a damaged engine (truncated, one byte flipped, wrong magic, another format version, the old
#     JSON recipe, a directory, a missing file) is one error line naming the file and what is
#     wrong, exit 1, never a crash or a hang,
#   - well-formed engines built for something else (another device or GPU, a configuration field this
#     kiln does not know, META that is not JSON) are refused, saying which,
#   - flags that contradict an engine (--shapes, --batch, --device, precision) are refused,
#   - `kiln build -o` to an unwritable place leaves nothing behind.
set -u
if [[ $# -ne 1 ]]; then
  echo "usage: $0 KILN_BINARY" >&2
  exit 2
fi
KILN=$(realpath "$1") || exit 2
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kiln-engines.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
passed=0
failed=0
ok() { echo "ok   $1"; passed=$((passed + 1)); }
bad() { echo "FAIL $1: $2"; failed=$((failed + 1)); }

# expect_ok NAME CMD...: exit 0.
expect_ok() {
  local name=$1
  shift
  if timeout 300 "$@" >"$TMP/$name.out" 2>&1; then ok "$name"; else bad "$name" "exit $? ($(tr '\n' ' ' <"$TMP/$name.out" | cut -c1-400))"; fi
}
# expect_err NAME SUBSTRING CMD...: exit 1..125 (no signal, no timeout), one stderr line with SUBSTRING.
expect_err() {
  local name=$1 want=$2
  shift 2
  timeout 60 "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
  local rc=$?
  if (( rc == 0 || rc > 125 )); then
    bad "$name" "exit $rc, expected an error ($(tr '\n' ' ' <"$TMP/$name.err" | cut -c1-300))"
  elif ! grep -qF -- "$want" "$TMP/$name.err"; then
    bad "$name" "stderr lacks '$want': $(tr '\n' ' ' <"$TMP/$name.err" | cut -c1-300)"
  elif (( $(grep -c 'kiln: error:' "$TMP/$name.err") != 1 )); then
    bad "$name" "expected one error line: $(tr '\n' ' ' <"$TMP/$name.err" | cut -c1-300)"
  else
    ok "$name"
  fi
}
# same_outputs NAME DIR_A DIR_B: every .npy in A is byte-identical in B, and there is at least one.
same_outputs() {
  local name=$1 a=$2 b=$3 n=0 f
  for f in "$a"/*.npy; do
    [[ -f "$f" ]] || continue
    n=$((n + 1))
    if ! cmp -s "$f" "$b/$(basename "$f")"; then bad "$name" "$(basename "$f") differs"; return; fi
  done
  if (( n == 0 )); then bad "$name" "no outputs in $a"; else ok "$name ($n output(s) byte-identical)"; fi
}

M="$ROOT/models/efficientnet-lite0"
E="$TMP/effnet.kiln"
expect_ok build_cpu "$KILN" build "$M/model.onnx" --device cpu -o "$E"
expect_ok run_onnx "$KILN" run "$M/model.onnx" --device cpu --input "input=$M/chelsea.npy" --output-dir "$TMP/onnx-out"
expect_ok run_engine "$KILN" run "$E" --input "input=$M/chelsea.npy" --output-dir "$TMP/engine-out"
same_outputs effnet_identical "$TMP/onnx-out" "$TMP/engine-out"
expect_ok inspect_engine "$KILN" inspect "$E"
grep -q "device:    cpu" "$TMP/inspect_engine.out" && grep -q "input  *f32\[1,3,224,224\]" "$TMP/inspect_engine.out" \
  && ok inspect_engine_content || bad inspect_engine_content "$(head -c 400 "$TMP/inspect_engine.out")"
mkdir -p "$TMP/in" && cp "$M/chelsea.npy" "$TMP/in/input.npy"
expect_ok compare_engine "$KILN" compare "$E" --inputs "$TMP/in" --reference "$TMP/onnx-out" --rtol 0 --atol 0
expect_ok bench_engine "$KILN" bench "$E" --warmup 0 --iterations 2 --json "$TMP/bench_engine.json"
grep -Eq "^load: [0-9]+\.[0-9] ms$" "$TMP/bench_engine.out" &&
  python3 -c "import json, sys; sys.exit(0 if json.load(open(sys.argv[1]))['load_ms'] > 0 else 1)" "$TMP/bench_engine.json" \
  && ok bench_engine_load_time || bad bench_engine_load_time "$(head -c 400 "$TMP/bench_engine.out")"

# A model with an If whose branches read an outer value, an int64 input and a bool input.
python3 - "$TMP" <<'PY' || bad small_models "python could not write the models"
import sys, numpy as np, onnx
from onnx import helper as h, TensorProto as T
out = sys.argv[1]
then_g = h.make_graph([h.make_node("Relu", ["s"], ["t"])], "then", [], [h.make_tensor_value_info("t", T.FLOAT, [2, 3])])
else_g = h.make_graph([h.make_node("Neg", ["s"], ["e"])], "else", [], [h.make_tensor_value_info("e", T.FLOAT, [2, 3])])
g = h.make_graph(
    [h.make_node("Gather", ["w", "idx"], ["s"], axis=0, name="emb"),
     h.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g, name="branch"),
     h.make_node("ReduceSum", ["y"], ["r"], keepdims=0, name="sum")],
    "small",
    [h.make_tensor_value_info("idx", T.INT64, [2]), h.make_tensor_value_info("c", T.BOOL, [])],
    [h.make_tensor_value_info("y", T.FLOAT, [2, 3]), h.make_tensor_value_info("r", T.FLOAT, [])],
    [h.make_tensor("w", T.FLOAT, [40, 3], np.linspace(-2, 2, 120).astype(np.float32).ravel().tolist())])
onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), f"{out}/small.onnx")
np.save(f"{out}/idx.npy", np.array([3, 37], np.int64))
np.save(f"{out}/c.npy", np.array(False))
PY
S=(--input "idx=$TMP/idx.npy" --input "c=$TMP/c.npy")
expect_ok build_small "$KILN" build "$TMP/small.onnx" --device cpu -o "$TMP/small.kiln"
expect_ok run_small_onnx "$KILN" run "$TMP/small.onnx" --device cpu "${S[@]}" --output-dir "$TMP/small-onnx"
expect_ok run_small_engine "$KILN" run "$TMP/small.kiln" "${S[@]}" --output-dir "$TMP/small-engine"
same_outputs small_identical "$TMP/small-onnx" "$TMP/small-engine"
python3 -c "import numpy as np; np.save('$TMP/bad-idx.npy', np.array([3, 40], np.int64))"
expect_err small_index_out_of_range "node 'emb'" "$KILN" run "$TMP/small.kiln" --input "idx=$TMP/bad-idx.npy" \
  --input "c=$TMP/c.npy"
expect_err small_wrong_dtype "input 'idx'" "$KILN" run "$TMP/small.kiln" --input "idx=$M/chelsea.npy" --input "c=$TMP/c.npy"

# A dynamic engine: shape ranges at build (--shapes NAME:MIN..MAXx...), any shape in them at run
# time, byte-identical to the model run at that exact shape; a shape outside them, of another rank,
# or with a shared dim that differs between inputs is one error line naming the input and the dim.
python3 - "$TMP" <<'PY' || bad dyn_model "python could not write the model"
import sys, numpy as np, onnx
from onnx import helper as h, TensorProto as T
out = sys.argv[1]
rng = np.random.default_rng(7)
g = h.make_graph(
    [h.make_node("MatMul", ["x", "w"], ["xw"], name="proj"),
     h.make_node("Unsqueeze", ["mask", "axis"], ["m3"], name="m3"),
     h.make_node("Mul", ["xw", "m3"], ["y0"], name="masked"),
     h.make_node("Softmax", ["y0"], ["y"], axis=1, name="soft")],
    "dyn",
    [h.make_tensor_value_info("x", T.FLOAT, ["batch", "seq", 8]),
     h.make_tensor_value_info("mask", T.FLOAT, ["batch", "seq"])],
    [h.make_tensor_value_info("y", T.FLOAT, ["batch", "seq", 4])],
    [h.make_tensor("w", T.FLOAT, [8, 4], rng.standard_normal(32).astype(np.float32).tolist()),
     h.make_tensor("axis", T.INT64, [1], [2])])
onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), f"{out}/dyn.onnx")
for b, s in [(1, 4), (3, 7), (8, 16), (2, 17), (9, 4)]:
    np.save(f"{out}/x-{b}-{s}.npy", rng.standard_normal((b, s, 8)).astype(np.float32))
    np.save(f"{out}/mask-{b}-{s}.npy", (rng.random((b, s)) > 0.3).astype(np.float32))
np.save(f"{out}/x-rank2.npy", rng.standard_normal((3, 8)).astype(np.float32))
PY
D="$TMP/dyn.kiln"
expect_ok build_dynamic "$KILN" build "$TMP/dyn.onnx" --device cpu --shapes x:1..8x4..16@8x8 --report -o "$D"
grep -q "shape ranges: batch 1..8, seq 4..16@8" "$TMP/build_dynamic.out" && ok dynamic_report_ranges \
  || bad dynamic_report_ranges "$(grep -m1 'shape ranges' "$TMP/build_dynamic.out")"
expect_ok inspect_dynamic "$KILN" inspect "$D"
grep -q "x  *f32\[batch 1..8,seq 4..16,8\]" "$TMP/inspect_dynamic.out" && ok inspect_dynamic_ranges \
  || bad inspect_dynamic_ranges "$(grep -m1 ' x ' "$TMP/inspect_dynamic.out")"
for bs in 1-4 3-7 8-16; do
  b=${bs%-*} s=${bs#*-}
  expect_ok "dyn_run_onnx_$bs" "$KILN" run "$TMP/dyn.onnx" --device cpu --shapes "x:${b}x${s}x8" --shapes "mask:${b}x${s}" \
    --input "x=$TMP/x-$bs.npy" --input "mask=$TMP/mask-$bs.npy" --output-dir "$TMP/dyn-onnx-$bs"
  expect_ok "dyn_run_engine_$bs" "$KILN" run "$D" --input "x=$TMP/x-$bs.npy" --input "mask=$TMP/mask-$bs.npy" \
    --output-dir "$TMP/dyn-engine-$bs"
  same_outputs "dyn_identical_$bs" "$TMP/dyn-onnx-$bs" "$TMP/dyn-engine-$bs"
done
expect_err dyn_above_range "input 'x': dimension 1 ('seq') is 17, outside the engine's range 4..16" \
  "$KILN" run "$D" --input "x=$TMP/x-2-17.npy" --input "mask=$TMP/mask-2-17.npy"
expect_err dyn_batch_above_range "dimension 0 ('batch') is 9, outside the engine's range 1..8" \
  "$KILN" run "$D" --input "x=$TMP/x-9-4.npy" --input "mask=$TMP/mask-9-4.npy"
expect_err dyn_shared_dim "input 'mask': dimension 0 ('batch') is 1, but 3 in input 'x'" \
  "$KILN" run "$D" --input "x=$TMP/x-3-7.npy" --input "mask=$TMP/mask-1-4.npy"
expect_err dyn_rank "got shape [3,8] but the model expects f32[?,?,8]" "$KILN" run "$D" --input "x=$TMP/x-rank2.npy" --input "mask=$TMP/mask-1-4.npy"
expect_ok dyn_bench_at_shape "$KILN" bench "$D" --shapes x:3x5x8 --shapes mask:3x5 --warmup 0 --iterations 2
expect_ok dyn_run_random_at_shape "$KILN" run "$D" --shapes x:2x9x8 --shapes mask:2x9 --random-inputs --output-dir "$TMP/dyn-rand"
python3 -c "import numpy as np, sys; y = np.load('$TMP/dyn-rand/y.npy'); sys.exit(0 if y.shape == (2, 9, 4) else 1)" \
  && ok dyn_random_output_shape || bad dyn_random_output_shape "output shape is not (2, 9, 4)"
expect_err dyn_run_shape_outside "--shapes gives input 'x' dimension 1 = 20, outside the engine's 4..16" \
  "$KILN" run "$D" --shapes x:2x20x8 --random-inputs
expect_err dyn_range_on_fixed_dim "the model fixes it at 8" "$KILN" build "$TMP/dyn.onnx" --device cpu \
  --shapes x:1..8x4..16x4..8 -o "$TMP/bad.kiln"
expect_err dyn_range_conflict "shape ranges give dim 'batch' the range" "$KILN" build "$TMP/dyn.onnx" --device cpu \
  --shapes x:1..8x4..16x8 --shapes mask:1..4x4..16 -o "$TMP/bad.kiln"
expect_err dyn_range_backwards "shape range 8..1 for input 'x' dimension 0" "$KILN" build "$TMP/dyn.onnx" --device cpu \
  --shapes x:8..1x4..16x8 -o "$TMP/bad.kiln"
expect_err dyn_range_unknown_input "shape_ranges names input 'nosuch', but the model's inputs are 'x', 'mask'" \
  "$KILN" build "$TMP/dyn.onnx" --device cpu --shapes nosuch:1..4x8 -o "$TMP/bad.kiln"
expect_err dyn_range_not_number "dimension '1..z' is not" "$KILN" build "$TMP/dyn.onnx" --device cpu \
  --shapes x:1..zx4x8 -o "$TMP/bad.kiln"

# Damaged engine files.
python3 - "$E" "$TMP" <<'PY'
import struct, sys
src, out = sys.argv[1], sys.argv[2]
b = open(src, "rb").read()
open(f"{out}/truncated.kiln", "wb").write(b[: len(b) // 2])
open(f"{out}/header-only.kiln", "wb").write(b[:20])
flipped = bytearray(b); flipped[len(b) // 3] ^= 0x01
open(f"{out}/flipped.kiln", "wb").write(bytes(flipped))
open(f"{out}/magic.kiln", "wb").write(b"KILNENGX" + b[8:])
v9 = bytearray(b); v9[8:12] = struct.pack("<I", 9)
open(f"{out}/version.kiln", "wb").write(bytes(v9))
open(f"{out}/recipe.kiln", "w").write('{"format": "kiln-artifact-0", "onnx": "model.onnx"}\n')
open(f"{out}/onnx-renamed.kiln", "wb").write(open(src.replace("effnet.kiln", "small.onnx"), "rb").read())
open(f"{out}/empty.kiln", "wb").write(b"")
PY
expect_err damaged_truncated "truncated engine file" "$KILN" run "$TMP/truncated.kiln" --random-inputs
expect_err damaged_header_only "truncated engine file" "$KILN" run "$TMP/header-only.kiln" --random-inputs
expect_err damaged_flipped_byte "checksum mismatch" "$KILN" run "$TMP/flipped.kiln" --random-inputs
expect_err damaged_magic "not a kiln engine file" "$KILN" bench "$TMP/magic.kiln"
expect_err damaged_version "format version 9, this kiln reads version 1" "$KILN" run "$TMP/version.kiln" --random-inputs
expect_err damaged_old_recipe "older kiln" "$KILN" bench "$TMP/recipe.kiln"
expect_err damaged_onnx_renamed "not a kiln engine file" "$KILN" run "$TMP/onnx-renamed.kiln" --random-inputs
expect_err damaged_empty "not a kiln engine file" "$KILN" inspect "$TMP/empty.kiln"
expect_err damaged_inspect_flipped "checksum mismatch" "$KILN" inspect "$TMP/flipped.kiln"
expect_err engine_missing "cannot open" "$KILN" run "$TMP/nothere.kiln" --random-inputs
mkdir -p "$TMP/dir.kiln"
expect_err engine_directory "is a directory" "$KILN" run "$TMP/dir.kiln" --random-inputs

# Well-formed engines this kiln must refuse: META rewritten and the file re-sealed (patch_meta.py).
P="python3 $ROOT/tests/engine/patch_meta.py"
H100="{'gpu': 'NVIDIA H100 80GB HBM3', 'sm_major': 9, 'sm_minor': 0, 'cuda_runtime': 13000, 'cublaslt': 130100, 'cudnn': 91300}"
$P "$TMP/small.kiln" "$TMP/resealed.kiln" "meta"
expect_ok resealed_unchanged "$KILN" run "$TMP/resealed.kiln" "${S[@]}"
$P "$TMP/small.kiln" "$TMP/gpu.kiln" "dict(meta, device='cuda', target=$H100)"
# No GPU here, or (on a GPU machine) not this made-up GPU and library versions: refused either way;
# a kiln built without CUDA (the sanitizer lane's) says that instead.
WANT_GPU="this GPU engine cannot run here"
"$KILN" run "$TMP/gpu.kiln" "${S[@]}" 2>&1 | grep -qF "this kiln was built without CUDA" && WANT_GPU="built without CUDA"
expect_err gpu_engine_elsewhere "$WANT_GPU" "$KILN" run "$TMP/gpu.kiln" "${S[@]}"
$P "$TMP/small.kiln" "$TMP/gpu-notarget.kiln" "dict(meta, device='cuda')"
expect_err gpu_engine_no_target "without its target" "$KILN" run "$TMP/gpu-notarget.kiln" "${S[@]}"
$P "$TMP/small.kiln" "$TMP/tpu.kiln" "dict(meta, device='tpu')"
expect_err unknown_device "unknown device 'tpu'" "$KILN" run "$TMP/tpu.kiln" "${S[@]}"
$P "$TMP/small.kiln" "$TMP/newer-config.kiln" "dict(meta, config=dict(meta['config'], sparsity=True))"
expect_err unknown_config_field "unknown field 'sparsity'" "$KILN" run "$TMP/newer-config.kiln" "${S[@]}"
$P "$TMP/small.kiln" "$TMP/bad-tile.kiln" "dict(meta, config=dict(meta['config'], gemm_sm90_tile=48))"
expect_err config_value_out_of_range "gemm_sm90_tile 48" "$KILN" run "$TMP/bad-tile.kiln" "${S[@]}"
$P "$TMP/small.kiln" "$TMP/meta-not-json.kiln" "'{not json'"
expect_err meta_not_json "META section is not a JSON object" "$KILN" run "$TMP/meta-not-json.kiln" "${S[@]}"
expect_err meta_not_json_inspect "META section is not a JSON object" "$KILN" inspect "$TMP/meta-not-json.kiln"

# Flags an engine file cannot honour, and building from an engine.
expect_err engine_shapes_flag "--shapes" "$KILN" run "$E" --shapes input:2x3x224x224 --random-inputs
expect_err engine_batch_flag "--batch 8" "$KILN" bench "$E" --batch 8
expect_err engine_device_flag "--device cuda: the engine was built for cpu" "$KILN" run "$E" --device cuda --random-inputs
expect_err engine_precision_flag "--fp16: the engine was built with fp32" "$KILN" bench "$E" --fp16
expect_err build_from_engine "not the engine file" "$KILN" build "$E" -o "$TMP/again.kiln"
expect_err build_unwritable "cannot write" "$KILN" build "$TMP/small.onnx" --device cpu -o "$TMP/no/such/dir/m.kiln"
if [[ -e "$TMP/no" ]]; then bad build_unwritable_leaves_nothing "$TMP/no exists"; else ok build_unwritable_leaves_nothing; fi

# --deterministic (docs/determinism.md): the same bits at any thread count and on every run, for a
# model of one-group GroupNormalization (whose oneDNN statistics split one group across threads),
# InstanceNormalization, a convolution, a product with a long reduction and a softmax. The engine
# file records it; an engine built without it is refused when it is asked for.
python3 - "$TMP" <<'PY' || bad det_model "python could not write the model"
import sys, numpy as np, onnx
from onnx import helper as h, TensorProto as T, numpy_helper as nh
out = sys.argv[1]
r = np.random.default_rng(5)
c = lambda a, n: nh.from_array(np.asarray(a, np.float32), n)
nodes = [h.make_node("GroupNormalization", ["x", "gs", "gb"], ["g"], num_groups=1, epsilon=1e-5),
         h.make_node("Conv", ["g", "w"], ["cv"], pads=[1, 1, 1, 1]),
         h.make_node("InstanceNormalization", ["cv", "is", "ib"], ["n"]),
         h.make_node("Reshape", ["n", "shape"], ["flat"]),
         h.make_node("MatMul", ["flat", "m"], ["p"]),
         h.make_node("Softmax", ["p"], ["y"], axis=-1)]
g = h.make_graph(nodes, "det", [h.make_tensor_value_info("x", T.FLOAT, [1, 8, 32, 32])],
                 [h.make_tensor_value_info("y", T.FLOAT, [1, 10])],
                 [c(r.standard_normal(8), "gs"), c(r.standard_normal(8), "gb"), c(r.standard_normal((8, 8, 3, 3)) * 0.2, "w"),
                  c(r.standard_normal(8), "is"), c(r.standard_normal(8), "ib"),
                  nh.from_array(np.array([1, 8 * 32 * 32], np.int64), "shape"), c(r.standard_normal((8192, 10)) * 0.02, "m")])
onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 21)]), f"{out}/det.onnx")
np.save(f"{out}/det-x.npy", r.standard_normal((1, 8, 32, 32)).astype(np.float32) * 3 + 1)
PY
expect_ok det_build "$KILN" build "$TMP/det.onnx" --device cpu --deterministic --report -o "$TMP/det.kiln"
if grep -q "^deterministic: yes" "$TMP/det_build.out"; then ok det_report; else bad det_report "the build report does not say deterministic"; fi
for t in 1 2 3 5; do
  expect_ok "det_run_t$t" env OMP_NUM_THREADS=$t "$KILN" run "$TMP/det.kiln" --input "x=$TMP/det-x.npy" --output-dir "$TMP/det-$t"
  [[ $t == 1 ]] || same_outputs "det_threads_1_vs_$t" "$TMP/det-1" "$TMP/det-$t"
done
expect_ok det_run_again "$KILN" run "$TMP/det.kiln" --input "x=$TMP/det-x.npy" --output-dir "$TMP/det-again"
same_outputs det_run_to_run "$TMP/det-1" "$TMP/det-again"
expect_ok det_inspect "$KILN" inspect "$TMP/det.kiln"
if grep -q '"deterministic":true' "$TMP/det_inspect.out"; then ok det_recorded; else bad det_recorded "inspect shows no deterministic: true"; fi
expect_err det_engine_without_it "--deterministic: the engine was built without it" "$KILN" run "$E" --deterministic --random-inputs

# --target edge: the CPU, a leading symbolic dim bound to 1, the session's memory in the report and
# held to --memory-budget (an engine over it is a one-line error before anything runs).
python3 - "$TMP" <<'PY' || bad edge_model "python could not write the model"
import sys, numpy as np, onnx
from onnx import helper as h, TensorProto as T, numpy_helper as nh
w = nh.from_array(np.random.default_rng(6).standard_normal((256, 1024)).astype(np.float32), "w")
g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"]), h.make_node("Relu", ["y"], ["z"])], "edge",
                 [h.make_tensor_value_info("x", T.FLOAT, ["N", 256])], [h.make_tensor_value_info("z", T.FLOAT, ["N", 1024])], [w])
onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), f"{sys.argv[1]}/edge.onnx")
PY
expect_ok edge_build "$KILN" build "$TMP/edge.onnx" --target edge --memory-budget 3 --report -o "$TMP/edge.kiln"
if grep -q "^target: edge" "$TMP/edge_build.out" && grep -q "^device: cpu" "$TMP/edge_build.out" &&
   grep -q "^memory per session: weights 1.0 MiB, reordered copies .* MiB, activations 0.0 MiB at their peak (budget 3.0 MiB)" "$TMP/edge_build.out"; then
  ok edge_report
else
  bad edge_report "$(grep -E '^(target|device|memory)' "$TMP/edge_build.out" | tr '\n' ' ')"
fi
expect_ok edge_inspect "$KILN" inspect "$TMP/edge.kiln"
if grep -q "f32\[1,256\]" "$TMP/edge_inspect.out" && grep -q '"target":"edge"' "$TMP/edge_inspect.out"; then ok edge_batch_1; else bad edge_batch_1 "$(head -c 600 "$TMP/edge_inspect.out" | tr '\n' ' ')"; fi
expect_err edge_over_budget "over the memory budget of 1.0 MiB" "$KILN" build "$TMP/edge.onnx" --target edge --memory-budget 1 -o "$TMP/edge-big.kiln"
if [[ -e "$TMP/edge-big.kiln" ]]; then bad edge_over_budget_leaves_nothing "the engine file was written"; else ok edge_over_budget_leaves_nothing; fi
expect_err edge_tensor_parallel "target edge runs on one device" "$KILN" build "$TMP/edge.onnx" --target edge --tensor-parallel 2 --batch 2

echo "engines: $passed passed, $failed failed"
(( failed == 0 ))
