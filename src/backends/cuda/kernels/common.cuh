// Device helpers shared by kernels/*.cu (not part of the kernels.h contract): dtype dispatch,
// value conversions, launch sizing, warp reductions and strided N-d indexing.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "backends/cuda/kernels/kernels.h"

namespace kiln::cuda::k {

// kBool storage. A distinct type (not uint8_t) so that Cast can tell kBool from kU8, and not C++
// `bool` because a poisoned byte (0x7f) read as `bool` is undefined: every read normalizes v != 0.
struct Bool8 {
  uint8_t v;
};

template <class T>
struct Tag {
  using type = T;
};

// Calls f(Tag<T>{}) for the storage type of dt; every branch must return cudaError_t.
template <class F>
cudaError_t dispatch_dt(DT dt, F&& f) {
  switch (dt) {
    case DT::kF32: return f(Tag<float>{});
    case DT::kF16: return f(Tag<__half>{});
    case DT::kBF16: return f(Tag<__nv_bfloat16>{});
    case DT::kF64: return f(Tag<double>{});
    case DT::kI64: return f(Tag<int64_t>{});
    case DT::kI32: return f(Tag<int32_t>{});
    case DT::kI8: return f(Tag<int8_t>{});
    case DT::kU8: return f(Tag<uint8_t>{});
    case DT::kBool: return f(Tag<Bool8>{});
    case DT::kI16: return f(Tag<int16_t>{});
    case DT::kU16: return f(Tag<uint16_t>{});
    case DT::kU32: return f(Tag<uint32_t>{});
    case DT::kU64: return f(Tag<uint64_t>{});
  }
  return cudaErrorInvalidValue;
}

// The dtypes whose math runs in f32 (normalization, reductions, float unary/binary).
template <class F>
cudaError_t dispatch_f32ish(DT dt, F&& f) {
  switch (dt) {
    case DT::kF32: return f(Tag<float>{});
    case DT::kF16: return f(Tag<__half>{});
    case DT::kBF16: return f(Tag<__nv_bfloat16>{});
    default: return cudaErrorInvalidValue;
  }
}

// The float dtypes, f64 included (kernels that compute in f64 whatever they store).
template <class F>
cudaError_t dispatch_float(DT dt, F&& f) {
  switch (dt) {
    case DT::kF32: return f(Tag<float>{});
    case DT::kF16: return f(Tag<__half>{});
    case DT::kBF16: return f(Tag<__nv_bfloat16>{});
    case DT::kF64: return f(Tag<double>{});
    default: return cudaErrorInvalidValue;
  }
}

// Element i of a float array of dtype dt (f16/bf16/f64, else f32) as a double: operands whose
// dtype a kernel reads at run time (probabilities, ratios, statistics).
__device__ __forceinline__ double load_f64(const void* p, DT dt, int64_t i) {
  switch (dt) {
    case DT::kF16: return static_cast<double>(__half2float(static_cast<const __half*>(p)[i]));
    case DT::kBF16: return static_cast<double>(__bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]));
    case DT::kF64: return static_cast<const double*>(p)[i];
    default: return static_cast<double>(static_cast<const float*>(p)[i]);
  }
}

// An unsigned type of `bytes` bytes, for kernels that only move data (copy_nd, gather, where).
template <class F>
cudaError_t dispatch_bytes(int bytes, F&& f) {
  switch (bytes) {
    case 1: return f(Tag<uint8_t>{});
    case 2: return f(Tag<uint16_t>{});
    case 4: return f(Tag<uint32_t>{});
    case 8: return f(Tag<uint64_t>{});
    case 16: return f(Tag<uint4>{});
    default: return cudaErrorInvalidValue;
  }
}

template <class T>
inline constexpr bool kIsHalfLike = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;
template <class T>
inline constexpr bool kIsF32ish = std::is_same_v<T, float> || kIsHalfLike<T>;

// ---- conversions -------------------------------------------------------------------------------

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
__device__ __forceinline__ T from_f(float x) {
  if constexpr (std::is_same_v<T, __half>) return __float2half_rn(x);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(x);
  else return x;
}

