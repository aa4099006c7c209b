#!/usr/bin/env bash
# Packs what the GPU machine needs from this machine's build into .gpupack/pack.tar.xz (under the
# device tool's 64 MiB carry limit): kiln, kiln-serve, kiln-serve-load, kiln_conformance and
# kiln_gpu_op_check, stripped, plus the onnx 1.12 backend test data. The server's shared libraries
# (libkiln.so, gRPC, abseil, protobuf, cpp-httplib, OpenSSL: Debian's, which a bare GPU machine lacks)
# go to lib/, and kiln-serve / kiln-serve-load in bin/ become wrappers that put lib/ on the loader's
# path for themselves alone. On the device:
#   mkdir -p /tmp/k && tar xJf .gpupack/pack.tar.xz -C /tmp/k    # binaries in /tmp/k/bin, data in /tmp/k/onnx-1.12
#   bash bench/gpu-check.sh /tmp/k/bin; bash bench/conformance-gpu.sh /tmp/k/bin /tmp/k/onnx-1.12 --jobs 16
# Usage: bash bench/pack-gpu.sh [BUILD_DIR] [lean]   (.gpupack/ is local: add it to .git/info/exclude)
# lean: without the conformance data and runner (room in the carry for wheels).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD=${1:-build}
LEAN=${2:-}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" .gpupack
mkdir -p "$stage/lib"
for f in "$BUILD/kiln" $([[ -z "$LEAN" ]] && echo "$BUILD/tests/kiln_conformance") "$BUILD/tests/kiln_gpu_op_check"; do
  [[ -f "$f" ]] && strip -o "$stage/bin/$(basename "$f")" "$f"
done
# The server's binaries and every library they load beyond the C/C++ runtime and CUDA's.
for f in "$BUILD/kiln-serve" "$BUILD/kiln-serve-load"; do
  [[ -f "$f" ]] || continue
  strip -o "$stage/lib/$(basename "$f").bin" "$f"
  printf '#!/bin/sh\nd=$(dirname "$(readlink -f "$0")")/../lib\nLD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$d/%s.bin" "$@"\n' \
    "$(basename "$f")" > "$stage/bin/$(basename "$f")"
  chmod +x "$stage/bin/$(basename "$f")"
  for lib in $(ldd "$f" | awk '$3 ~ /^\// {print $3}' | grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt)\.so|/ld-linux|cublas|cudnn|libcuda'); do
    [[ -f "$stage/lib/$(basename "$lib")" ]] || strip -o "$stage/lib/$(basename "$lib")" "$lib"
  done
done
# Shared libraries of the build itself (not the system's or CUDA's) travel beside the binaries.
for lib in $(ldd "$BUILD/kiln" | awk -v b="$(realpath "$BUILD")" '$3 ~ b {print $3}'); do strip -o "$stage/bin/$(basename "$lib")" "$lib"; done
[[ -n "$LEAN" ]] || cp -r /usr/share/libonnx-testdata/data "$stage/onnx-1.12"
tar cJf .gpupack/pack.tar.xz -C "$stage" .
ls -la .gpupack/pack.tar.xz
