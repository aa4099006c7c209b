#!/usr/bin/env bash
# Where a dynamic GPU engine's time goes at a shape off its tuning grid, in one device call:
# `bash bench/dynamic-profile.sh BIN_DIR MODEL SHAPE...` (MODEL resnet50|bert as bench/dynamic_check.py
# exports it; SHAPE as `kiln bench --shapes` takes it, repeatable). Builds the dynamic engine, then
# `kiln bench --profile` of it and of a static engine at the shape, and prints both "profile by kind"
# tables and the plan reports' kernel lines side by side. Results under $OUT.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN=$(realpath "${1:?usage: dynamic-profile.sh BIN_DIR MODEL SHAPE...}")
MODEL=${2:?model}
shift 2
OUT=${OUT:-/tmp/dynamic-profile}
mkdir -p "$OUT"
# shellcheck source=bench/gpu-env.sh
source bench/gpu-env.sh
W=/tmp/dynamic-profile-work
mkdir -p "$W"
python3 -c "import sys; sys.path.insert(0, 'bench'); import dynamic_check as d; d.export('$MODEL', '$W')" >/dev/null 2>&1
python3 -c "import sys; sys.path.insert(0, 'bench'); import dynamic_check as d; print(' '.join('--shapes ' + r for r in d.RANGES['$MODEL']))" > "$W/ranges"
AT=()
for s in "$@"; do AT+=(--shapes "$s"); done
# shellcheck disable=SC2046
"$BIN/kiln" build "$W/$MODEL.onnx" --fp16 $(cat "$W/ranges") -o "$W/dyn.kiln" > "$OUT/build.txt" 2>&1 || { tail -3 "$OUT/build.txt"; exit 1; }
"$BIN/kiln" bench "$W/dyn.kiln" "${AT[@]}" --profile --json "$OUT/dynamic.json" > "$OUT/dynamic.txt" 2>&1
"$BIN/kiln" bench "$W/$MODEL.onnx" --fp16 "${AT[@]}" --profile --json "$OUT/static.json" > "$OUT/static.txt" 2>&1
for k in static dynamic; do
  echo "== $k"; grep -E "^latency|^profile: " "$OUT/$k.txt"; sed -n '/^profile by kind/,$p' "$OUT/$k.txt" | head -16
done
echo "== steps whose kernel or time differ most (static | dynamic)"
python3 - "$OUT/static.json" "$OUT/dynamic.json" <<'PY'
import json, re, sys
s, d = (json.load(open(p))["profile"] for p in sys.argv[1:3])
print(f"steps: static {len(s)}, dynamic {len(d)}")
strip = lambda l: re.sub(r"[0-9.]+ us", "", l)
rows = []
for a, b in zip(s, d):
    rows.append((b["ms"] - a["ms"], a, b))
for diff, a, b in sorted(rows, key=lambda r: -abs(r[0]))[:12]:
    same = strip(a["step"]) == strip(b["step"])
    print(f"{diff*1000:+8.1f} us  {a['ms']*1000:7.1f} | {b['ms']*1000:7.1f}  {a['step'][:150]}")
    if not same:
        print(f"{'':30}dynamic: {b['step'][:150]}")
PY
