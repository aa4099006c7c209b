#!/usr/bin/env bash
# Installs what kiln needs to build and test, idempotently: Debian packages and PyPI packages.
# Called by `make demo` and `make test`; does nothing when everything is already present.
set -euo pipefail
debs=(cmake g++ make clang libprotobuf-dev protobuf-compiler libcli11-dev nlohmann-json3-dev
      libfmt-dev libgtest-dev libonnx-testdata libcpp-httplib-dev libgrpc++-dev protobuf-compiler-grpc pkgconf
      python3 python3-pip iproute2)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
PY=${PYTHON:-python3}
if ! $PY -c "import onnx, numpy, sys; sys.exit(0 if onnx.__version__ == '1.23.2' else 1)" 2>/dev/null; then
  echo "install-deps: installing PyPI packages: onnx==1.23.2 numpy"
  $PY -m pip install -q onnx==1.23.2 numpy 2>/dev/null || $PY -m pip install -q --break-system-packages onnx==1.23.2 numpy
fi
# onnxruntime (CPU): the peer that runs the QDQ models `kiln quantize` writes (tests/quant); a test
# tool only, never linked.
if ! $PY -c "import onnxruntime" 2>/dev/null; then
  echo "install-deps: installing PyPI packages: onnxruntime"
  $PY -m pip install -q onnxruntime 2>/dev/null || $PY -m pip install -q --break-system-packages onnxruntime
fi
# The Python package's build (scikit-build-core, nanobind), its tests (pytest) and the server's
# (tritonclient, a real KServe v2 client).
if ! $PY -c "import scikit_build_core, nanobind, pytest, tritonclient.http, tritonclient.grpc" 2>/dev/null; then
  echo "install-deps: installing PyPI packages: scikit-build-core nanobind pytest tritonclient[http,grpc]"
  $PY -m pip install -q scikit-build-core nanobind pytest "tritonclient[http,grpc]" 2>/dev/null ||
    $PY -m pip install -q --break-system-packages scikit-build-core nanobind pytest "tritonclient[http,grpc]"
fi
# CUTLASS 3 headers (Hopper GEMM kernels in src/backends/cuda/kernels_cutlass/gemm_sm90.cu), from NVIDIA's
# PyPI wheel: only its include/ tree is used, unpacked into third_party/ (not in git).
CUTLASS_VER=4.2.0.0
CUTLASS_DIR="$(cd "$(dirname "$0")/.." && pwd)/third_party/cutlass-$CUTLASS_VER"
if [ ! -f "$CUTLASS_DIR/include/cutlass/cutlass.h" ]; then
  echo "install-deps: fetching CUTLASS $CUTLASS_VER headers (nvidia-cutlass wheel) into $CUTLASS_DIR"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  rm -rf "$CUTLASS_DIR" "$CUTLASS_DIR.part"  # a partial earlier attempt
  # Not fatal: without the headers kiln still builds, with cuBLASLt for every GEMM (CMake warns).
  if ! $PY -m pip download -q --no-deps --only-binary=:all: "nvidia-cutlass==$CUTLASS_VER" -d "$tmp" ||
     ! $PY - "$tmp"/nvidia_cutlass-*.whl "$CUTLASS_DIR" <<'PYEOF'
import sys, zipfile, os
whl, dest = sys.argv[1], sys.argv[2]
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist() if n.startswith(prefix) and not n.endswith("/")]
    if not any(n.endswith("cutlass/cutlass.h") for n in names):
        sys.exit(f"{whl}: no {prefix}cutlass/cutlass.h")
    for n in names:
        out = os.path.join(dest + ".part", "include", n[len(prefix):])
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "wb") as f:
            f.write(z.read(n))
os.replace(dest + ".part", dest)
PYEOF
  then
    rm -rf "$CUTLASS_DIR.part"
    echo "install-deps: WARNING: could not fetch nvidia-cutlass $CUTLASS_VER; building without the Hopper GEMM kernels (re-run scripts/install-deps.sh, then cmake)"
  fi
fi
# oneDNN 3.2 (the fast CPU backend's convolutions, GEMMs and pooling, src/backends/cpu/dnnl_*),
# from Intel's PyPI wheels built on GNU OpenMP: headers and libdnnl.so.3, unpacked into third_party/
# (not in git). kiln loads the library when a CPU engine runs (dlopen), so a kiln without it still
# builds and runs, on the reference kernels.
ONEDNN_VER=2023.2.0
ONEDNN_DIR="$(cd "$(dirname "$0")/.." && pwd)/third_party/onednn-$ONEDNN_VER"
if [ ! -f "$ONEDNN_DIR/lib/libdnnl.so.3" ] || [ ! -f "$ONEDNN_DIR/include/oneapi/dnnl/dnnl.h" ]; then
  echo "install-deps: fetching oneDNN ($ONEDNN_VER wheels onednn-cpu-gomp, onednn-devel-cpu-gomp) into $ONEDNN_DIR"
  tmp=$(mktemp -d)
  rm -rf "$ONEDNN_DIR" "$ONEDNN_DIR.part"
  if ! $PY -m pip download -q --no-deps --only-binary=:all: "onednn-cpu-gomp==$ONEDNN_VER" \
         "onednn-devel-cpu-gomp==$ONEDNN_VER" -d "$tmp" ||
     ! $PY - "$ONEDNN_DIR" "$tmp"/onednn_*.whl <<'PYEOF'
import sys, zipfile, os
dest, wheels = sys.argv[1], sys.argv[2:]
for whl in wheels:
    with zipfile.ZipFile(whl) as z:
        for n in z.namelist():
            parts = n.split("/")
            # <name>.data/data/{lib,include}/...: the library (its real file, under its soname) and headers
            if len(parts) < 4 or parts[1] != "data" or parts[2] not in ("lib", "include") or n.endswith("/"):
                continue
            if parts[2] == "lib" and not parts[-1].startswith("libdnnl.so.3."):
                continue
            rel = "lib/libdnnl.so.3" if parts[2] == "lib" else "/".join(parts[2:])
            out = os.path.join(dest + ".part", rel)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out, "wb") as f:
                f.write(z.read(n))
for need in ("lib/libdnnl.so.3", "include/oneapi/dnnl/dnnl.h"):
    if not os.path.isfile(os.path.join(dest + ".part", need)):
        sys.exit(f"oneDNN wheels: no {need}")
os.replace(dest + ".part", dest)
PYEOF
  then
    rm -rf "$ONEDNN_DIR.part"
    echo "install-deps: WARNING: could not fetch oneDNN $ONEDNN_VER; the CPU runs on the reference kernels only (re-run scripts/install-deps.sh, then cmake)"
  fi
  rm -rf "$tmp"
fi
