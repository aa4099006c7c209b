#!/usr/bin/env bash
# Installs what kiln needs to build and test, idempotently: Debian packages and PyPI packages.
# Called by `make demo` and `make test`; does nothing when everything is already present.
set -euo pipefail
debs=(cmake g++ make clang libprotobuf-dev protobuf-compiler libcli11-dev nlohmann-json3-dev
      libfmt-dev libgtest-dev libonnx-testdata python3 python3-pip)
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
