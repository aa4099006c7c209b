// RoiAlign (roi.cu), its per-bin math shared with the CPU kernel (ops/roi_align_math.h).
#pragma once

#include "backends/cuda/kernels/kernels.h"
#include "ops/roi_align_math.h"

namespace kiln::cuda::k {

// y [rois, channels, a.out_h, a.out_w] (dt: f32/f16/bf16/f64) from x [batch, channels, a.height,
// a.width] and rois [rois, 4] (dt), roi r reading the image batch_index[r] (int64); an index
// outside [0, batch), or a roi that is not roi::roi_ok, is counted in *bad (a device word) and
// gives zeros.
cudaError_t roi_align(DT dt, const void* x, const void* rois, const int64_t* batch_index, int64_t batch, int64_t channels,
                      int64_t num_rois, const roi::Align& a, void* y, int* bad, cudaStream_t s);

}  // namespace kiln::cuda::k
