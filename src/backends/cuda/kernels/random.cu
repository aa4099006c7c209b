// RandomUniform(Like), RandomNormal(Like) and Bernoulli: Philox draws from cuRAND's device API,
// keyed by the op's seed, the element's index and a run counter in device memory that every run
// advances (a captured graph replays the increment too), so each forward draws fresh values.
#include <curand_kernel.h>

#include "backends/cuda/kernels/common.cuh"

namespace kiln::cuda::k {

namespace {

template <class T>
__global__ void random_kernel(T* __restrict__ y, int64_t n, int dist, float a, float b, uint64_t seed,
                              const unsigned long long* __restrict__ counter, const void* __restrict__ probs,
                              DT probs_dt) {
  const unsigned long long run = *counter;
  for (int64_t i = global_tid(); i < n; i += global_threads()) {
    curandStatePhilox4_32_10_t st;
    curand_init(seed, static_cast<unsigned long long>(i), run * 4, &st);
    double v;
    if (dist == 1) {
      v = static_cast<double>(a) + static_cast<double>(b) * static_cast<double>(curand_normal(&st));
    } else {
      const double u = 1.0 - static_cast<double>(curand_uniform(&st));  // [0, 1)
      v = dist == 0 ? static_cast<double>(a) + (static_cast<double>(b) - a) * u
                    : (u < load_f64(probs, probs_dt, i) ? 1.0 : 0.0);
    }
    y[i] = narrow<T>(v);
  }
}

__global__ void advance_kernel(unsigned long long* counter) { *counter += 1; }

}  // namespace

cudaError_t random(DT dt, void* y, int64_t n, int dist, float a, float b, uint64_t seed, unsigned long long* counter,
                   const void* probs, DT probs_dt, cudaStream_t s) {
  if (n < 0 || dist < 0 || dist > 2 || (dist == 2 && !probs)) return cudaErrorInvalidValue;
  if (dist == 2 && probs_dt != DT::kF32 && probs_dt != DT::kF16 && probs_dt != DT::kBF16 && probs_dt != DT::kF64) {
    return cudaErrorInvalidValue;
  }
  if (n > 0) {
    const cudaError_t e = dispatch_dt(dt, [&](auto tag) {
      using T = typename decltype(tag)::type;
      random_kernel<T><<<grid_for(n), kBlock, 0, s>>>(static_cast<T*>(y), n, dist, a, b, seed, counter, probs, probs_dt);
      return cudaGetLastError();
    });
    if (e != cudaSuccess) return e;
  }
  advance_kernel<<<1, 1, 0, s>>>(counter);
  return cudaGetLastError();
}

}  // namespace kiln::cuda::k
