# Sourced by the GPU-machine scripts: makes sure the CUDA libraries kiln links against
# (libcublasLt.so.13, libcudnn.so.9; libcufft.so.12, opened when a DFT needs it) are found. The system's are used when the loader knows them;
# otherwise those inside PyTorch's environment (nvidia-cudnn-cu13, nvidia-cublas) are added.
kiln_find_lib() {  # kiln_find_lib SONAME -> prints a folder holding it, or nothing
  python3 - "$1" <<'PY' 2>/dev/null
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for p in glob.glob(os.path.join(r, "nvidia", "**", sys.argv[1]), recursive=True):
        print(os.path.dirname(p)); sys.exit(0)
PY
}
for lib in libcudnn.so.9 libcublasLt.so.13 libnccl.so.2 libcufft.so.12; do
  if ! ldconfig -p 2>/dev/null | grep -q "$lib"; then
    d="$(kiln_find_lib "$lib")"
    if [[ -n "$d" ]]; then
      export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      echo "gpu-env: $lib from $d"
    else
      echo "gpu-env: warning: $lib not found" >&2
    fi
  fi
done
