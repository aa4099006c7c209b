#!/usr/bin/env bash
# The bad-input suite: `bash tests/error/run.sh build/kiln` (what `make errors` runs).
#
# make_cases.py writes malformed models, .npy files and folders into a temporary folder, with
# one line per case in cases.tsv (its header comment describes the format). Each case runs the
# kiln CLI under `timeout 20` and must:
#   err cases: exit 1..125 (an error, not a crash: no signal, no 124 timeout), with every
#              expected substring in stderr (the node, input or file a user needs to fix it);
#   ok cases:  exit 0 with the expected substring in stdout+stderr (controls, so the suite
#              cannot pass by everything failing);
#   and leave behind exactly what `check` says (no partial output after an error).
# KEEP=1 keeps the temporary folder for debugging; ONLY=REGEX runs the matching cases.
set -u

if [[ $# -ne 1 ]]; then
  echo "usage: $0 KILN_BINARY" >&2
  exit 2
fi
KILN=$(realpath "$1") || exit 2
if [[ ! -x "$KILN" ]]; then
  echo "errors: $1 is not an executable" >&2
  exit 2
fi
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kiln-errors.XXXXXX")
if [[ "${KEEP:-0}" == 1 ]]; then
  echo "errors: keeping $TMP"
else
  trap 'rm -rf "$TMP"' EXIT
fi

if ! python3 "$HERE/make_cases.py" "$TMP/cases" >"$TMP/make_cases.log" 2>&1; then
  echo "FAIL make_cases.py:"
  cat "$TMP/make_cases.log"
  echo "errors: 0 passed, 1 failed"
  exit 1
fi

passed=0
failed=0

# One line, trimmed, for a FAIL message.
squash() { tr '\n' ' ' <"$1" | sed -e 's/  */ /g' -e 's/ $//' | cut -c1-600; }

# expect is one or more '|'-separated alternatives; an alternative matches when every one of its
# ';'-separated substrings occurs. Prints the first alternative's first missing part when none match.
missing_expect() {
  local text=$1 expect=$2 alt part ok first=""
  [[ "$expect" == "-" ]] && return 1
  IFS='|' read -r -a alts <<<"$expect"
  for alt in "${alts[@]}"; do
    ok=1
    IFS=';' read -r -a parts <<<"$alt"
    for part in "${parts[@]}"; do
      if [[ "$text" != *"$part"* ]]; then
        ok=0
        [[ -z "$first" ]] && first=$part
        break
      fi
    done
    [[ $ok == 1 ]] && return 1
  done
  echo "$first"
  return 0
}

# Prints what is wrong with the files a case leaves behind; nothing if it is right.
check_files() {
  local check=$1 kind path
  [[ "$check" == "-" ]] && return
  kind=${check%%:*}
  IFS=',' read -r -a paths <<<"${check#*:}"
  for path in "${paths[@]}"; do
    if [[ $kind == absent && ( -e "$path" || -L "$path" ) ]]; then
      echo "left behind ${path#"$TMP/cases/"}"
    elif [[ $kind == present && ! -e "$path" ]]; then
      echo "did not write ${path#"$TMP/cases/"}"
    fi
  done
}

while IFS=$'\t' read -r -a f; do
  name=${f[0]} kind=${f[1]} expect=${f[2]} check=${f[3]}
  [[ -n "${ONLY:-}" && ! "$name" =~ $ONLY ]] && continue
  dir="$TMP/cases/$name"
  args=()
  for a in "${f[@]:4}"; do
    a=${a//\{D\}/$dir}
    args+=("${a//\{T\}/$TMP/cases}")
  done
  check=${check//\{D\}/$dir}
  out="$TMP/$name.out"
  err="$TMP/$name.err"
  (cd "$TMP" && exec timeout -k 5 20 "$KILN" "${args[@]}") >"$out" 2>"$err" </dev/null
  rc=$?
  why=""
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    why="timed out after 20 s"
  elif [[ $rc -ge 128 ]]; then
    why="killed by signal $((rc - 128)) (crash)"
  elif [[ $kind == err && $rc -eq 0 ]]; then
    why="succeeded, but the input is bad"
  elif [[ $kind == err && $rc -gt 125 ]]; then
    why="exit code $rc is not an error exit"
  elif [[ $kind == ok && $rc -ne 0 ]]; then
    why="failed on a valid input"
  elif [[ $kind == err ]] && ! grep -q '^kiln: error: ' "$err"; then
    why="stderr has no 'kiln: error:' line"
  fi
  if [[ -z "$why" ]]; then
    if [[ $kind == err ]]; then text=$(cat "$err"); else text=$(cat "$out" "$err"); fi
    if group=$(missing_expect "$text" "$expect"); then
      why="$([[ $kind == err ]] && echo stderr || echo output) lacks '$group'"
    fi
  fi
  if [[ -z "$why" ]]; then
    files=$(check_files "$check")
    [[ -n "$files" ]] && why=$(echo "$files" | tr '\n' ';' | sed 's/;$//')
  fi
  if [[ -z "$why" ]]; then
    echo "ok   $name"
    passed=$((passed + 1))
  else
    line="FAIL $name: $why (exit $rc, stderr: $(squash "$err"))"
    echo "$line"
    echo "     command: kiln ${f[*]:4}   ({D} = the case folder, {T} = the cases folder)"
    failed=$((failed + 1))
  fi
done <"$TMP/cases/cases.tsv"

echo "errors: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
