// k::int_center and k::requantize (integer.h).
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/integer.h"

namespace kiln::cuda::k {

namespace {

template <class X, class Y>
__global__ void center_kernel(const X* __restrict__ x, int64_t n, const X* __restrict__ zp, int64_t zp_inner,
                              int64_t zp_len, Y* __restrict__ y) {
  for (int64_t i = global_tid(); i < n; i += global_threads()) {
    const int z = zp ? static_cast<int>(zp[(i / zp_inner) % zp_len]) : 0;
    y[i] = static_cast<Y>(static_cast<int>(x[i]) - z);
  }
}

// v rounded to the nearest value of float type dt (the scales' type, as numpy computes in it).
__device__ double round_as(double v, DT dt) {
  switch (dt) {
    case DT::kF16: return static_cast<double>(__half2float(__double2half(v)));
    case DT::kBF16: return static_cast<double>(__bfloat162float(__double2bfloat16(v)));
    case DT::kF64: return v;
    default: return static_cast<double>(__double2float_rn(v));
  }
}

template <class A, class Y>
__global__ void requantize_kernel(Requantize r, const A* __restrict__ acc, Y* __restrict__ y) {
  const double lo = std::is_same_v<Y, int8_t> ? -128.0 : 0.0, hi = std::is_same_v<Y, int8_t> ? 127.0 : 255.0;  // 8-bit
  const double zp = !r.zp_ptr                ? r.zp
                    : r.zp_dt == DT::kI8 ? static_cast<double>(static_cast<const int8_t*>(r.zp_ptr)[0])
                                           : static_cast<double>(static_cast<const uint8_t*>(r.zp_ptr)[0]);
  const double sy = r.scale_y ? load_f64(r.scale_y, r.y_dt, 0) : 1.0;
  for (int64_t i = global_tid(); i < r.n; i += global_threads()) {
    double v = static_cast<double>(acc[i]);
    if (r.bias) v += static_cast<double>(r.bias[(i / r.b_inner) % r.b_len]);
    if (r.factor) {
      v *= r.factor[(i / r.f_inner) % r.f_len];
    } else if (r.scale_a) {
      const double sa = load_f64(r.scale_a, r.a_dt, (i / r.a_inner) % r.a_len);
      const double sb = load_f64(r.scale_b, r.b_dt, (i / r.b2_inner) % r.b2_len);
      v *= round_as(round_as(sa * sb, r.round_dt) / sy, r.round_dt);
    }
    v = rint(v + zp);
    if constexpr (std::is_same_v<Y, int32_t>) {  // an int32 sum wraps, as the CPU reference stores it
      y[i] = static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(static_cast<int64_t>(v))));
    } else {
      y[i] = static_cast<Y>(fmin(fmax(v, lo), hi));
    }
  }
}

template <class X>
cudaError_t center_to(DT ydt, const X* x, int64_t n, const X* zp, int64_t zi, int64_t zl, void* y, cudaStream_t s) {
  if (ydt == DT::kF64) {
    center_kernel<X, double><<<grid_for(n), kBlock, 0, s>>>(x, n, zp, zi, zl, static_cast<double*>(y));
  } else if (ydt == DT::kF32) {
    center_kernel<X, float><<<grid_for(n), kBlock, 0, s>>>(x, n, zp, zi, zl, static_cast<float*>(y));
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

template <class A>
cudaError_t requantize_from(const Requantize& r, const A* acc, void* y, cudaStream_t s) {
  switch (r.ydt) {
    case DT::kI32: requantize_kernel<A, int32_t><<<grid_for(r.n), kBlock, 0, s>>>(r, acc, static_cast<int32_t*>(y)); break;
    case DT::kI8: requantize_kernel<A, int8_t><<<grid_for(r.n), kBlock, 0, s>>>(r, acc, static_cast<int8_t*>(y)); break;
    case DT::kU8: requantize_kernel<A, uint8_t><<<grid_for(r.n), kBlock, 0, s>>>(r, acc, static_cast<uint8_t*>(y)); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t int_center(DT xdt, const void* x, int64_t n, const void* zp, int64_t zp_inner, int64_t zp_len, DT ydt,
                       void* y, cudaStream_t s) {
  if (n < 0 || zp_inner < 1 || zp_len < 1) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (xdt == DT::kI8) {
    return center_to(ydt, static_cast<const int8_t*>(x), n, static_cast<const int8_t*>(zp), zp_inner, zp_len, y, s);
  }
  if (xdt == DT::kU8) {
    return center_to(ydt, static_cast<const uint8_t*>(x), n, static_cast<const uint8_t*>(zp), zp_inner, zp_len, y, s);
  }
  return cudaErrorInvalidValue;
}

cudaError_t requantize(const Requantize& r, const void* acc, void* y, cudaStream_t s) {
  if (r.n < 0 || r.b_inner < 1 || r.b_len < 1 || r.f_inner < 1 || r.f_len < 1 || r.a_inner < 1 || r.a_len < 1 ||
      r.b2_inner < 1 || r.b2_len < 1 || (r.scale_a && (!r.scale_b || !r.scale_y))) {
    return cudaErrorInvalidValue;
  }
  if (r.n == 0) return cudaSuccess;
  if (r.acc_dt == DT::kF64) return requantize_from(r, static_cast<const double*>(acc), y, s);
  if (r.acc_dt == DT::kF32) return requantize_from(r, static_cast<const float*>(acc), y, s);
  return cudaErrorInvalidValue;
}

}  // namespace kiln::cuda::k
