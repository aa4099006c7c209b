#include "runtime/device_peaks.h"

namespace kiln {

namespace {

// Matched in order by a piece of the name CUDA reports, so a variant comes before the name it
// contains (H200 NVL before H200, L40S before L4).
struct Entry {
  std::string_view piece;
  DevicePeaks peaks;
};

constexpr Entry kTable[] = {
    {"H200 NVL", {"H200 NVL", 835.5, 417.5, 60.0, 4800}},
    {"H200", {"H200 SXM", 989.4, 494.7, 66.9, 4800}},
    {"H100 NVL", {"H100 NVL", 835.5, 417.5, 60.0, 3900}},
    {"H100 PCIe", {"H100 PCIe", 756.5, 378.0, 51.2, 2000}},
    {"H100", {"H100 SXM", 989.4, 494.7, 66.9, 3350}},
    {"A100-SXM4-80GB", {"A100 SXM 80GB", 312.0, 156.0, 19.5, 2039}},
    {"A100 80GB PCIe", {"A100 PCIe 80GB", 312.0, 156.0, 19.5, 1935}},
    {"A100", {"A100 40GB", 312.0, 156.0, 19.5, 1555}},
    {"L40S", {"L40S", 362.0, 183.0, 91.6, 864}},
    {"L4", {"L4", 121.0, 60.0, 30.3, 300}},
};

}  // namespace

std::optional<DevicePeaks> datasheet_peaks(std::string_view gpu_name) {
  for (const Entry& e : kTable) {
    if (gpu_name.find(e.piece) != std::string_view::npos) return e.peaks;
  }
  return std::nullopt;
}

}  // namespace kiln
