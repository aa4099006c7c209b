#include "backends/cuda/target.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <fmt/format.h>

#include "backends/cuda/device.h"

namespace kiln::cuda {

TargetInfo current_target() {
  static const TargetInfo cached = [] {
  TargetInfo t;
  DeviceInfo d = probe_device();
  if (d.available) {
    t.gpu = d.name;
    t.sm_major = d.sm_major;
    t.sm_minor = d.sm_minor;
  }
  int rt = 0;
  if (cudaRuntimeGetVersion(&rt) == cudaSuccess) t.cuda_runtime = rt;
  t.cublaslt = cublasLtGetVersion();
  t.cudnn = cudnnGetVersion();
  return t;
  }();
  return cached;
}

std::string target_mismatch(const TargetInfo& built, const TargetInfo& here) {
  if (here.gpu.empty()) return "this machine has no usable GPU";
  if (built.gpu != here.gpu || built.sm_major != here.sm_major || built.sm_minor != here.sm_minor) {
    return fmt::format("built for {} (sm_{}{}), this GPU is {} (sm_{}{})", built.gpu, built.sm_major, built.sm_minor,
                       here.gpu, here.sm_major, here.sm_minor);
  }
  if (built.cuda_runtime != here.cuda_runtime) {
    return fmt::format("built with CUDA runtime {}, this kiln has {}", built.cuda_runtime, here.cuda_runtime);
  }
  if (built.cublaslt != here.cublaslt) {
    return fmt::format("built with cuBLASLt {}, this process loaded {}", built.cublaslt, here.cublaslt);
  }
  if (built.cudnn != here.cudnn) return fmt::format("built with cuDNN {}, this process loaded {}", built.cudnn, here.cudnn);
  return "";
}

}  // namespace kiln::cuda
