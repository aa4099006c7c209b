// Build an engine from an ONNX model once, save it, load it anywhere it can run, and run it from
// as many sessions as you like.
//
//   kiln::BuildConfig config;
//   config.precision = kiln::Precision::kFp16;
//   config.shapes["input"] = {1, 3, 224, 224};
//   kiln::Expected<kiln::Engine> engine = kiln::build("resnet50.onnx", config);
//   if (!engine) return fail(engine.status());
//   engine->save("resnet50.kiln");                       // later: kiln::Engine::load("resnet50.kiln")
//
//   kiln::Expected<kiln::Session> session = engine->create_session();
//   std::vector<float> image(1 * 3 * 224 * 224);
//   kiln::TensorView in{kiln::DType::kFloat32, {1, 3, 224, 224}, image.data()};
//   kiln::Expected<std::vector<kiln::HostTensor>> out = session->run({in});
//   const float* scores = out->at(0).data<float>();
//
// An Engine is immutable and cheap to copy (copies share it); its sessions share its weights, and
// each session owns its own activation memory and stream, so sessions run concurrently on
// different threads. One session is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/status.h"
#include "kiln/tensor.h"

namespace kiln {

enum class Device {
  kAuto,    // the GPU when one is usable, else the CPU (with a one-line warning)
  kCpu,     // the CPU: oneDNN primitives where they apply, the reference kernels elsewhere
  kCuda,    // the GPU; an error if there is none
  kCpuRef,  // the CPU reference kernels alone: the oracle other backends are checked against
};
std::string_view device_name(Device d);  // "auto", "cpu", "cuda", "cpu-ref"

// What a build optimizes for.
enum class Target {
  kServer,  // the device asked for (the GPU when usable), any batch the shapes give
  kEdge,    // batch-1 latency on the CPU (unless a device is named), within memory_budget_bytes
};
std::string_view target_name(Target t);  // "server", "edge"

enum class Precision {
  kFp32,
  kTf32,  // fp32 storage, tf32 tensor-core products
  kFp16,  // half storage, fp32 accumulation and statistics
  kBf16,
};
std::string_view precision_name(Precision p);  // "fp32", "tf32", "fp16", "bf16"

// The values one input dim may take at run time: min..max, with opt the size autotuning favours
// (0: max). min == max fixes the dim.
struct DimRange {
  int64_t min = 1, max = 1, opt = 0;
  bool operator==(const DimRange&) const = default;
};

// Everything that shapes an engine. It is recorded in the engine file, so a loaded engine says how
// it was built. Defaults are what `kiln build model.onnx` does.
struct BuildConfig {
  Device device = Device::kAuto;
  Precision precision = Precision::kFp32;  // GPU builds; the CPU backend computes in fp32
  // Concrete dims for inputs ("input_ids" -> {1, 128}); a symbol bound in one input is bound in
  // every input that shares it.
  std::map<std::string, std::vector<int64_t>> shapes;
  int64_t batch = 0;  // > 0: binds every input's leading symbolic dim to it
  // Ranges for inputs' dims, for an engine that runs every shape in them ("input_ids" ->
  // {{1,64},{16,512}}: batch 1..64, sequence 16..512). A dim the model names (ONNX dim_param) takes
  // its range in every input that shares the name; an unnamed one is named "<input>_<dim>". An input
  // is named in `shapes` or here, not both.
  std::map<std::string, std::vector<DimRange>> shape_ranges;
  // Shapes in those ranges to make ready ahead of time (`--warm-shapes`): each entry binds inputs to
  // exact dims ("input_ids" -> {8, 128}; inputs sharing its symbols follow). A GPU engine plans
  // them at build and load with their own timed choices and keeps them, and each new session
  // captures their CUDA graphs before its first run, so their first run costs nothing extra.
  std::vector<std::map<std::string, std::vector<int64_t>>> warm_shapes;
  std::vector<std::string> disabled_passes;  // graph passes to skip, by name ("fuse-attention")
  // > 1: split the model over this many ranks, Megatron style (attention heads and MLP columns,
  // then rows, one AllReduce per block; large embeddings and LM heads by vocabulary): on the GPU,
  // rank r on GPU r of this process with NCCL between them; on the CPU, threads (a correctness
  // reference). Needs fixed input shapes. The report shows what split and each rank's weights.
  int tensor_parallel = 1;
  // A tensor-parallel engine built for a batch (`batch`): run it as this many micro-batches at once,
  // lanes of each rank's CUDA graph, so one micro-batch's all-reduces overlap another's products.
  // 0: 2 on GPU ranks where the graph computes each batch row on its own, the batch divides and a
  // micro-batch's largest all-reduce is large enough for the overlap to pay (the build report says
  // so or why not); 1: one batch.
  int micro_batches = 0;

