// The names of the public enums (include/kiln/engine.h), in kiln_core: the backends print them
// too.
#include "kiln/engine.h"

namespace kiln {

std::string_view device_name(Device d) {
  switch (d) {
    case Device::kAuto: return "auto";
    case Device::kCpu: return "cpu";
    case Device::kCuda: return "cuda";
    case Device::kCpuRef: return "cpu-ref";
  }
  return "?";
}

std::string_view target_name(Target t) {
  switch (t) {
    case Target::kServer: return "server";
    case Target::kEdge: return "edge";
  }
  return "?";
}

std::string_view precision_name(Precision p) {
  switch (p) {
    case Precision::kFp32: return "fp32";
    case Precision::kTf32: return "tf32";
    case Precision::kFp16: return "fp16";
    case Precision::kBf16: return "bf16";
  }
  return "?";
}

}  // namespace kiln
