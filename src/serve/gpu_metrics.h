// Triton's GPU gauges for /metrics, from NVML (the driver's management library, opened with dlopen
// so kiln-serve starts where there is no driver): per GPU, by its UUID,
//   nv_gpu_utilization          fraction of the last sample period a kernel ran (0..1)
//   nv_gpu_memory_total_bytes   device memory
//   nv_gpu_memory_used_bytes    device memory in use (every process's)
//   nv_gpu_power_usage          watts;  nv_gpu_power_limit  watts
// Without NVML or a GPU the text is empty (the CPU-only server exports only the model counters).
#pragma once

#include <string>

namespace kiln::serve {

std::string gpu_metrics_text();

}  // namespace kiln::serve
