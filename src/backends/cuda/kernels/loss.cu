// NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (ops/loss.cc): one thread per (sample,
// position) picks its class's log-probability (after a log-softmax over the classes, for SCE),
// weighs it and flags an out-of-range target; the reductions sum the per-position losses and
// weights in one block, in a fixed order, so the result does not vary from run to run.
#include "backends/cuda/kernels/common.cuh"

namespace kiln::cuda::k {

namespace {

template <class T, class I>
__global__ void loss_terms_kernel(const T* __restrict__ x, const I* __restrict__ target, const T* __restrict__ weight,
                                  LossShape sh, T* __restrict__ log_prob, float* __restrict__ terms,
                                  float* __restrict__ weights, T* __restrict__ loss_none, int* bad) {
  const int64_t total = sh.n * sh.inner;
  for (int64_t at = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; at < total; at += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = at / sh.inner, i = at % sh.inner;
    const T* xs = x + b * sh.classes * sh.inner + i;  // class c at xs[c * inner]
    float lse = 0;
    if (sh.softmax) {
      float mx = -INFINITY, sum = 0;
      for (int64_t c = 0; c < sh.classes; ++c) mx = fmaxf(mx, to_f(xs[c * sh.inner]));
      for (int64_t c = 0; c < sh.classes; ++c) sum += expf(to_f(xs[c * sh.inner]) - mx);
      lse = mx + logf(sum);
      if (log_prob) {
        for (int64_t c = 0; c < sh.classes; ++c) {
          log_prob[b * sh.classes * sh.inner + c * sh.inner + i] = from_f<T>(to_f(xs[c * sh.inner]) - lse);
        }
      }
    }
    const int64_t cls = int64_t(target[at]);
    float l = 0, w = 0;
    if (!(sh.has_ignore && cls == sh.ignore_index)) {
      if (cls < 0 || cls >= sh.classes) {
        atomicAdd(bad, 1);
      } else {
        w = weight ? to_f(weight[cls]) : 1.0f;
        l = -(to_f(xs[cls * sh.inner]) - lse) * w;
      }
    }
    if (loss_none) loss_none[at] = from_f<T>(l);
    if (terms) {
      terms[at] = l;
      weights[at] = w;
    }
  }
}

// One block: out = sum(terms) (or / sum(weights) for the mean), summed per thread in index order
// and then as a fixed tree.
template <class T>
__global__ void loss_reduce_kernel(const float* __restrict__ terms, const float* __restrict__ weights, int64_t count,
                                   bool mean, T* __restrict__ out) {
  __shared__ float st[kBlock], sw[kBlock];
  float t = 0, w = 0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
    t += terms[i];
    w += weights[i];
  }
  st[threadIdx.x] = t;
  sw[threadIdx.x] = w;
  __syncthreads();
  for (int s = kBlock / 2; s > 0; s /= 2) {
    if (int(threadIdx.x) < s) {
      st[threadIdx.x] += st[threadIdx.x + s];
      sw[threadIdx.x] += sw[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = from_f<T>(mean ? st[0] / sw[0] : st[0]);
}

}  // namespace

cudaError_t loss(DT dt, const void* x, const void* target, DT target_dt, const void* weight, const LossShape& sh,
                 void* out, void* log_prob, float* scratch, int* bad, cudaStream_t s) {
  if (sh.n < 0 || sh.classes < 1 || sh.inner < 1 || (target_dt != DT::kI64 && target_dt != DT::kI32)) {
    return cudaErrorInvalidValue;
  }
  const int64_t count = sh.n * sh.inner;
  return dispatch_f32ish(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    float* terms = sh.reduction == 0 ? nullptr : scratch;
    float* weights = sh.reduction == 0 ? nullptr : scratch + count;
    T* none = sh.reduction == 0 ? static_cast<T*>(out) : nullptr;
    if (count > 0) {
      if (target_dt == DT::kI64) {
        loss_terms_kernel<<<grid_for(count), kBlock, 0, s>>>(static_cast<const T*>(x), static_cast<const int64_t*>(target),
                                                             static_cast<const T*>(weight), sh, static_cast<T*>(log_prob),
                                                             terms, weights, none, bad);
      } else {
        loss_terms_kernel<<<grid_for(count), kBlock, 0, s>>>(static_cast<const T*>(x), static_cast<const int32_t*>(target),
                                                             static_cast<const T*>(weight), sh, static_cast<T*>(log_prob),
                                                             terms, weights, none, bad);
      }
    }
    if (sh.reduction != 0) {
      loss_reduce_kernel<<<1, kBlock, 0, s>>>(terms, weights, count, sh.reduction == 2, static_cast<T*>(out));
    }
    return cudaGetLastError();
  });
}

}  // namespace kiln::cuda::k
