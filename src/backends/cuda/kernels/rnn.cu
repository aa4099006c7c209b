// RNN/GRU/LSTM time steps (see rnn.h). A row whose sequence is shorter than the iteration keeps
// its state and writes no output (the lowering zero-fills Y first); the reverse direction walks each
// row from its own last step down.
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/rnn.h"

namespace kiln::cuda::k {

namespace {

__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

template <class T>
__device__ __forceinline__ float at(const void* p, int64_t i) {
  return p ? to_f(static_cast<const T*>(p)[i]) : 0.f;
}

template <RnnCell CELL, class T>
__global__ void rnn_step_kernel(RnnStep p) {
  const int64_t H = p.hidden, n = p.batch * H;
  for (int64_t i = global_tid(); i < n; i += global_threads()) {
    const int64_t b = i / H, j = i - b * H;
    int64_t len = p.seq_lens ? p.seq_lens[b] : p.steps;
    if (len < 0 || len > p.steps) {
      if (p.bad && j == 0) atomicAdd(p.bad, 1);
      len = len < 0 ? 0 : p.steps;
    }
    if (p.k >= len) continue;
    const int64_t t = p.reverse ? len - 1 - p.k : p.k;
    const T* gx = static_cast<const T*>(p.gx) + t * p.gx_t + b * p.gx_b;
    auto clip = [&](float v) { return p.clip > 0.f ? fminf(fmaxf(v, -p.clip), p.clip) : v; };
    // Gate g's pre-activation for unit j: input and hidden projections plus both biases.
    constexpr int G = CELL == RnnCell::kLstm ? 4 : CELL == RnnCell::kRnn ? 1 : 3;
    [[maybe_unused]] auto pre = [&](int g) {
      const int64_t o = g * H + j;
      return to_f(gx[o]) + to_f(static_cast<const T*>(p.gh)[b * G * H + o]) + at<T>(p.wb, o) + at<T>(p.rb, o);
    };
    T* h = static_cast<T*>(p.h) + i;
    float hn = 0.f;
    if constexpr (CELL == RnnCell::kRnn) {
      hn = tanhf(clip(pre(0)));
    } else if constexpr (CELL == RnnCell::kLstm) {
      T* c = static_cast<T*>(p.c) + i;
      const float cp = to_f(*c);
      const float it = sigmoid(clip(pre(0) + at<T>(p.peep, j) * cp));
      const float ft = p.input_forget ? 1.f - it : sigmoid(clip(pre(2) + at<T>(p.peep, 2 * H + j) * cp));
      const float ct = tanhf(clip(pre(3)));
      const float cn = ft * cp + it * ct;
      const float ot = sigmoid(clip(pre(1) + at<T>(p.peep, H + j) * cn));
      *c = from_f<T>(cn);
      hn = ot * tanhf(cn);
    } else if constexpr (CELL == RnnCell::kGru) {
      const float z = sigmoid(clip(pre(0))), r = sigmoid(clip(pre(1)));
      const float hh = to_f(static_cast<const T*>(p.gh)[b * 3 * H + 2 * H + j]) + at<T>(p.rb, 2 * H + j);
      const float ht = tanhf(clip(to_f(gx[2 * H + j]) + at<T>(p.wb, 2 * H + j) + r * hh));
      hn = (1.f - z) * ht + z * to_f(*h);
    } else if constexpr (CELL == RnnCell::kGruReset) {
      // gh holds the z and r parts only: [batch, 2 * hidden].
      const float z = sigmoid(clip(to_f(gx[j]) + to_f(static_cast<const T*>(p.gh)[b * 2 * H + j]) + at<T>(p.wb, j) +
                                   at<T>(p.rb, j)));
      const float r = sigmoid(clip(to_f(gx[H + j]) + to_f(static_cast<const T*>(p.gh)[b * 2 * H + H + j]) +
                                   at<T>(p.wb, H + j) + at<T>(p.rb, H + j)));
      static_cast<T*>(p.aux0)[i] = from_f<T>(z);
      static_cast<T*>(p.aux1)[i] = from_f<T>(r * to_f(*h));
      continue;
    } else {  // kGruUpdate: gh = (r * H) R_h^T [batch, hidden]
      const float z = to_f(static_cast<const T*>(p.aux0)[i]);
      const float ht = tanhf(clip(to_f(gx[2 * H + j]) + to_f(static_cast<const T*>(p.gh)[i]) + at<T>(p.wb, 2 * H + j) +
                                  at<T>(p.rb, 2 * H + j)));
      hn = (1.f - z) * ht + z * to_f(*h);
    }
    *h = from_f<T>(hn);
    if (p.y) static_cast<T*>(p.y)[t * p.y_t + b * p.y_b + j] = from_f<T>(hn);
  }
}

template <RnnCell CELL>
cudaError_t launch(DT dt, const RnnStep& p, cudaStream_t s) {
  const unsigned grid = grid_for(p.batch * p.hidden);
  switch (dt) {
    case DT::kF32: rnn_step_kernel<CELL, float><<<grid, kBlock, 0, s>>>(p); break;
    case DT::kF16: rnn_step_kernel<CELL, __half><<<grid, kBlock, 0, s>>>(p); break;
    case DT::kBF16: rnn_step_kernel<CELL, __nv_bfloat16><<<grid, kBlock, 0, s>>>(p); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t rnn_step(RnnCell cell, DT dt, const RnnStep& p, cudaStream_t s) {
  if (p.batch < 0 || p.hidden < 0 || p.steps < 0 || p.k < 0) return cudaErrorInvalidValue;
  if (p.batch * p.hidden == 0) return cudaSuccess;
  switch (cell) {
    case RnnCell::kRnn: return launch<RnnCell::kRnn>(dt, p, s);
    case RnnCell::kLstm: return launch<RnnCell::kLstm>(dt, p, s);
    case RnnCell::kGru: return launch<RnnCell::kGru>(dt, p, s);
    case RnnCell::kGruReset: return launch<RnnCell::kGruReset>(dt, p, s);
    case RnnCell::kGruUpdate: return launch<RnnCell::kGruUpdate>(dt, p, s);
  }
  return cudaErrorInvalidValue;
}

}  // namespace kiln::cuda::k
