#include "serve/device_copy.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace kiln::serve {

namespace {

constexpr int kSegments = 64;  // per launch: the parameter block stays under 4 KiB
constexpr int kThreads = 256;

struct Segments {
  unsigned char* dst[kSegments];
  const unsigned char* src[kSegments];
  size_t bytes[kSegments];
};

// Block (x, y) copies its share of segment y, 16 bytes a thread a step where both ends and the size
// are 16-byte aligned (cudaMalloc'd regions at aligned offsets), a byte a step otherwise.
__global__ void copy_segments(const __grid_constant__ Segments s) {
  const int k = blockIdx.y;
  unsigned char* d = s.dst[k];
  const unsigned char* q = s.src[k];
  const size_t n = s.bytes[k];
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (((reinterpret_cast<uintptr_t>(d) | reinterpret_cast<uintptr_t>(q) | n) & 15) == 0) {
    auto* d16 = reinterpret_cast<uint4*>(d);
    const auto* q16 = reinterpret_cast<const uint4*>(q);
    for (; i < n / 16; i += stride) d16[i] = q16[i];
  } else {
    for (; i < n; i += stride) d[i] = q[i];
  }
}

}  // namespace

std::string copy_on_device(const std::vector<void*>& dsts, const std::vector<const void*>& srcs,
                           const std::vector<size_t>& sizes, void* stream) {
  (void)cudaGetLastError();  // an earlier call's error (a failed allocation) is not this launch's
  for (size_t at = 0; at < dsts.size(); at += kSegments) {
    const size_t count = std::min<size_t>(kSegments, dsts.size() - at);
    Segments s{};
    size_t most = 0;
    for (size_t j = 0; j < count; ++j) {
      s.dst[j] = static_cast<unsigned char*>(dsts[at + j]);
      s.src[j] = static_cast<const unsigned char*>(srcs[at + j]);
      s.bytes[j] = sizes[at + j];
      most = std::max(most, sizes[at + j]);
    }
    // Enough blocks that a 16-byte step covers the largest segment in about four rounds; at most
    // 1024 per segment (a 3x224x224 fp32 row is 37 blocks).
    const size_t units = (most + 15) / 16;
    const unsigned blocks = unsigned(std::clamp<size_t>((units + 4 * kThreads - 1) / (4 * kThreads), 1, 1024));
    copy_segments<<<dim3(blocks, unsigned(count)), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(s);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cudaGetErrorString(e);
  }
  return {};
}

void load_device_copy() {
  cudaFuncAttributes a{};
  (void)cudaFuncGetAttributes(&a, copy_segments);
}

}  // namespace kiln::serve
