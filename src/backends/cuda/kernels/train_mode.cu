// k::batch_norm_train and k::dropout_train (train_mode.h).
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/train_mode.h"

namespace kiln::cuda::k {

namespace {

__device__ void store_f64(void* p, DT dt, int64_t i, double v) {
  switch (dt) {
    case DT::kF16: static_cast<__half*>(p)[i] = narrow<__half>(v); break;
    case DT::kBF16: static_cast<__nv_bfloat16*>(p)[i] = narrow<__nv_bfloat16>(v); break;
    case DT::kF64: static_cast<double*>(p)[i] = v; break;
    default: static_cast<float*>(p)[i] = narrow<float>(v); break;
  }
}

bool is_float(DT d) { return d == DT::kF32 || d == DT::kF16 || d == DT::kBF16 || d == DT::kF64; }

// The sum over the block of each thread's v (blockDim.x == kBlock).
__device__ double block_sum(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int s = kBlock / 2; s > 0; s >>= 1) {
    if (static_cast<int>(threadIdx.x) < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  const double total = shared[0];
  __syncthreads();
  return total;
}

// One block per channel: mean, then the variance about it (two passes over the channel, in f64).
template <class T>
__global__ void batch_stats_kernel(BatchNormTrain a) {
  __shared__ double shared[kBlock];
  const int64_t ch = blockIdx.x, count = a.n * a.plane;
  const T* x = static_cast<const T*>(a.x);
  double s = 0;
  for (int64_t i = threadIdx.x; i < count; i += kBlock) s += static_cast<double>(widen(x[((i / a.plane) * a.c + ch) * a.plane + i % a.plane]));
  const double mean = block_sum(s, shared) / static_cast<double>(count);
  double q = 0;
  for (int64_t i = threadIdx.x; i < count; i += kBlock) {
    const double d = static_cast<double>(widen(x[((i / a.plane) * a.c + ch) * a.plane + i % a.plane])) - mean;
    q += d * d;
  }
  const double var = block_sum(q, shared) / static_cast<double>(count);
  if (threadIdx.x == 0) {
    a.scratch[2 * ch] = mean;
    a.scratch[2 * ch + 1] = a.mvn ? 1.0 / (sqrt(var) + a.eps) : 1.0 / sqrt(var + a.eps);
    if (a.running_mean) store_f64(a.running_mean, a.stat_dt, ch, load_f64(a.mean, a.stat_dt, ch) * a.momentum + mean * (1 - a.momentum));
    if (a.running_var) store_f64(a.running_var, a.stat_dt, ch, load_f64(a.var, a.stat_dt, ch) * a.momentum + var * (1 - a.momentum));
  }
}

template <class T>
__global__ void batch_apply_kernel(BatchNormTrain a) {
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.y);
  const int64_t total = a.n * a.c * a.plane;
  for (int64_t i = global_tid(); i < total; i += global_threads()) {
    const int64_t ch = i / a.plane % a.c;
    const double v = (static_cast<double>(widen(x[i])) - a.scratch[2 * ch]) * a.scratch[2 * ch + 1];
    y[i] = narrow<T>(a.mvn ? v : v * load_f64(a.scale, a.param_dt, ch) + load_f64(a.bias, a.param_dt, ch));
  }
}

template <class T>
__global__ void dropout_kernel(DropoutTrain a) {
  const double ratio = a.ratio ? load_f64(a.ratio, a.ratio_dt, 0) : a.ratio_value;
  const bool training = a.training ? static_cast<const uint8_t*>(a.training)[0] != 0 : a.training_value;
  const bool all = !training || ratio == 0;
  const bool bad = training && !(ratio >= 0 && ratio < 1);
  if (bad && global_tid() == 0 && a.bad) atomicAdd(a.bad, 1);
  const double scale = 1.0 / (1.0 - ratio);
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.y);
  for (int64_t i = global_tid(); i < a.n; i += global_threads()) {
    const bool keep = !bad && (all || a.draws[i] >= ratio);
    y[i] = all && !bad ? x[i] : narrow<T>(keep ? static_cast<double>(widen(x[i])) * scale : 0.0);
    if (a.mask) static_cast<uint8_t*>(a.mask)[i] = keep ? 1 : 0;
  }
}

}  // namespace

cudaError_t batch_norm_train(const BatchNormTrain& a, cudaStream_t s) {
  if (a.n < 1 || a.c < 1 || a.plane < 1 || !is_float(a.param_dt) || !is_float(a.stat_dt) || !a.scratch ||
      (!a.mvn && (!a.scale || !a.bias || !a.mean || !a.var))) {
    return cudaErrorInvalidValue;
  }
  return dispatch_float(a.dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    batch_stats_kernel<T><<<unsigned(a.c), kBlock, 0, s>>>(a);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    batch_apply_kernel<T><<<grid_for(a.n * a.c * a.plane), kBlock, 0, s>>>(a);
    return cudaGetLastError();
  });
}

cudaError_t dropout_train(const DropoutTrain& a, cudaStream_t s) {
  if (a.n < 0 || (a.ratio && !is_float(a.ratio_dt)) || !a.draws) return cudaErrorInvalidValue;
  if (a.n == 0) return cudaSuccess;
  return dispatch_float(a.dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    dropout_kernel<T><<<grid_for(a.n), kBlock, 0, s>>>(a);
    return cudaGetLastError();
  });
}

}  // namespace kiln::cuda::k