// Cast goes through the widest value of the source's family: f32 for f16/bf16/f32 (exact), f64
// for f64, i64 for integers and bool. One rounding happens, in narrow().
__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ float widen(__half x) { return __half2float(x); }
__device__ __forceinline__ float widen(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ double widen(double x) { return x; }
__device__ __forceinline__ int64_t widen(int64_t x) { return x; }
__device__ __forceinline__ int64_t widen(int32_t x) { return x; }
__device__ __forceinline__ int64_t widen(int8_t x) { return x; }
__device__ __forceinline__ int64_t widen(uint8_t x) { return x; }
__device__ __forceinline__ int64_t widen(int16_t x) { return x; }
__device__ __forceinline__ int64_t widen(uint16_t x) { return x; }
__device__ __forceinline__ int64_t widen(uint32_t x) { return x; }
__device__ __forceinline__ uint64_t widen(uint64_t x) { return x; }  // beyond int64: its own narrow()
__device__ __forceinline__ int64_t widen(Bool8 x) { return x.v != 0; }

// Float -> integer truncates toward zero into i64 (saturating; NaN -> INT64_MIN) and then wraps
// to the narrower type, as numpy does; ONNX leaves out-of-range values undefined.
template <class To>
__device__ __forceinline__ To narrow(float f) {
  if constexpr (std::is_same_v<To, float>) return f;
  else if constexpr (std::is_same_v<To, __half>) return __float2half_rn(f);
  else if constexpr (std::is_same_v<To, __nv_bfloat16>) return __float2bfloat16_rn(f);
  else if constexpr (std::is_same_v<To, double>) return static_cast<double>(f);
  else if constexpr (std::is_same_v<To, Bool8>) return Bool8{static_cast<uint8_t>(f != 0.f)};
  else return static_cast<To>(__float2ll_rz(f));
}
// A 16-bit float goes through f32 (rounding twice), as the CPU reference stores doubles into them.
template <class To>
__device__ __forceinline__ To narrow(double d) {
  if constexpr (std::is_same_v<To, float>) return __double2float_rn(d);
  else if constexpr (std::is_same_v<To, __half>) return __float2half_rn(__double2float_rn(d));
  else if constexpr (std::is_same_v<To, __nv_bfloat16>) return __float2bfloat16_rn(__double2float_rn(d));
  else if constexpr (std::is_same_v<To, double>) return d;
  else if constexpr (std::is_same_v<To, Bool8>) return Bool8{static_cast<uint8_t>(d != 0.0)};
  else return static_cast<To>(__double2ll_rz(d));
}
template <class To>
__device__ __forceinline__ To narrow(int64_t v) {
  if constexpr (std::is_same_v<To, float>) return __ll2float_rn(v);
  else if constexpr (std::is_same_v<To, __half>) return __ll2half_rn(v);
  else if constexpr (std::is_same_v<To, __nv_bfloat16>) return __ll2bfloat16_rn(v);
  else if constexpr (std::is_same_v<To, double>) return __ll2double_rn(v);
  else if constexpr (std::is_same_v<To, Bool8>) return Bool8{static_cast<uint8_t>(v != 0)};
  else return static_cast<To>(v);
}

template <class To>
__device__ __forceinline__ To narrow(uint64_t v) {
  if constexpr (std::is_same_v<To, float>) return __ull2float_rn(v);
  else if constexpr (std::is_same_v<To, __half>) return __ull2half_rn(v);
  else if constexpr (std::is_same_v<To, __nv_bfloat16>) return __ull2bfloat16_rn(v);
  else if constexpr (std::is_same_v<To, double>) return __ull2double_rn(v);
  else if constexpr (std::is_same_v<To, Bool8>) return Bool8{static_cast<uint8_t>(v != 0)};
  else return static_cast<To>(v);
}

template <class To, class From>
__device__ __forceinline__ To convert(From x) {
  return narrow<To>(widen(x));
}

// ---- launch sizing -----------------------------------------------------------------------------

inline constexpr int kBlock = 256;
// Grid-stride loops: enough blocks to fill an H100 several times over (132 SMs x 8 blocks of 256),
// beyond that each thread just loops, which amortizes its index setup.
inline constexpr int64_t kMaxGrid = 4096;

inline unsigned grid_for(int64_t work, int block = kBlock) {
  int64_t g = (work + block - 1) / block;
  if (g > kMaxGrid) g = kMaxGrid;
  return static_cast<unsigned>(g < 1 ? 1 : g);
}

// The current device's SM count, read once per device (launchers size grids by it; the attribute
// query is not free on every launch of an uncaptured forward). 132 (an H100) when it cannot be read.
inline int sm_count() {
  constexpr int kDevices = 64;
  static std::atomic<int> cache[kDevices] = {};  // 0: not read yet (racing first reads store the same value)
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kDevices) return 132;
  int n = cache[dev].load(std::memory_order_relaxed);
  if (n == 0) {
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) n = 132;
    cache[dev].store(n, std::memory_order_relaxed);
  }
  return n;
}

__device__ __forceinline__ int64_t global_tid() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t global_threads() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// Programmatic dependent launch (Hopper). A kernel launched with the programmatic-serialization
// attribute may start before the kernel ahead of it in the stream has finished; it must call
// pdl_wait() before it reads anything that kernel wrote or writes anything it reads (a no-op when
// the launch had no such attribute). pdl_launch_dependents() lets such a follower start early; it
// is only a scheduling hint, the follower's pdl_wait() still waits for this whole grid.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void pdl_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

// kern<<<grid, block, smem, s>>>(args...) with one launch attribute (none where attr is null).
template <class... P, class... A>
cudaError_t launch_with(cudaLaunchAttribute* attr, void (*kern)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                        A... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = attr ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kern, args...);
}

