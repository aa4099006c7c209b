// One way to call CUDA, cuBLASLt and cuDNN (DESIGN.md rule 7): every call goes through
// KILN_CUDA_TRY, which turns a failure into a Status that records the call's text and the
// library's own error name, e.g.
//   "cudnnConvolutionForward(...) failed: CUDNN_STATUS_BAD_PARAM"
// Out-of-memory results map to ErrorCode::kOutOfMemory so callers can tell them apart.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "support/status.h"

namespace kiln::cuda {

inline Status cuda_status(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return Status::ok();
  cudaGetLastError();  // clear the sticky-free error so later calls are not blamed
  return Status(e == cudaErrorMemoryAllocation ? ErrorCode::kOutOfMemory : ErrorCode::kInternal,
                fmt::format("{} failed: {} ({})", call, cudaGetErrorName(e), cudaGetErrorString(e)));
}
inline Status cuda_status(cublasStatus_t e, const char* call) {
  if (e == CUBLAS_STATUS_SUCCESS) return Status::ok();
  return Status(e == CUBLAS_STATUS_ALLOC_FAILED ? ErrorCode::kOutOfMemory : ErrorCode::kInternal,
                fmt::format("{} failed: cuBLAS status {}", call, int(e)));
}
inline Status cuda_status(cudnnStatus_t e, const char* call) {
  if (e == CUDNN_STATUS_SUCCESS) return Status::ok();
  return Status(e == CUDNN_STATUS_ALLOC_FAILED ? ErrorCode::kOutOfMemory : ErrorCode::kInternal,
                fmt::format("{} failed: {}", call, cudnnGetErrorString(e)));
}

}  // namespace kiln::cuda

#define KILN_CUDA_TRY(call) KILN_RETURN_IF_ERROR(::kiln::cuda::cuda_status((call), #call))
