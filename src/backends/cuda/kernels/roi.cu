// k::roi_align (roi.h): one thread per output bin.
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/roi.h"

namespace kiln::cuda::k {

namespace {

template <class T>
__global__ void roi_align_kernel(const T* __restrict__ x, const T* __restrict__ rois, const int64_t* __restrict__ batch_index,
                                 int64_t batch, int64_t channels, int64_t num_rois, roi::Align a, T* __restrict__ y,
                                 int* bad) {
  const int64_t bins = a.out_h * a.out_w, total = num_rois * channels * bins, plane = a.height * a.width;
  for (int64_t i = global_tid(); i < total; i += global_threads()) {
    const int64_t bin = i % bins, ch = i / bins % channels, r = i / bins / channels;
    const int64_t b = batch_index[r];
    if (b < 0 || b >= batch) {
      if (bin == 0 && ch == 0) atomicAdd(bad, 1);
      y[i] = narrow<T>(0.0);
      continue;
    }
    double roi[4];
    for (int k = 0; k < 4; ++k) roi[k] = static_cast<double>(widen(rois[r * 4 + k]));
    if (!roi::roi_ok(a, roi)) {  // the CPU reference's error too
      if (bin == 0 && ch == 0) atomicAdd(bad, 1);
      y[i] = narrow<T>(0.0);
      continue;
    }
    const T* p = x + (b * channels + ch) * plane;
    const double v = roi::align_bin(a, roi, bin / a.out_w, bin % a.out_w,
                                    [p](int64_t o) { return static_cast<double>(widen(p[o])); });
    y[i] = narrow<T>(v);
  }
}

}  // namespace

cudaError_t roi_align(DT dt, const void* x, const void* rois, const int64_t* batch_index, int64_t batch, int64_t channels,
                      int64_t num_rois, const roi::Align& a, void* y, int* bad, cudaStream_t s) {
  const int64_t total = num_rois * channels * a.out_h * a.out_w;
  if (total < 0 || a.out_h < 1 || a.out_w < 1 || a.height < 1 || a.width < 1) return cudaErrorInvalidValue;
  if (total == 0) return cudaSuccess;
  return dispatch_float(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    roi_align_kernel<T><<<grid_for(total), kBlock, 0, s>>>(static_cast<const T*>(x), static_cast<const T*>(rois), batch_index,
                                                          batch, channels, num_rois, a, static_cast<T*>(y), bad);
    return cudaGetLastError();
  });
}

}  // namespace kiln::cuda::k
