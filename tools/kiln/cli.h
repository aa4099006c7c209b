// The `kiln` command line: option structs grouped by phase (what to load, how to run, how to
// compare), and one function per subcommand. The CLI stays thin: it parses, calls the library,
// prints. Every subcommand returns the process exit code: 0 success, 1 error or mismatch.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "frontend/onnx/importer.h"
#include "ir/tensor.h"
#include "kiln/engine.h"
#include "kiln/quantize.h"

namespace kiln::cli {

// Phase 1: what model, with which input shapes.
struct LoadOptions {
  std::string model;                 // path to the .onnx file
  std::vector<std::string> shapes;   // "NAME:1x3x224x224", repeatable
  std::vector<std::string> warm_shapes;  // "NAME:DIMS[,NAME:DIMS...]", one shape of a dynamic engine each
};

// Phase 2: inputs and how to run.
struct RunOptions {
  std::vector<std::string> inputs;   // "NAME=FILE.npy", repeatable
  bool random_inputs = false;
  uint64_t seed = 0;
  std::string output_dir;
  int warmup = 0;
  int iterations = 1;
  int top_k = 0;                     // print the k largest scores of each output
  std::string labels;                // one class name per line, for --top-k
  int64_t batch = 0;                 // bind the leading symbolic dim of every input (0: leave)
  bool check_finite = false;         // count NaN/Inf in the outputs; on the GPU, name the first step
  // A dynamic engine file's exact input shapes for random data (--shapes on it); else each ranged
  // dim takes its range's largest value.
  std::map<std::string, std::vector<int64_t>> run_shapes;
};

// Phase 3: checking outputs.
struct CompareOptions {
  std::string inputs_dir;
  std::string reference_dir;
  double rtol = 1e-3;
  double atol = 1e-4;
};

// Phase 2a: the graph passes run before any backend sees the graph (src/passes/pipeline.cc).
struct OptimizeOptions {
  std::vector<std::string> disabled;  // --disable-pass NAME, repeatable
  std::string dump_ir_after;          // --dump-ir-after PASS|all: the IR to stderr after it
  bool report = false;                // --pass-report: per-pass time and node counts to stderr
};

// Phase 2b: which engine and how it is built (run, compare, build, bench).
struct EngineOptions {
  OptimizeOptions optimize;
  std::string device = "auto";       // auto: the GPU when usable, else the CPU with a warning
  std::string precision = "fp32";    // fp32, tf32, fp16, bf16 (GPU builds)
  bool no_cuda_graph = false;
  bool no_autotune = false;
  std::string timing_cache;          // --timing-cache FILE|none ("": the kiln cache folder's)
  int64_t memory_budget_mib = 0;     // --memory-budget: GPU memory one session may hold (0: no limit)
  int tensor_parallel = 1;           // --tensor-parallel N: split the model over N ranks (GPUs)
  int micro_batches = 0;             // --micro-batches M: a tensor-parallel batch as M micro-batches at once
  bool deterministic = false;        // --deterministic: bit-identical outputs whatever the CPU threads
  std::string target = "server";     // --target server|edge
};

struct BuildCliOptions {
  std::string output;                // model.kiln
  bool report = false;               // print every node's placement
  int64_t batch = 0;                 // bind the leading symbolic dim of every input (0: leave)
  // Quantize first (`--int8`/`--fp8 --calib DIR`), as `kiln quantize` would, then build the QDQ model.
  bool int8 = false, fp8 = false;
  std::string calib, calib_method = "minmax", qdq_output;
  size_t max_calib = 0;
};

struct PlanParallelOptions {
  std::vector<int> gpus = {1, 2, 4, 8};
  int64_t batch = 0;
  double link_gbps = 0;              // bus bandwidth for the estimate (0: none given)
  bool no_measure = false;           // skip the NCCL measurement where the GPUs are present
  std::string json;
};

struct BenchOptions {
  int64_t batch = 0;                 // bind the leading symbolic dim of every input (0: leave)
  int warmup = 20;
  int iterations = 100;
  std::string json;
  uint64_t seed = 0;
  bool profile = false;              // also time each step (median of 5 step-by-step forwards): profile.cc
  std::string trace, plot;           // with --profile: the step times as a Chrome trace, the roofline as SVG
  double peak_tflops = 0, peak_gbs = 0;  // with --profile: the device's peaks (0: the H100 SXM's)
  size_t top = 20;                   // with --profile: nodes in the table
  bool report = false;               // print the engine's build report (each node's kernel) first
  bool shapes_sweep = false;         // a dynamic engine against static ones across its ranges (sweep.cc)
  int sweep_points = 12;
};

// `kiln quantize` (quantize.cc; include/kiln/quantize.h says what each means).
struct QuantizeCliOptions {
  std::string output;                // -o model.qdq.onnx
  std::string precision = "int8";    // int8 | fp8
  std::string method = "minmax";     // minmax | percentile | entropy
  double percentile = 99.99;
  std::string calib, eval, report;
  size_t max_calib = 0, max_eval = 0;
  std::vector<std::string> keep;
  bool quantize_sensitive = false;
  bool sensitivity = false;
  double accuracy_budget = 0;        // percent
  std::string metric = "auto";       // auto | top1 | rel-l2 | cosine
};

// `kiln serve` (tools/kiln-serve).
struct ServeOptions {
  std::string repository;            // --model-repository DIR
  std::string host = "0.0.0.0";
  int http_port = 8000;
  int grpc_port = 8001;              // 0: no gRPC server
  int http_threads = 128;            // connections served at once
  int metrics_port = 8002;           // 0: no metrics server
  int sessions = 2;                  // per model: requests that run at once
  std::string device = "auto";
  std::string precision = "fp32";    // for model.onnx files built at load
};

// `kiln optimize` (optimize.cc): candidates built, validated and timed, the fastest within the
// budget registered as the next version of REPO/NAME.
struct OptimizeCliOptions {
  std::string repo, name, validation;
  double budget = 0.5;               // percent, by `metric`
  std::string metric = "auto";       // auto, top1, rel-l2, cosine (as kiln quantize)
  std::string candidates;            // "fp16,bf16" ("": every precision the device runs)
  std::string reference = "cpu-ref"; // the device of the fp32 reference
  int iterations = 50;               // timed forwards per candidate
  size_t max_samples = 0;
  bool promote = false;
  std::string server;                // HOST:PORT of a kiln serve to reload on promote
  // Calibration samples for the int8 and fp8 candidates (kiln quantize's layouts; kept apart from
  // the validation samples, which judge them): without them those candidates are not built.
  std::string calib;
  std::string calib_method = "minmax";
  size_t max_calib = 0;
};

// `kiln repo list|promote|rollback` (repo.cc).
struct RepoCliOptions {
  std::string action, repo, name, server;
  int64_t version = 0;
};

struct InspectOptions {
  bool ir = false;
  std::string dot;
};

int inspect_main(const LoadOptions& load, const InspectOptions& opt);
int run_main(const LoadOptions& load, const RunOptions& opt, const EngineOptions& eng);
int compare_main(const LoadOptions& load, const RunOptions& run, const CompareOptions& opt, const EngineOptions& eng);
int build_main(LoadOptions load, const EngineOptions& eng, const BuildCliOptions& opt);
int bench_main(LoadOptions load, EngineOptions eng, const BenchOptions& opt);
int sweep_main(const LoadOptions& load, const EngineOptions& eng, const BenchOptions& opt);
int quantize_main(const std::string& model, const QuantizeCliOptions& opt);
int optimize_main(const LoadOptions& load, const EngineOptions& eng, const OptimizeCliOptions& opt);
int repo_main(const RepoCliOptions& opt);
// The numbered version folders of a model's folder, ascending (repo.cc).
std::vector<int64_t> version_folders(const std::string& model_dir);
// Serves `version` of REPO/NAME: its config.pbtxt's version policy and registry.json; with `server`,
// that kiln serve reloads the model (and nothing changes when it cannot). Failed versions are refused.
Status promote_version(const std::string& repo, const std::string& name, int64_t version, const std::string& server,
                       bool rollback);
int plan_parallel_main(const LoadOptions& load, const EngineOptions& eng, const PlanParallelOptions& opt);
// The QuantizeConfig of `kiln quantize`'s options (tools/kiln/quantize.cc); errors name the option.
Expected<QuantizeConfig> quantize_config(const QuantizeCliOptions& opt);
Expected<Precision> parse_precision(const std::string& p);  // "fp32", "tf32", "fp16", "bf16"
Expected<Device> parse_device(const std::string& d);        // "auto", "cpu", "cuda"

// The engine `load.model` names: an engine file is loaded (nothing is rebuilt; --shapes, --batch,
// --device and the precision flags must agree with how it was built), an ONNX model is built with
// the options (engine_open.cc).
Expected<Engine> open_engine(const LoadOptions& load, const EngineOptions& eng, int64_t batch);
// open_engine for a run on input files (NAME or its file stem -> .npy path): an ONNX model's inputs
// that --shapes and --batch leave open take their files' shapes, so a model with symbolic dims
// builds for them on the GPU as it runs on the CPU, no --shapes needed. A file the model does not
// take (a name it lacks, another rank, a fixed dim that differs) binds nothing, and the input check
// that follows names it.
Expected<Engine> open_engine_for_files(const LoadOptions& load, const EngineOptions& eng, int64_t batch,
                                       const std::map<std::string, std::string>& files);
// The BuildConfig open_engine builds an ONNX model with (device, precision, shapes, engine options).
Expected<BuildConfig> build_config(const LoadOptions& load, const EngineOptions& eng, int64_t batch);
// Whether `path` holds an engine file (by its first bytes, whatever its name).
bool is_engine_file(const std::string& path);
// An engine loaded from a file: its own breakdown of the load ("loaded in ..."), indented; nothing otherwise.
void print_load_note(const Engine& e);

// ---- shared helpers (common.cc) ---------------------------------------------------------------

// Imports the model with the --shapes bindings applied (inspect).
Expected<Model> load_model(const LoadOptions& load);
// "x:1x3x224x224" -> {"x", {1,3,224,224}}; "x:" (a scalar) -> {"x", {}}.
Expected<std::pair<std::string, std::vector<int64_t>>> parse_shape_flag(const std::string& flag);
// A --shapes flag that may give ranges: "ids:1..64x16..512@128" (per dim N, or MIN..MAX[@OPT]).
struct ShapeFlag {
  std::string name;
  std::vector<DimRange> dims;  // exact dims have min == max
  bool ranged = false;         // some dim is a range
};
Expected<ShapeFlag> parse_shape_spec(const std::string& flag);
// A file name for a tensor name: characters outside [A-Za-z0-9._-] become '_'.
std::string file_name_for(const std::string& tensor_name);
// "f32[?,3,224,224]": an engine input or output as messages show it.
std::string info_string(const TensorInfo& t);
// A random tensor for an engine input (fails if a dim is not fixed).
Expected<Tensor> random_input(const TensorInfo& v, uint64_t seed, const std::vector<int64_t>* dims = nullptr);
// --shapes given with an engine file: exact shapes inside the engine's shape ranges, checked (a
// static engine, or a shape outside a range, is an error saying so).
Expected<std::map<std::string, std::vector<int64_t>>> engine_run_shapes(const Engine& e, const LoadOptions& load);
// Checks a user-given tensor against an engine input (dtype, rank, fixed dims).
Status check_input_tensor(const TensorInfo& v, const Tensor& t, const std::string& source);
// Input data in engine-input order: --input files, else DIR/<file_name_for(name)>.npy when
// inputs_dir is given, else random data with --random-inputs; each checked against the engine.
Expected<std::vector<Tensor>> gather_inputs(const Engine& e, const RunOptions& opt, const std::string& inputs_dir);
// Views of tensors kiln holds, for Session::run; and a session's output as a kiln Tensor.
std::vector<TensorView> views(const std::vector<Tensor>& tensors);
Tensor from_host(HostTensor t);
double percentile(std::vector<double> v, double p);
// The peaks `kiln bench --profile` measures against (profile.cc): on the GPU the H100 SXM's dense
// datasheet numbers for the build's precision unless given; on the CPU none unless given (0).
struct ProfilePeaks {
  double tflops = 0, gbs = 0;
  bool from_flags = false;
  std::string source;  // where the defaults came from ("NVIDIA H200 SXM datasheet"), or why there are none
};
// The datasheet's peaks of the GPU `gpu_name` (the build report's device line) at precision p;
// none on the CPU or for a GPU kiln has no datasheet for (the flags then give them).
ProfilePeaks default_peaks(Precision p, bool gpu, std::string_view gpu_name);
struct ProfileOutputs {
  std::string trace, plot;
  size_t top = 20;
};
// Prints the profile (slowest steps; nodes by time with FLOPs, bytes, achieved rates, bound and
// roofline share; op types; the whole forward's floor), adds it to *j when given, and writes the
// trace and the plot when asked.
Status print_profile(const std::vector<StepTime>& steps, const ProfilePeaks& peaks, const ProfileOutputs& out,
                     nlohmann::json* j);

// Prints "kiln: error: <message>" to stderr and returns 1.
int fail(const Status& s);

}  // namespace kiln::cli
