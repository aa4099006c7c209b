// Exhaustive check of the quantize passes' rint_quotient (src/backends/cuda/kernels/quant_math.cuh):
// for each scale, every one of the 2^32 float bit patterns x must give what rintf(__fdiv_rn(x, scale))
// gives (NaN for NaN). Not part of the build; on a GPU machine:
//   nvcc -O2 -arch=sm_90 -I src bench/rint_quotient_check.cu -o /tmp/rqc && /tmp/rqc
// Exit status 1 when any pattern differs. Result: bench/RESULTS.md, "thirty-fifth session".
#include <cmath>
#include <cstdint>
#include <cstdio>

#include "backends/cuda/kernels/quant_math.cuh"

__global__ void count_differences(float scale, float inv, unsigned long long* bad) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < (uint64_t{1} << 32);
       i += uint64_t(gridDim.x) * blockDim.x) {
    const float x = __uint_as_float(uint32_t(i));
    const float a = kiln::cuda::k::rint_quotient(x, scale, inv), b = rintf(__fdiv_rn(x, scale));
    if (!(a == b || (a != a && b != b))) atomicAdd(bad, 1ull);
  }
}

int main() {
  unsigned long long* bad = nullptr;
  if (cudaMallocManaged(&bad, sizeof(*bad)) != cudaSuccess) return 2;
  // Calibrated activation scales of BERT-base, round ones, tiny ones (1/1e-40 overflows: inv = 0),
  // huge ones (inv subnormal), and one whose inverse rounds up, so x * inv overflows near FLT_MAX.
  const float scales[] = {0.02f, 0.016f, 0.0037997775f, 0.020968726f, 1.0f, 3.0f, 0.1f, 0.0078125f, 12345.678f,
                          1e-30f, 7.5e-39f, 1e-40f, 1e38f, 3.4e38f, 0x1.ee0474p-1f};
  int failed = 0;
  for (float s : scales) {
    *bad = 0;
    float inv = 1.0f / s;
    if (!std::isfinite(inv)) inv = 0.0f;  // as quant.cu's inverse_of
    count_differences<<<4096, 256>>>(s, inv, bad);
    if (cudaDeviceSynchronize() != cudaSuccess) return 2;
    std::printf("scale %g: %llu of 2^32 floats differ\n", s, *bad);
    failed |= *bad != 0;
  }
  return failed;
}
