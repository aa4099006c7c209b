// What the static and the dynamic GPU engines of the public API share (gpu.cc, gpu_dynamic.cc).
// CUDA builds only.
#pragma once

#include "api/engine_impl.h"
#include "backends/cuda/engine.h"
#include "backends/cuda/target.h"

namespace kiln {

nlohmann::json target_json(const cuda::TargetInfo& t);
// Nodes the CUDA backend declined run on the host, which at large batch can be orders of magnitude
// slower and always stops graph capture: say so once, naming the first few and why.
void warn_cpu_nodes(const cuda::BuildReport& r);
cuda::BuildOptions build_options(const BuildConfig& c);
// A CUDA session's check_finite in the public API's terms.
Expected<std::vector<NonFiniteStep>> nonfinite_steps(cuda::Session* s, const std::vector<Data>& inputs);

// A GPU engine for a graph whose inputs have ranged dims (gpu_dynamic.cc): `cache` holds the
// choices timed so far (source: where it came from, for the report).
Expected<std::shared_ptr<DeviceEngine>> build_dynamic_gpu_engine(std::shared_ptr<const Plan> plan, const BuildConfig& c,
                                                                 std::shared_ptr<cuda::TimingCache> cache,
                                                                 std::string source);
// The same from an engine file: its TUNE section is the timing cache the build left.
Expected<std::shared_ptr<DeviceEngine>> load_dynamic_gpu_engine(std::shared_ptr<const Plan> plan, const BuildConfig& c,
                                                                std::string_view tune, const std::string& name);

// "ids:8x128 mask:8x128" for input shapes `s` of graph g, and "k=5" for value inputs (index into
// g's inputs, value): how shape plans are named in reports and errors.
std::string shapes_text(const Graph& g, const std::vector<std::vector<int64_t>>& s,
                        const std::vector<std::pair<size_t, Tensor>>& values = {});
// A static GPU engine over `plan`, whose graph `e` was built from (gpu.cc); `cache_line` starts
// its report.
std::shared_ptr<DeviceEngine> static_gpu_engine(std::shared_ptr<const Plan> plan, std::shared_ptr<cuda::Engine> e,
                                                std::string cache_line);
// A GPU engine for a graph with fixed input shapes whose other shapes depend on values it computes
// (gpu_staged.cc, staged_split.h); `time_misses` as cuda::BuildOptions has it, for the stage
// before the cut.
Expected<std::shared_ptr<DeviceEngine>> build_staged_gpu_engine(std::shared_ptr<const Plan> plan, const BuildConfig& c,
                                                                std::shared_ptr<cuda::TimingCache> cache, bool time_misses);
// The same from an engine file (its STGD section marks it; TUNE is the build's timing cache).
Expected<std::shared_ptr<DeviceEngine>> load_staged_gpu_engine(std::shared_ptr<const Plan> plan, const BuildConfig& c,
                                                               std::string_view tune, const std::string& name);

}  // namespace kiln
