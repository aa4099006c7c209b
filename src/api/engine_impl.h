// What stands behind the public Engine and Session (include/kiln/engine.h): the plan (always: the
// optimized graph, its weights and its host steps, which is what an engine file holds) and, for a
// GPU engine, the CUDA engine built from the plan's graph.
#pragma once

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>

#include "kiln/engine.h"
#include "runtime/plan.h"

namespace kiln {

// Milliseconds since t: the build and load reports' phase times.
inline double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// The backend-specific part of an engine: the CUDA engine (src/api/gpu.cc) when it runs there.
class DerivedConstants;  // passes/derived_constants.h

class DeviceEngine {
 public:
  virtual ~DeviceEngine() = default;
  virtual std::string report() const = 0;
  virtual size_t weight_bytes() const = 0;
  // The activation arena each session allocates (0 when it varies with the run's shapes).
  virtual size_t arena_bytes() const { return 0; }
  virtual double build_ms() const = 0;
  virtual std::string load_phases() const { return ""; }  // a loaded engine: where its load time went
  // Bytes a session holds beside the plan's weights: the weights reordered into a library's layout.
  virtual size_t reordered_weight_bytes() const { return 0; }
  // Whether the engine file carries the graph's weights (a dynamic engine lowers shape plans from
  // the graph as it runs) rather than only the device plan's.
  virtual bool graph_weights() const { return false; }
  // The plan its engine file holds, when not the optimized graph's (a dynamic engine's: the graph
  // before the passes, which it optimizes per shape).
  virtual std::shared_ptr<const Plan> engine_file_plan() const { return nullptr; }
  virtual nlohmann::json target() const = 0;  // the device and library versions it needs
  // The engine-file sections it adds (the GPU's device plan and its weights, read back).
  virtual Expected<std::map<std::string, std::string>> sections() const = 0;
  // `comm`: the rank's communicator when the engine is one rank of a tensor-parallel engine.
  virtual Expected<std::unique_ptr<Session::Impl>> create_session(void* comm = nullptr) const = 0;
  // A tensor-parallel rank's session that runs micro-batches at once (cuda::Engine::new_lanes_session).
  virtual Expected<std::unique_ptr<Session::Impl>> create_lanes_session(void*, int, std::vector<bool>) const {
    return KILN_ERROR(kUnsupported, "micro-batches at once run on the GPU");
  }
};

struct Engine::Impl {
  BuildConfig config;
  Device device = Device::kCpu;
  std::vector<TensorInfo> inputs, outputs;
  std::map<std::string, DimRange> ranges;  // symbolic dims' ranges (BuildConfig::shape_ranges)
  std::shared_ptr<const Plan> plan;
  std::shared_ptr<DeviceEngine> gpu;  // set when device == kCuda
  std::shared_ptr<DeviceEngine> fast_cpu;  // set when device == kCpu (kCpuRef runs `plan` alone)
  std::string report;                 // the CPU engine's (a GPU engine's comes from `gpu`)
  std::string load_note;              // a loaded engine: where its load time went
  std::string build_note;             // a built engine: where its build time went
  double build_ms = 0;
  // A tensor-parallel engine: its ranks' engines, rank r on GPU r (api/tensor_parallel.cc); this
  // one describes the whole (inputs and outputs are rank 0's, which every rank shares).
  std::vector<Engine> ranks;
  std::string tp_report;  // what the split did, for report()
  // Micro-batches (BuildConfig::micro_batches): the ranks' engines are built for batch / this, and
  // a session runs that many at once; the inputs that carry the batch (axis 0), split among them.
  int micro_batches = 1;
  std::vector<bool> batched;
};

struct Session::Impl {
  virtual ~Impl() = default;
  std::vector<TensorInfo> inputs, outputs;  // the engine's, for messages and checks
  virtual Expected<std::vector<Data>> run(std::vector<Data> inputs) = 0;
  // `wait` false: Session::enqueue.
  virtual Status run_device(const std::vector<TensorView>& inputs, const std::vector<TensorView>& outputs,
                            void* stream, bool wait) = 0;
  virtual Expected<std::vector<double>> benchmark(const std::vector<Data>& inputs, int warmup, int iterations) = 0;
  virtual Expected<std::vector<StepTime>> profile(const std::vector<Data>& inputs) = 0;
  virtual Expected<std::vector<NonFiniteStep>> check_finite(const std::vector<Data>& inputs) = 0;
  virtual size_t device_bytes() const = 0;
};

// Milliseconds of each of `iterations` runs of `s` after `warmup` untimed ones, by the host clock:
// for sessions whose runs synchronise with the host (the CPU's, a staged GPU engine's).
inline Expected<std::vector<double>> host_clock_benchmark(Session::Impl& s, const std::vector<Data>& inputs, int warmup,
                                                          int iterations) {
  std::vector<double> t;
  for (int i = 0; i < warmup + iterations; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    KILN_ASSIGN_OR_RETURN(auto out, s.run(inputs));
    if (i >= warmup) t.push_back(ms_since(t0));
  }
  return t;
}

// What every CPU session shares: host tensors only, a host-clock benchmark over run(), no device
// memory; profile and check_finite report nothing unless a session knows its steps.
struct HostSession : Session::Impl {
  Status run_device(const std::vector<TensorView>&, const std::vector<TensorView>&, void*, bool) override {
    return KILN_ERROR(kInvalidArgument, "this engine runs on the CPU: pass host tensors to Session::run(inputs)");
  }
  Expected<std::vector<double>> benchmark(const std::vector<Data>& inputs, int warmup, int iterations) override {
    return host_clock_benchmark(*this, inputs, warmup, iterations);
  }
  Expected<std::vector<StepTime>> profile(const std::vector<Data>&) override { return std::vector<StepTime>{}; }
  Expected<std::vector<NonFiniteStep>> check_finite(const std::vector<Data>&) override {
    return std::vector<NonFiniteStep>{};
  }
  size_t device_bytes() const override { return 0; }
};

// Binds the config's shapes, batch and ranges to an imported graph and infers its types (build.cc);
// returns the ranged symbols.
Expected<std::map<std::string, DimRange>> bind_config_shapes(Graph& g, const BuildConfig& config);
// The part of a build after the passes (build.cc): the plan, and the GPU engine when the device
// allows; `unoptimized` as build_gpu_engine takes it. Phases' times feed the report's phase line.
struct BuildPhases {
  double import_ms = 0, passes_ms = 0;
};
Expected<Engine> engine_from_graph(std::unique_ptr<Graph> g, const BuildConfig& config, std::map<std::string, DimRange> ranges,
                                   std::unique_ptr<Graph> unoptimized, BuildPhases phases);

// Tensor parallelism (tensor_parallel.cc): a graph with bound, inferred shapes -> one engine per
// rank behind one Engine; its sessions run the ranks together; its engine file holds the ranks'.
// `unbound`: the graph before its shapes were bound, to build micro-batches from (or null), and
// `batched`: which inputs carry the batch (their leading dim was bound by config.batch).
Expected<Engine> build_tensor_parallel(std::unique_ptr<Graph> g, std::unique_ptr<Graph> unbound, std::vector<bool> batched,
                                       const BuildConfig& config, double import_ms);
Expected<std::unique_ptr<Session::Impl>> tensor_parallel_session(const Engine::Impl& e);
Expected<std::string> serialize_tensor_parallel(const Engine::Impl& e);
bool is_tensor_parallel_file(std::string_view bytes);
// A tensor-parallel engine file's ranks' engine files (views of `bytes`) and its header (`header`:
// config, report, device), for loading and for `kiln inspect`.
Expected<std::vector<std::string_view>> tensor_parallel_ranks(std::string_view bytes, const std::string& name,
                                                              nlohmann::json* header);
Expected<Engine> load_tensor_parallel(std::string_view bytes, std::shared_ptr<const void> owner, const std::string& name);
// An engine viewing an engine file's bytes (engine.cc); owner keeps them alive; read_ms for the report.
Expected<Engine> load_engine_view(std::string_view bytes, std::shared_ptr<const void> owner, const std::string& name,
                                  double read_ms);
// A session over a CPU plan (engine.cc).
std::unique_ptr<Session::Impl> cpu_session(std::shared_ptr<const Plan> plan);

// The fast CPU engine (cpu_fast.cc): the plan's steps as oneDNN primitives where they apply
// (backends/cpu/fast_plan.h). `sections` of a loaded engine: its CPUF section. Sessions fall back to
// the reference kernels, with a one-line warning, where oneDNN cannot be loaded.
// A plan whose inputs have symbolic dims runs each distinct input shape on a plan of its own
// (specialize_graph), made at its first run and kept.
Expected<std::shared_ptr<DeviceEngine>> build_fast_cpu_engine(std::shared_ptr<const Plan> plan, const BuildConfig& config);
Expected<std::shared_ptr<DeviceEngine>> load_fast_cpu_engine(std::shared_ptr<const Plan> plan, const BuildConfig& config,
                                                             std::string_view cpuf, const std::string& name);
inline bool is_cpu(Device d) { return d == Device::kCpu || d == Device::kCpuRef; }

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
// `values` binds value inputs (passes/value_inputs.h) as constants: index into g.inputs, value.
// `memo` (may be null), kept by the caller across its calls for one `g`: the weights the passes derive
// (merged projections, folded batch norms) are made on the first call only and shared after.
// `stats` (may be null) gets where the time went. `provenance`: record what the passes removed (the
// build report's placements); plans made while serving, whose report nobody reads, skip it.
struct SpecializeStats {
  int rounds = 0;  // times the pass pipeline ran: 1, or 2 when the first left a value's shape open
  double clone_ms = 0, infer_ms = 0, passes_ms = 0;
};
Expected<std::unique_ptr<Graph>> specialize_graph(const Graph& g, const std::vector<std::vector<int64_t>>& shapes,
                                                  const BuildConfig& config,
                                                  const std::vector<std::pair<size_t, Tensor>>& values = {},
                                                  DerivedConstants* memo = nullptr, SpecializeStats* stats = nullptr,
                                                  bool provenance = true);


// The GPU side (gpu.cc; without CUDA it reports that it is missing). An optimized graph whose
// inputs keep ranged dims builds a dynamic engine (gpu_dynamic.cc).
bool gpu_usable(std::string* why);
int gpu_count();             // GPUs this process sees (0 without CUDA)
Status gpu_select(int ordinal);  // the calling thread's current GPU
// NCCL communicators for GPUs 0..n-1, each freed with its pointer (gpu.cc).
Expected<std::vector<std::shared_ptr<void>>> gpu_communicators(int n);
// Aborts them: peers waiting in a collective return (a rank failed); they cannot be used again.
void gpu_abort_communicators(const std::vector<std::shared_ptr<void>>& comms);
// NCCL all-reduce timing (plan_parallel.h's measure_all_reduce_ms).
Expected<double> gpu_all_reduce_ms(int n, size_t bytes, int iterations);
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
