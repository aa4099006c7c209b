// What a GPU engine depends on: the device and the library versions it was built with. Recorded in
// the engine file, compared at load (an engine's kernels and autotuned choices are only valid
// where all of these match). No CUDA headers here.
#pragma once

#include <string>

namespace kiln::cuda {

struct TargetInfo {
  std::string gpu;          // "NVIDIA H100 80GB HBM3"
  int sm_major = 0, sm_minor = 0;
  int cuda_runtime = 0;     // cudaRuntimeGetVersion: 13000 for 13.0
  size_t cublaslt = 0;      // cublasLtGetVersion
  size_t cudnn = 0;         // cudnnGetVersion (the loaded library)
};

// The device this process would run on (device 0) and the libraries it loaded; the GPU fields are
// empty without a usable GPU.
TargetInfo current_target();

// Why an engine built for `built` cannot run on `here`, or "" when it can.
std::string target_mismatch(const TargetInfo& built, const TargetInfo& here);

}  // namespace kiln::cuda
