// Pooling from a host-planned window table (window.cu): the taps the CPU reference visits
// (ops/nn_util.h's make_window_table), uploaded once, so that dilation, any number of spatial
// dims, asymmetric and SAME pads, ceil_mode and MaxPool's Indices mean the same on both backends.
#pragma once

#include "backends/cuda/kernels/kernels.h"

namespace kiln::cuda::k {

struct PoolTableShape {
  int64_t planes = 0;     // N * C
  int64_t positions = 0;  // output positions per plane
  int64_t in_size = 0;    // input elements per plane
  int kernel_size = 0;    // taps per position
  int mode = 0;           // 0 max, 1 average, 2 Lp
  bool count_pad = false; // average: taps in the explicit padding count toward the divisor
  int p = 2;              // Lp's exponent
  bool column_major = false;  // MaxPool storage_order=1: Indices column-major over the spatial dims
  int rank = 0;               // spatial dims (for column-major indices)
  int64_t in_dims[kMaxRank] = {};
};

// y[plane, pos] (dt: f32/f16/bf16/f64, and i8/u8 for max) folds x's plane over the taps
// table[pos * kernel_size + q]: an element offset in the plane, -1 inside the explicit padding,
// -2 past it (ceil_mode's extra windows). Sums in f64. indices (int64, may be null): the flat
// input index of each maximum, -1 for a window of padding only.
cudaError_t pool_table(DT dt, const void* x, const int32_t* table, const PoolTableShape& s, void* y, int64_t* indices,
                       cudaStream_t st);

}  // namespace kiln::cuda::k
