// Which backend `kiln` runs on. The CUDA probe is compiled in when the toolkit was found at build
// time; it opens the driver lazily, so a machine with no GPU or driver gets a reason, not a crash.
#include "cli.h"

#ifdef KILN_HAVE_CUDA
#include "backends/cuda/device.h"
#endif

namespace kiln::cli {

std::string backend_summary() {
#ifdef KILN_HAVE_CUDA
  cuda::DeviceInfo d = cuda::probe_device();
  if (d.available) {
    return fmt::format("cpu (GPU {} sm_{}{} found; this build executes on the CPU reference backend)", d.name,
                       d.sm_major, d.sm_minor);
  }
  return fmt::format("cpu (no usable GPU: {})", d.reason);
#else
  return "cpu (built without CUDA)";
#endif
}

}  // namespace kiln::cli
