// The CUDA engine: a graph compiled once for one GPU (weights uploaded, every node lowered to a
// library call or one of kiln's kernels, activations planned into one arena), and Sessions that
// run it. No CUDA headers here, so the CLI and tests include it with any compiler.
//
//   BuildOptions opt;  opt.precision = Precision::kFp16;
//   KILN_ASSIGN_OR_RETURN(auto engine, Engine::build(graph, opt));   // graph: static shapes
//   KILN_ASSIGN_OR_RETURN(auto session, engine->new_session());       // one stream, own arena
//   KILN_ASSIGN_OR_RETURN(std::vector<Data> out, session->run(inputs));
//
// An Engine is immutable after build and may be shared by several Sessions running on different
// threads at once; a Session is used by one thread at a time.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ir/graph.h"
#include "kiln/engine.h"
#include "runtime/placement.h"

namespace kiln::cuda {

class TimingCache;  // timing_cache.h
class WeightPool;   // weight_pool.h

// What a lowering needs on the device besides the graph: a cuDNN and a cuBLASLt handle and the
// autotuning workspace. Each build makes its own unless BuildOptions::build_scratch gives one: a
// dynamic engine's shape plans, lowered one after another as shapes arrive, share one (a new cuDNN
// handle and a 64 MiB allocation per plan were part of each new shape's first run). Made on first
// use on the calling thread's GPU; used by one build at a time (builds hold the device mutation lock).
class BuildScratch {
 public:
  BuildScratch();
  ~BuildScratch();
  BuildScratch(const BuildScratch&) = delete;
  BuildScratch& operator=(const BuildScratch&) = delete;
  struct Impl;
  std::unique_ptr<Impl> impl;
};

// The public precision (include/kiln/engine.h), one enum for the API and the backend.
using ::kiln::Precision;
using ::kiln::precision_name;

struct BuildOptions {
  Precision precision = Precision::kFp32;
  bool cuda_graph = true;          // replay the forward as CUDA graphs (one per run of device steps)
  size_t workspace_bytes = 64u << 20;  // shared scratch for cuBLASLt / cuDNN
  bool autotune = true;            // time cuDNN algorithms at build time (else heuristics)
  bool poison = false;             // tests: fill each session's arena with NaN bytes before use
  // The Hopper GEMM (lower_gemm_sm90.cc: CUTLASS kernels with programmatic dependent launch, 16-bit,
  // up to 2048 rows): 0 where its build-time timing beats cuBLASLt's (autotune only), 1 wherever it
  // applies (tests), -1 never (nor the Hopper 8-bit kernel, quant_form). Why it is on by default: bench/RESULTS.md, "Same binary, gemm_sm90 on
  // and off".
  int gemm_sm90 = 0;
  // The Hopper GEMM's CTA tile width: 0 times every width (32 and 64) and keeps the fastest; > 0 only
  // that width is considered (the op harness covers each).
  int gemm_sm90_tile = 0;
  // Device memory one session may hold with the weights (weights + arena + workspace); 0: no limit.
  // Checked after planning, before the weights are uploaded.
  size_t memory_budget_bytes = 0;
  // Autotuned choices are looked up here before anything is timed, and what is timed is added
  // (timing_cache.h); null: time everything. Only consulted when autotune is on.
  std::shared_ptr<TimingCache> timing_cache;
  // false: a choice the timing cache lacks is taken from its nearest entry of the same form
  // (TimingCache::nearest), else from the library's heuristic; nothing is timed. A dynamic engine
  // lowers the shape plans it makes while it runs this way.
  bool time_misses = true;
  // Weights are taken from and added to this pool instead of the engine's own block: the shape
  // plans of one dynamic engine share their weights (weight_pool.h). Such an engine is not
  // serialized on its own. Null: the engine owns its weights.
  std::shared_ptr<WeightPool> weight_pool;
  // Handles and workspace kept across builds (BuildScratch); null: this build makes and frees its own.
  std::shared_ptr<BuildScratch> build_scratch;
  // Half-precision NHWC convolutions as cuDNN operation graphs with their epilogue and a SiLU
  // (lower_conv_graph.cc): 0 where timing shows the graph engine beats the legacy algorithm and its
  // separate passes, 1 wherever it applies (tests), -1 never.
  int graph_conv = 0;
  // NHWC GroupNormalization in one cooperative launch (k::group_norm_nhwc_one_launch): 0 where timing
  // shows it beats the three launches, 1 wherever it applies (tests), -1 never.
  int group_norm_one = 0;
  // A QDQ model's quantized products (QuantizedMatMul) in a 16-bit build: 0 in 8 bits or 16 bits,
  // whichever its timing finds faster (lower_gemm_quant.cc), 8 always in 8 bits, 16 always in 16.
  // With 8 and gemm_sm90 = 1 the 8-bit product is the Hopper kernel wherever it applies
  // (gemm_sm90_tile 128: its 128x128 tile, 64: its 64x128 one, 0: by the rows), else cuBLASLt's.
  int quant_form = 0;
  // Generated elementwise kernels take their dims and strides as an argument instead of in their
  // source (codegen_elementwise.h), so a dynamic engine's shape plans share one compilation of each.
  bool runtime_dim_kernels = false;
};

// A caller's buffer for Session::run_buffers: host memory or a device pointer on this GPU.
struct IoBuffer {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> dims;
  void* data = nullptr;
  bool on_device = false;
};

// Where each ONNX node's work went (runtime/placement.h): kDevice is this backend ("cuda"),
// kHost a host step on the CPU backend's kernel.
using ::kiln::NodePlacement;
using ::kiln::Placement;

struct BuildReport {
  std::vector<NodePlacement> nodes;
  std::string precision;
  size_t weight_bytes = 0;
  size_t arena_peak = 0, arena_naive = 0, arena_lower_bound = 0;
  size_t workspace_bytes = 0;
  size_t staging_bytes = 0;  // a session's pinned host buffers for the inputs, outputs and bad-index counts
  int steps = 0;            // executed steps per forward (launch groups)
  int cpu_steps = 0;        // steps that run on the host (break graph capture)
  bool cuda_graph = false;  // whether sessions capture a graph
  std::string graph_note;   // "disabled", or how many graphs surround the host steps
  double build_ms = 0;
  // Where a build's time went: handles and workspace, lowering the nodes to steps (with any
  // timing) and the memory plan, then weights, handles and binding the steps (finish).
  double setup_ms = 0, lower_ms = 0, finish_ms = 0;
  std::vector<std::pair<std::string, double>> lower_ms_by_op;  // lowering time per ONNX op kind, largest first
  std::string load_phases;  // a loaded engine: "CUDA context 230.1 ms, weights 48.7 MiB in 9.0 ms, ..."
  std::string device_name;
  std::string to_text() const;  // the `kiln build --report` table
};

class Session;

// Memory that sessions which never run at once share (a dynamic engine's sessions for its shapes,
// which one caller's thread uses one at a time, and each of whose calls returns once its stream is
// done): the arena and workspace on the device, the pinned staging of inputs and outputs on the
// host. A session placed in it takes the current blocks when they are large enough, else makes
// blocks of its own size (or of `reserve_*`, when larger) the new current ones; it keeps the blocks
// it was placed in alive. Its bad-index slots and random-step counters stay its own.
struct SharedSessionMemory {
  std::shared_ptr<void> device, host;  // the current blocks (freed with their last session)
  size_t device_bytes = 0, host_bytes = 0;
  size_t reserve_device = 0, reserve_host = 0;  // the least a new block is made with
};
// Makes `m`'s blocks current with at least `device` / `host` bytes (or the reserve) unless they hold
// that already: a dynamic session makes them when it is created, not on its first run.
Status ensure_shared(SharedSessionMemory& m, size_t device = 0, size_t host = 0);

class Engine {
 public:
  // Fails with a message naming the node when the graph cannot run here (dynamic shapes,
  // an op neither backend can run, GPU out of memory while uploading weights).
  static Expected<std::shared_ptr<Engine>> build(const Graph& g, const BuildOptions& opt);
  // An engine from an engine file's DPLN and DWGT sections (runtime/device_plan.h): weights
  // uploaded and steps bound, with no lowering and no timing. `g` is the plan's graph, whose nodes
  // host steps run; the caller keeps it alive as long as the engine. `name` starts every error.
  static Expected<std::shared_ptr<Engine>> load(const Graph* g, const BuildOptions& opt, std::string_view dpln,
                                                std::string_view dwgt, const std::string& name);
  virtual ~Engine() = default;
  // The DPLN and DWGT sections of this engine (its weights read back from the GPU).
  virtual Expected<std::pair<std::string, std::string>> serialize() const = 0;
  virtual const BuildReport& report() const = 0;
  // `comm`: the rank's ncclComm_t when the engine is one rank of a tensor-parallel engine (its
  // collectives run on it); such an engine refuses a session without one.
  // `shared` (may be null): memory the session is placed in instead of its own (above).
  virtual Expected<std::unique_ptr<Session>> new_session(void* comm = nullptr, SharedSessionMemory* shared = nullptr) = 0;
  // A tensor-parallel rank's session that runs `micro_batches` copies of the engine's batch at once
  // (lanes: an arena and a stream each, one CUDA graph), so one lane's products run while another's
  // collectives are in flight. Its inputs and outputs hold the lanes' rows one after another along
  // axis 0: `batched[i]` says input i does (the others are the same for every lane); every output
  // does. Every lane's collectives go through `comm` on one stream, in one order on every rank.
  virtual Expected<std::unique_ptr<Session>> new_lanes_session(void* comm, int micro_batches,
                                                               std::vector<bool> batched) = 0;
};

class Session {
 public:
  virtual ~Session() = default;
  // Inputs in graph-input order (host tensors of the declared dtypes and shapes); outputs in
  // graph-output order, host tensors of the graph's declared dtypes.
  virtual Expected<std::vector<Data>> run(const std::vector<Data>& inputs) = 0;
  // Stages `inputs` once, then times `iterations` forwards (after `warmup`) with CUDA events
  // around each replay; milliseconds per forward.
  virtual Expected<std::vector<double>> benchmark(const std::vector<Data>& inputs, int warmup, int iterations) = 0;
  // Forwards run step by step (no graph) with CUDA events around each step: each step's median.
  struct ProfiledStep {
    std::string label, node;  // the step's label and its node's describe() at build (empty for none)
    int node_index = -1;      // that node's position in the plan graph's top-level nodes, -1 for none
    double ms = 0;
    size_t float_bytes = 4;   // the engine's storage size of a float (2 in fp16/bf16 builds)
  };
  virtual Expected<std::vector<ProfiledStep>> profile(const std::vector<Data>& inputs) = 0;
  // One forward run step by step (no graph), counting the NaN and Inf of each float value right
  // after the last step that writes it: the steps whose values have any, in order (--check-finite).
  struct NonFinite {
    std::string label;
    int64_t count = 0, numel = 0;
  };
  virtual Expected<std::vector<NonFinite>> check_finite(const std::vector<Data>& inputs) = 0;
  // Device bytes this session holds (arena, workspace, staging).
  virtual size_t device_bytes() const = 0;
  // Returns once the work this session queued is done: a call that failed may return before (a
  // session in shared memory must not let the next session's work overlap it).
  virtual void wait() = 0;
  // Reads inputs from and writes outputs to the caller's buffers (device pointers copied on the
  // device, host ones through DMA), after the work already queued on `stream` (a cudaStream_t,
  // null: the legacy default stream); returns once the outputs are written, or with `wait` false
  // once the run is queued, `stream` made to wait for it (kUnsupported, nothing queued, where the
  // plan's result needs a look on the host: index-bound counters).
  virtual Status run_buffers(const std::vector<IoBuffer>& inputs, const std::vector<IoBuffer>& outputs,
                             void* stream, bool wait = true) = 0;
};

// True when a CUDA device usable by this build is present (reason otherwise).
bool gpu_available(std::string* reason);

// Where this process's session creations went, summed over every session made so far: the handles
// (stream, cuBLASLt, cuDNN), the device and pinned memory, the eager forward that readies the
// libraries, and the CUDA graph's capture and instantiation.
struct SessionInitStats {
  int sessions = 0;
  int eager_runs = 0;  // sessions that ran the eager forward (the first, or one whose capture failed)
  double handles_ms = 0, memory_ms = 0, eager_ms = 0, capture_ms = 0;
};
SessionInitStats session_init_stats();

}  // namespace kiln::cuda