  // Bit-identical outputs run to run and whatever the number of CPU threads: the fast CPU backend
  // keeps off the oneDNN steps whose sums depend on how work splits across threads (the statistics
  // of GroupNormalization and InstanceNormalization run on the reference kernels instead). It does
  // not change GPU engines yet (docs/determinism.md says what is and is not known there).
  bool deterministic = false;

  bool autotune = true;      // time library algorithms and kiln's kernels at build (else heuristics)
  bool cuda_graph = true;    // replay each forward as one CUDA graph
  size_t workspace_bytes = size_t(64) << 20;  // scratch shared by cuBLASLt and cuDNN per session
  // The memory one session of this engine may hold, 0: no limit. On the GPU: weights + arena +
  // workspace. On the CPU: the weights, the copies the fast backend reorders and the activations
  // live at once at their peak. A plan over it fails at build, before anything large is allocated.
  size_t memory_budget_bytes = 0;
  // kEdge (`kiln build --target edge`): device auto means the CPU, and each input's leading
  // symbolic dim is bound to 1 unless `batch` or `shapes` says otherwise; the report states the
  // session's memory against the budget.
  Target target = Target::kServer;
  // Where autotuning results persist between builds (any model, same GPU and library versions):
  // "" the kiln cache folder's timing.cache ($KILN_CACHE_DIR, else ~/.cache/kiln), "none" no file.
  // Either way the choices an engine uses travel in its engine file.
  std::string timing_cache;

  // CUDA kernel choices. The Hopper GEMM (CUTLASS, up to 2048 rows, 16-bit): 0 where its build-time
  // timing beats cuBLASLt's, 1 wherever it applies, -1 never.
  int gemm_sm90 = 0;
  int gemm_sm90_tile = 0;  // > 0: only this tile width (columns) is considered (kernel studies)

  // Diagnostics to stderr while building (not recorded in the engine): the IR after a pass (its
  // name, or "all"), and each pass's time and node counts.
  std::string dump_ir_after;
  bool print_pass_report = false;
};

// An input or output of an engine. shape[i] < 0: not fixed by the engine (a symbolic dim), whose
// name is dim_names[i] and whose values at run time are min_shape[i]..max_shape[i] (the build's
// range; 0..INT64_MAX when it has none). Fixed dims have an empty name and min == max == shape.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<int64_t> min_shape, max_shape;
  std::vector<std::string> dim_names;
};

class Session;

class Engine {
 public:
  // Reads a .kiln file written by save(). No ONNX is read, no pass runs and nothing is timed. An
  // engine that cannot run here (other format version, truncated or corrupted file, built for
  // another GPU or other library versions) is an error saying which.
  static Expected<Engine> load(const std::string& path);
  static Expected<Engine> load_bytes(const void* data, size_t size, const std::string& name = "<memory>");
  // Writes the engine atomically (a temporary file renamed into place): an error leaves no file.
  Status save(const std::string& path) const;
  Expected<std::string> serialize() const;

  const std::vector<TensorInfo>& inputs() const;
  const std::vector<TensorInfo>& outputs() const;
  Device device() const;  // kCpu or kCuda: where it runs
  const BuildConfig& config() const;
  std::string report() const;  // the build report: placement and kernel of every node, memory plan
  double build_ms() const;     // 0 for a loaded engine
  size_t weight_bytes() const; // weights as the engine holds them (device bytes on the GPU)

