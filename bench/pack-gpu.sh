#!/usr/bin/env bash
# Packs what the GPU machine needs from this machine's build into .gpupack/pack.tar.xz (under the
# device tool's 64 MiB carry limit): kiln, kiln-serve, kiln_conformance and kiln_gpu_op_check,
# stripped, plus the onnx 1.12 backend test data. On the device:
#   mkdir -p /tmp/k && tar xJf .gpupack/pack.tar.xz -C /tmp/k    # binaries in /tmp/k/bin, data in /tmp/k/onnx-1.12
#   bash bench/gpu-check.sh /tmp/k/bin; bash bench/conformance-gpu.sh /tmp/k/bin /tmp/k/onnx-1.12 --jobs 16
# Usage: bash bench/pack-gpu.sh [BUILD_DIR]   (.gpupack/ is local: add it to .git/info/exclude)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD=${1:-build}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" .gpupack
for f in "$BUILD/kiln" "$BUILD/kiln-serve" "$BUILD/tests/kiln_conformance" "$BUILD/tests/kiln_gpu_op_check"; do
  [[ -f "$f" ]] && strip -o "$stage/bin/$(basename "$f")" "$f"
done
# Shared libraries of the build itself (not the system's or CUDA's) travel beside the binaries.
for lib in $(ldd "$BUILD/kiln" | awk -v b="$(realpath "$BUILD")" '$3 ~ b {print $3}'); do strip -o "$stage/bin/$(basename "$lib")" "$lib"; done
cp -r /usr/share/libonnx-testdata/data "$stage/onnx-1.12"
tar cJf .gpupack/pack.tar.xz -C "$stage" .
ls -la .gpupack/pack.tar.xz
