#!/usr/bin/env bash
# The experiment behind kernels_cutlass/gemm_sm90.cu (bench/RESULTS.md, twelfth session): BERT-base
# batch-1's four GEMM shapes for 12 layers with LayerNorms, one CUDA graph, cuBLASLt vs CUTLASS with
# and without programmatic dependent launch. Not part of the build (CUTLASS instantiations take
# minutes); build here, carry the binary to the GPU machine and run it there:
#   bash bench/pdl_chain/build.sh [OUT]   # needs CUTLASS's full source tree for tools/util/include:
#                                         # CUTLASS_SRC=.../cutlass_library/source of the nvidia-cutlass wheel
set -euo pipefail
cd "$(dirname "$0")"
OUT=${1:-/tmp/pdl_chain}
: "${CUTLASS_SRC:?set CUTLASS_SRC to the wheel's cutlass_library/source folder}"
F="-std=c++17 -O3 -DNDEBUG -arch=sm_90a -I$CUTLASS_SRC/include -I$CUTLASS_SRC/tools/util/include --expt-relaxed-constexpr"
for f in r0 r1 r2; do nvcc $F -DCUTLASS_ENABLE_GDC_FOR_SM90 -c $f.cu -o /tmp/pdl_chain_$f.o & done
nvcc $F -c main.cu -o /tmp/pdl_chain_main.o
wait
nvcc -arch=sm_90a /tmp/pdl_chain_main.o /tmp/pdl_chain_r0.o /tmp/pdl_chain_r1.o /tmp/pdl_chain_r2.o -o "$OUT" -lcublasLt
echo "built $OUT"