  Expected<Session> create_session() const;

  struct Impl;
  explicit Engine(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  const std::shared_ptr<const Impl>& impl() const { return impl_; }

 private:
  std::shared_ptr<const Impl> impl_;
};

// Imports an ONNX model, optimizes it and builds an engine for config.device.
Expected<Engine> build(const std::string& onnx_path, const BuildConfig& config = {});
// The same from a model in memory; external data is read relative to base_dir ("" refuses it).
Expected<Engine> build_from_bytes(const void* data, size_t size, const BuildConfig& config = {},
                                  const std::string& base_dir = "");

// One step of a profiled forward (Session::profile: each step's median over five step-by-step
// forwards): its time, the node it computes, and an estimate of that node's work together with the
// nodes fused into it (multiply-adds count 2; bytes are those crossing the group's edge: what it
// reads from outside, weights included, and what it writes for others, at the build's storage
// size). A node's work is on its first step (its later steps name it with no work); a step of no
// node (a graph input's conversion) names none and has no op. The CUDA backend profiles (a
// tensor-parallel engine: rank 0); the CPU backend returns no steps.
struct StepTime {
  std::string step;  // the node and its implementation
  double ms = 0;
  std::string node;  // the node it computes (name, op type and index), empty for none
  std::string op;    // that node's op type
  double flops = 0;
  double bytes = 0;
};

// A step that wrote NaN or Inf into its float outputs (Session::check_finite).
struct NonFiniteStep {
  std::string step;   // the node and its implementation
  int64_t count = 0;  // NaN and Inf among the values it wrote
  int64_t numel = 0;  // the values it wrote
};

class Session {
 public:
  // Inputs in engine.inputs() order, host memory; outputs in engine.outputs() order. A wrong
  // count, dtype, rank or dim is an error naming the input; the session stays usable.
  Expected<std::vector<HostTensor>> run(const std::vector<TensorView>& inputs);
  // Device pointers (TensorView::on_device) on a GPU engine: reads inputs and writes outputs in
  // place, ordered after the work already on `cuda_stream` (a cudaStream_t; null: the default
  // stream), and returns once the outputs are written. Host views work here too.
  Status run(const std::vector<TensorView>& inputs, const std::vector<TensorView>& outputs,
             void* cuda_stream = nullptr);
  // As run(inputs, outputs, cuda_stream), but returns once the run is queued (TensorRT's
  // enqueueV3): `cuda_stream` is made to wait for it, so work queued there next sees the outputs,
  // and the buffers must stay valid until the stream gets there. Queue every run of a session on
  // one stream. An engine that checks its result on the host after each run (index bounds of
  // Gather and its kin) answers kUnsupported, queuing nothing: use run() for it.
  Status enqueue(const std::vector<TensorView>& inputs, const std::vector<TensorView>& outputs,
                 void* cuda_stream);

  // Times `iterations` forwards after `warmup` with the inputs staged once: milliseconds each
  // (CUDA events around each graph replay on the GPU, the wall clock on the CPU).
  Expected<std::vector<double>> benchmark(const std::vector<TensorView>& inputs, int warmup, int iterations);
  // Five forwards step by step with a timer around each step: each step's median (GPU; empty on
  // the CPU). See StepTime.
  Expected<std::vector<StepTime>> profile(const std::vector<TensorView>& inputs);
  // One forward step by step, counting the NaN and Inf each step writes (GPU; empty on the CPU,
  // whose fp32 result is the reference): the steps that wrote any, in order. The first is where a
  // 16-bit overflow or a bad input starts.
  Expected<std::vector<NonFiniteStep>> check_finite(const std::vector<TensorView>& inputs);
  size_t device_bytes() const;  // device memory this session holds beyond the engine's weights

  struct Impl;
  explicit Session(std::unique_ptr<Impl> impl);
  Session(Session&&) noexcept;
  Session& operator=(Session&&) noexcept;
  ~Session();

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
