// What stands behind the public Engine and Session (include/kiln/engine.h): the plan (always: the
// optimized graph, its weights and its host steps, which is what an engine file holds) and, for a
// GPU engine, the CUDA engine built from the plan's graph.
#pragma once

#include <map>
#include <nlohmann/json.hpp>

#include "kiln/engine.h"
#include "runtime/plan.h"

namespace kiln {

// The backend-specific part of an engine: the CUDA engine (src/api/gpu.cc) when it runs there.
class DeviceEngine {
 public:
  virtual ~DeviceEngine() = default;
  virtual std::string report() const = 0;
  virtual size_t weight_bytes() const = 0;
  virtual double build_ms() const = 0;
  virtual std::string load_phases() const { return ""; }  // a loaded engine: where its load time went
  // Whether the engine file carries the graph's weights (a dynamic engine lowers shape plans from
  // the graph as it runs) rather than only the device plan's.
  virtual bool graph_weights() const { return false; }
  // The plan its engine file holds, when not the optimized graph's (a dynamic engine's: the graph
  // before the passes, which it optimizes per shape).
  virtual std::shared_ptr<const Plan> engine_file_plan() const { return nullptr; }
  virtual nlohmann::json target() const = 0;  // the device and library versions it needs
  // The engine-file sections it adds (the GPU's device plan and its weights, read back).
  virtual Expected<std::map<std::string, std::string>> sections() const = 0;
  virtual Expected<std::unique_ptr<Session::Impl>> create_session() const = 0;
};

struct Engine::Impl {
  BuildConfig config;
  Device device = Device::kCpu;
  std::vector<TensorInfo> inputs, outputs;
  std::map<std::string, DimRange> ranges;  // symbolic dims' ranges (BuildConfig::shape_ranges)
  std::shared_ptr<const Plan> plan;
  std::shared_ptr<DeviceEngine> gpu;  // set when device == kCuda
  std::string report;                 // the CPU engine's (a GPU engine's comes from `gpu`)
  std::string load_note;              // a loaded engine: where its load time went
  std::string build_note;             // a built engine: where its build time went
  double build_ms = 0;
};

struct Session::Impl {
  virtual ~Impl() = default;
  std::vector<TensorInfo> inputs, outputs;  // the engine's, for messages and checks
  virtual Expected<std::vector<Data>> run(std::vector<Data> inputs) = 0;
  virtual Status run_device(const std::vector<TensorView>& inputs, const std::vector<TensorView>& outputs,
                            void* stream) = 0;
  virtual Expected<std::vector<double>> benchmark(const std::vector<Data>& inputs, int warmup, int iterations) = 0;
  virtual Expected<std::vector<StepTime>> profile(const std::vector<Data>& inputs) = 0;
  virtual size_t device_bytes() const = 0;
};

// The values a BuildConfig's fields may take (build.cc): an error naming the field otherwise.
Status validate_config(const BuildConfig& c);

// BuildConfig <-> the JSON recorded in engine files (config_json.cc); unknown keys are errors.
nlohmann::json config_to_json(const BuildConfig& c);
Expected<BuildConfig> config_from_json(const nlohmann::json& j);

// Shape ranges (shape_ranges.cc). bind_shape_ranges makes ranged input dims symbolic (fixed ones,
// min == max, static) and returns each symbol's range; symbol_ranges recovers them from a graph so
// bound (a loaded engine's); tensor_infos describes values with them; check_run_shapes is the
// one-line error for a shape a session cannot take (wrong rank, fixed dim, outside a range, a
// shared dim that differs between inputs).
Expected<std::map<std::string, DimRange>> bind_shape_ranges(Graph& g,
                                                            const std::map<std::string, std::vector<DimRange>>& ranges);
std::map<std::string, DimRange> symbol_ranges(const Graph& g, const std::map<std::string, std::vector<DimRange>>& ranges);
std::vector<TensorInfo> tensor_infos(const std::vector<Value*>& values, const std::map<std::string, DimRange>& ranges);
Status check_run_shapes(const std::vector<TensorInfo>& infos, const std::vector<std::vector<int64_t>>& shapes);
std::string describe_range(const DimRange& r);  // "1..64", "16..512@128"
// 1 <= min <= opt <= max (opt 0: max), max within reason; the error names the input and dim.
Status check_dim_range(const std::string& input, size_t k, const DimRange& r);
// A copy of graph `g` (weights shared) with its inputs bound to `shapes` (graph-input order), shapes
// inferred and the default pipeline run, which folds the shape arithmetic the bound dims made
// constant: a dynamic GPU engine's shape plan is lowered from it. `g` may be optimized already.
Expected<std::unique_ptr<Graph>> specialize_graph(const Graph& g, const std::vector<std::vector<int64_t>>& shapes,
                                                  const BuildConfig& config);


// The GPU side (gpu.cc; without CUDA it reports that it is missing). An optimized graph whose
// inputs keep ranged dims builds a dynamic engine (gpu_dynamic.cc).
bool gpu_usable(std::string* why);
// `unoptimized`: the graph before the passes when its inputs have ranged dims (else null).
Expected<std::shared_ptr<DeviceEngine>> build_gpu_engine(std::shared_ptr<const Plan> plan, const BuildConfig& config,
                                                         std::unique_ptr<Graph> unoptimized = nullptr);
// Checks that an engine built for `target` can run here, then binds the device plan its file
// carries (`sections`: DPLN and DWGT): no lowering, nothing timed.
Expected<std::shared_ptr<DeviceEngine>> load_gpu_engine(std::shared_ptr<const Plan> plan, const BuildConfig& config,
                                                        const nlohmann::json& target,
                                                        const std::map<std::string, std::string_view>& sections,
                                                        const std::string& name);

}  // namespace kiln
