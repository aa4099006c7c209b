// One time step of RNN, GRU or LSTM (ONNX's equations, default activations) over a batch, after
// the GEMMs: the input projection of every step (gx) and this step's hidden projection (gh = H R^T)
// are cuBLASLt products; this kernel adds the biases and peepholes, applies the gates and updates
// the state in place. One thread per (batch row, hidden unit); math in f32 whatever the storage.
// Only lower_rnn.cc uses it (a header of its own keeps kernels.h, which everything includes, as it is).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels/kernels.h"

namespace kiln::cuda::k {

enum class RnnCell : int {
  kRnn = 0,        // H = tanh(gx + gh + Wb + Rb)
  kLstm = 1,       // gates i, o, f, c
  kGru = 2,        // linear_before_reset = 1: h~ = tanh(gx_h + r * (gh_h + Rb_h) + Wb_h)
  kGruReset = 3,   // linear_before_reset = 0, first half: z -> aux0, r * H -> aux1
  kGruUpdate = 4,  // second half: gh is (r * H) R_h^T [B, H]; z read from aux0
};

struct RnnStep {
  int64_t batch = 0, hidden = 0, steps = 0, k = 0;  // k: this iteration (0..steps-1)
  bool reverse = false;
  // Row (t, b) of the input projection at gx + t * gx_t + b * gx_b (elements), gates side by side.
  const void* gx = nullptr;
  int64_t gx_t = 0, gx_b = 0;
  const void* gh = nullptr;                      // [batch, gates * hidden] (kGruUpdate: [batch, hidden])
  const void* wb = nullptr;                      // input biases [gates * hidden] or null
  const void* rb = nullptr;                      // recurrence biases [gates * hidden] or null
  const void* peep = nullptr;                    // LSTM peepholes [3 * hidden] (i, o, f) or null
  void* h = nullptr;                             // state [batch, hidden], updated in place
  void* c = nullptr;                             // LSTM cell state [batch, hidden]
  void* y = nullptr;                             // output row (t, b) at y + t * y_t + b * y_b, or null
  int64_t y_t = 0, y_b = 0;
  const int32_t* seq_lens = nullptr;             // [batch], or null: every row runs all steps
  int* bad = nullptr;                            // counts lengths outside [0, steps] (taken as clamped)
  void* aux0 = nullptr;                          // GRU: z [batch, hidden]
  void* aux1 = nullptr;                          // GRU: r * H [batch, hidden]
  float clip = 0;                                // > 0: gate inputs clipped to [-clip, clip]
  bool input_forget = false;                     // LSTM: f = 1 - i
};

cudaError_t rnn_step(RnnCell cell, DT dt, const RnnStep& p, cudaStream_t s);

}  // namespace kiln::cuda::k
