// Datasheet peaks of the GPUs kiln is likely to run on, for the profiler's roofline (`kiln bench
// --profile`) when the user gives none: dense tensor-core TFLOP/s at fp16/bf16 and tf32, plain fp32
// TFLOP/s, and memory bandwidth in GB/s, from NVIDIA's product pages (half the "with sparsity"
// figures). A bound no kernel exceeds, not a measurement: `--peak-tflops` / `--peak-gbs` take measured
// ones (the device tool's KINDS.md measured ~790 TFLOP/s bf16 and ~4.3 TB/s copies on an H200).
//
//   auto p = datasheet_peaks("NVIDIA H200");   // p->gbs == 4800
#pragma once

#include <optional>
#include <string_view>

namespace kiln {

struct DevicePeaks {
  std::string_view model;  // the datasheet's name for it
  double f16_tflops = 0, tf32_tflops = 0, f32_tflops = 0, gbs = 0;
};

// The peaks of the GPU CUDA names `gpu_name` (cudaDeviceProp::name, "NVIDIA H100 80GB HBM3"), or
// nothing for a GPU not in the table.
std::optional<DevicePeaks> datasheet_peaks(std::string_view gpu_name);

}  // namespace kiln
