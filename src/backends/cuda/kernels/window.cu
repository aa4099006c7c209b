// k::pool_table (window.h): one thread per output element, its taps read from the table.
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/window.h"

namespace kiln::cuda::k {

namespace {

// The flat index MaxPool reports for offset `off` of its plane: storage_order=1 reads the spatial
// coordinates column-major (the plane's own offset stays row-major), as the CPU reference.
__device__ int64_t plane_index(int64_t off, const PoolTableShape& s) {
  if (!s.column_major) return off;
  int64_t coord[kMaxRank] = {};
  for (int i = s.rank; i-- > 0;) {
    coord[i] = off % s.in_dims[i];
    off /= s.in_dims[i];
  }
  int64_t idx = 0, stride = 1;
  for (int i = 0; i < s.rank; ++i) {
    idx += coord[i] * stride;
    stride *= s.in_dims[i];
  }
  return idx;
}

template <class T>
__global__ void pool_table_kernel(const T* __restrict__ x, const int32_t* __restrict__ table, PoolTableShape s,
                                  T* __restrict__ y, int64_t* __restrict__ indices) {
  constexpr bool kFloat = !std::is_integral_v<T>;
  const int64_t total = s.planes * s.positions;
  for (int64_t i = global_tid(); i < total; i += global_threads()) {
    const int64_t plane = i / s.positions, pos = i % s.positions;
    const T* xp = x + plane * s.in_size;
    const int32_t* taps = table + pos * s.kernel_size;
    double acc = s.mode == 0 ? -INFINITY : 0.0;
    int64_t count = 0;
    int32_t best = -1;
    for (int q = 0; q < s.kernel_size; ++q) {
      const int32_t off = taps[q];
      if (off == -1 && s.count_pad) ++count;
      if (off < 0) continue;
      const double v = static_cast<double>(widen(xp[off]));
      ++count;
      if (s.mode == 0) {
        if (v > acc || best < 0) {  // NaN wins only when it comes first, as on the CPU
          acc = v;
          best = off;
        }
      } else if (s.mode == 1) {
        acc += v;
      } else {
        acc += pow(fabs(v), static_cast<double>(s.p));
      }
    }
    if (s.mode == 0 && best < 0 && !kFloat) acc = 0;  // an integer window of padding only
    if (s.mode == 1) acc = count > 0 ? acc / static_cast<double>(count) : 0.0;
    if (s.mode == 2) acc = pow(acc, 1.0 / static_cast<double>(s.p));
    y[i] = narrow<T>(acc);
    if (indices) indices[i] = best < 0 ? -1 : plane * s.in_size + plane_index(best, s);
  }
}

template <class T>
cudaError_t launch(const void* x, const int32_t* table, const PoolTableShape& s, void* y, int64_t* indices,
                   cudaStream_t st) {
  pool_table_kernel<T><<<grid_for(s.planes * s.positions), kBlock, 0, st>>>(static_cast<const T*>(x), table, s,
                                                                            static_cast<T*>(y), indices);
  return cudaGetLastError();
}

}  // namespace

cudaError_t pool_table(DT dt, const void* x, const int32_t* table, const PoolTableShape& s, void* y, int64_t* indices,
                       cudaStream_t st) {
  if (s.planes * s.positions == 0) return cudaSuccess;
  switch (dt) {
    case DT::kF32: return launch<float>(x, table, s, y, indices, st);
    case DT::kF16: return launch<__half>(x, table, s, y, indices, st);
    case DT::kBF16: return launch<__nv_bfloat16>(x, table, s, y, indices, st);
    case DT::kF64: return launch<double>(x, table, s, y, indices, st);
    case DT::kI8: return launch<int8_t>(x, table, s, y, indices, st);
    case DT::kU8: return launch<uint8_t>(x, table, s, y, indices, st);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace kiln::cuda::k