// kern<<<grid, block, 0, s>>>(args...), with programmatic stream serialization when `pdl`: the
// kernel may then start while the previous one in the stream finishes, so it must call pdl_wait()
// before its first access to memory that kernel writes or reads.
template <class... P, class... A>
cudaError_t launch_pdl(bool pdl, void (*kern)(P...), dim3 grid, dim3 block, cudaStream_t s, A... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  return launch_with(pdl ? &attr : nullptr, kern, grid, block, 0, s, args...);
}

// kern<<<grid, block, smem, s>>>(args...) as a cooperative launch: every block resident at once, so
// that cooperative_groups' grid barrier may be used (the grid must fit: cudaOccupancy...).
template <class... P, class... A>
cudaError_t launch_cooperative(void (*kern)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, A... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeCooperative;
  attr.val.cooperative = 1;
  return launch_with(&attr, kern, grid, block, smem, s, args...);
}

// V elements moved as one aligned vector access (16 bytes of input where the pointers allow).
template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

inline bool aligned_to(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

// ---- reductions --------------------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum (or max) over a group of TPR threads that all call this: one warp (TPR == 32) or the whole
// block (TPR == blockDim.x, a multiple of 32). Every thread gets the result. `smem` holds 32
// floats; the trailing barrier lets the caller reduce again at once with the same buffer.
template <int TPR, bool kMax>
__device__ __forceinline__ float group_reduce(float v, float* smem) {
  v = kMax ? warp_max(v) : warp_sum(v);
  if constexpr (TPR > 32) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    v = lane < TPR / 32 ? smem[lane] : (kMax ? -INFINITY : 0.f);
    v = kMax ? warp_max(v) : warp_sum(v);
    __syncthreads();
  }
  return v;
}

// ---- strided N-d indexing ----------------------------------------------------------------------

// The index space plus K operands' strides, passed to kernels by value. coalesce() first drops
// size-1 dims and merges neighbours that every operand walks contiguously, so a broadcast bias add
// or a slice usually becomes rank 1 or 2 and costs one or two divisions per element.
template <int K>
struct Indexer {
  int rank = 1;
  int64_t dims[kMaxRank] = {1};
  int64_t strides[K][kMaxRank] = {};

  // Element offsets of linear index i (row-major over dims) in each operand. The outermost dim
  // needs no division: i is already below its extent. U is uint32_t when everything fits.
  template <class U>
  __device__ __forceinline__ void offsets(int64_t i, int64_t (&off)[K]) const {
    U rem = static_cast<U>(i);
#pragma unroll
    for (int k = 0; k < K; ++k) off[k] = 0;
#pragma unroll
    for (int d = kMaxRank - 1; d > 0; --d) {
      if (d < rank) {
        const U n = static_cast<U>(dims[d]);
        const U q = rem / n;
        const U r = rem - q * n;
#pragma unroll
        for (int k = 0; k < K; ++k) off[k] += static_cast<int64_t>(r) * strides[k][d];
        rem = q;
      }
    }
#pragma unroll
    for (int k = 0; k < K; ++k) off[k] += static_cast<int64_t>(rem) * strides[k][0];
  }
};

// Builds the Indexer over `dims` (rank r) for operands whose strides are ops[k]; returns false on
// a bad rank or a negative dim. *numel receives the element count.
template <int K>
inline bool make_indexer(int r, const int64_t* dims, const int64_t* const (&ops)[K], Indexer<K>* ix, int64_t* numel) {
  if (r < 0 || r > kMaxRank) return false;
  int64_t n = 1;
  for (int d = 0; d < r; ++d) {
    if (dims[d] < 0) return false;
    n *= dims[d];
  }
  *numel = n;
  int out = 0;
  for (int d = 0; d < r; ++d) {
    if (dims[d] == 1) continue;
    bool merge = out > 0;
    for (int k = 0; k < K && merge; ++k) merge = ops[k][d] * dims[d] == ix->strides[k][out - 1];
    if (merge) {
      // The previous kept dim (outer) walks contiguously into this one for every operand.
      ix->dims[out - 1] *= dims[d];
      for (int k = 0; k < K; ++k) ix->strides[k][out - 1] = ops[k][d];
    } else {
      ix->dims[out] = dims[d];
      for (int k = 0; k < K; ++k) ix->strides[k][out] = ops[k][d];
      ++out;
    }
  }
  if (out == 0) {
    ix->dims[0] = 1;
    for (int k = 0; k < K; ++k) ix->strides[k][0] = 0;
    out = 1;
  }
  ix->rank = out;
  return true;
}

// The decomposition of the linear index runs in 32 bits when it fits (offsets stay 64-bit):
// 32-bit division is several times cheaper than 64-bit on the GPU.
inline bool fits_u32(int64_t numel) { return numel <= int64_t{0xffffffff}; }

}  // namespace kiln::cuda::k
