// Signals in and out of cuFFT's complex buffers (fft.cu), for DFT and STFT (lower_fft.cc): the
// input is read into z [batch, n] (float2, or double2 for f64 inputs), cuFFT transforms each row,
// and the rows are written back in ONNX's layout.
#pragma once

#include "backends/cuda/kernels/kernels.h"

namespace kiln::cuda::k {

struct FftPack {
  DT dt = DT::kF32;   // x's (and the window's) type: f32/f16/bf16/f64
  bool f64 = false;   // z holds double2 (else float2)
  int64_t n = 0;      // transform length (z's row length)
  // DFT: x [outer, in_len, inner, in_comp]; row o * inner + i reads x[o, t, i] for t < used, zeros
  // after; irfft fills bins past n/2 by conjugate symmetry.
  int64_t outer = 0, in_len = 0, inner = 1, in_comp = 1, used = 0;
  bool irfft = false;
  // STFT (frames > 0): x [outer, in_len, in_comp]; row b * frames + f reads the frame at f * step,
  // times the window (may be null: ones).
  int64_t frames = 0, step = 0;
};
cudaError_t fft_pack(const FftPack& p, const void* x, const void* window, void* z, cudaStream_t s);

// y [outer, out_len, inner, out_comp] (dt) = z[o * inner + i, k] * scale for k < out_len; out_comp 1
// keeps the real parts.
struct FftUnpack {
  DT dt = DT::kF32;
  bool f64 = false;
  int64_t n = 0, outer = 0, out_len = 0, inner = 1, out_comp = 2;
  double scale = 1;
};
cudaError_t fft_unpack(const FftUnpack& p, const void* z, void* y, cudaStream_t s);

}  // namespace kiln::cuda::k
