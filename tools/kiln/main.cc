// kiln: compile and run ONNX models. Subcommands (like trtexec, but split by job):
//   kiln inspect model.onnx [--ir] [--dot FILE]
//   kiln run model.onnx --input NAME=FILE.npy ... [--random-inputs --seed S] [--output-dir DIR] [--check-finite]
//   kiln compare model.onnx --inputs DIR --reference DIR [--rtol R --atol A]
//   kiln build model.onnx -o model.kiln [--device D] [--fp16|--bf16|--tf32] [--report] [--int8|--fp8 --calib DIR]
//   kiln bench model.onnx|model.kiln --batch N --warmup W --iterations I [--json FILE]
//   kiln quantize model.onnx --calib DIR --precision int8|fp8 -o model.qdq.onnx [--report r.json]
//   kiln plan-parallel model.onnx --gpus 1,2,4,8 [--shapes ...] [--fp16] [--link-gbps G]
//   kiln serve --model-repository DIR [--http-port 8000]
// inspect, run, compare and bench also take an engine file (model.kiln) in place of the model.
// run, compare, build and bench optimize the graph first: [--disable-pass NAME]... [--dump-ir-after
// PASS|all] [--pass-report]
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>
#include <exception>
#include <string>

#include "cli.h"
#include "passes/pipeline.h"

namespace {

// --batch N: a positive integer, said in those words (CLI11's PositiveNumber prints its range as
// 0 to 1.8e308).
const CLI::Validator kPositiveInt(
    [](std::string& s) -> std::string {
      size_t end = 0;
      long long v = 0;
      try {
        v = std::stoll(s, &end);
      } catch (const std::exception&) {
        end = 0;
      }
      return end == s.size() && end > 0 && v > 0 ? "" : "must be a positive integer, not '" + s + "'";
    },
    "N>0");

// Pass names are checked as the command line is parsed, before the model is loaded, by the pass
// manager's own option check (one list of passes, one message).
CLI::Validator pass_name(bool dump) {
  return CLI::Validator(
      [dump](std::string& s) -> std::string {
        kiln::PassOptions o;
        if (dump) {
          o.dump_ir_after = s;
        } else {
          o.disabled = {s};
        }
        // Every pass a build may run: the default pipeline and the tensor-parallel split.
        kiln::Status st = kiln::check_pass_options(kiln::tensor_parallel_pipeline(2, 0, nullptr), o);
        return st ? "" : st.message();
      },
      "PASS");
}

void add_warm_shapes_option(CLI::App* app, kiln::cli::LoadOptions& load) {
  app->add_option("--warm-shapes", load.warm_shapes,
                  "a dynamic engine: plan this shape at build and load and capture it in each new session before its "
                  "first run, e.g. ids:8x128 (inputs sharing its dims follow; NAME:DIMS,NAME:DIMS for several inputs; "
                  "repeatable)");
}

void add_load_options(CLI::App* app, kiln::cli::LoadOptions& load) {
  app->add_option("model", load.model, "ONNX model, or an engine file from `kiln build -o`")->required();
  app->add_option("--shapes", load.shapes, "bind an input's shape, e.g. input:1x3x224x224, or give ranges for a dynamic engine, e.g. ids:1..64x16..512@128 (repeatable)");
  add_warm_shapes_option(app, load);
}

void add_input_options(CLI::App* app, kiln::cli::RunOptions& run) {
  app->add_option("--input", run.inputs, "NAME=FILE.npy, one per input (repeatable)");
  app->add_flag("--random-inputs", run.random_inputs, "fill inputs not given with seeded random data");
  app->add_option("--seed", run.seed, "seed for --random-inputs")->default_val(0);
}

void add_engine_options(CLI::App* app, kiln::cli::EngineOptions& eng) {
  app->add_option("--device", eng.device, "auto (GPU when usable, else CPU), cpu (oneDNN where it applies), cpu-ref (the reference kernels alone) or cuda")->default_val("auto");
  auto* f16 = app->add_flag_callback("--fp16", [&eng] { eng.precision = "fp16"; }, "GPU: fp16 storage, fp32 accumulation");
  auto* b16 = app->add_flag_callback("--bf16", [&eng] { eng.precision = "bf16"; }, "GPU: bf16 storage, fp32 accumulation");
  auto* t32 = app->add_flag_callback("--tf32", [&eng] { eng.precision = "tf32"; }, "GPU: fp32 storage, TF32 matrix math");
  f16->excludes(b16)->excludes(t32);
  b16->excludes(t32);
  app->add_flag("--no-cuda-graph", eng.no_cuda_graph, "GPU: launch step by step instead of replaying a CUDA graph");
  app->add_flag("--no-autotune", eng.no_autotune,
                "GPU: take the libraries' heuristic choices instead of timing candidates at build");
  app->add_option("--timing-cache", eng.timing_cache,
                  "GPU: autotuning results kept between builds in FILE (default: the kiln cache folder's "
                  "timing.cache; none: no file)");
  app->add_option("--memory-budget", eng.memory_budget_mib,
                  "MiB one session may hold (GPU: weights, arena, workspace; CPU: weights, reordered copies, peak "
                  "activations); a plan over it fails at build")
      ->check(kPositiveInt);
  app->add_option("--tensor-parallel", eng.tensor_parallel,
                  "split the model over N ranks, Megatron style: GPUs 0..N-1 with NCCL (or CPU threads); needs fixed "
                  "shapes")
      ->check(kPositiveInt);
  app->add_option("--micro-batches", eng.micro_batches,
                  "with --tensor-parallel and --batch: run the batch as M micro-batches at once, one's all-reduces "
                  "beside another's products (default 0: 2 where each row is computed on its own and the "
                  "all-reduces are large enough to pay; 1: off)")
      ->check(CLI::Range(0, 64));
  app->add_option("--target", eng.target,
                  "server (default) or edge: batch-1 latency on the CPU (unless --device names one), leading "
                  "symbolic dims bound to 1, the session's memory reported against --memory-budget")
      ->check(CLI::IsMember({"server", "edge"}));
  app->add_flag("--deterministic", eng.deterministic,
               "bit-identical outputs run to run and whatever the number of CPU threads (OMP_NUM_THREADS): CPU "
               "steps whose sums depend on the thread split run on the reference kernels");
  app->add_option("--disable-pass", eng.optimize.disabled, "skip a graph pass by name, e.g. cse (repeatable)")
      ->check(pass_name(false));
  app->add_option("--dump-ir-after", eng.optimize.dump_ir_after, "print the IR to stderr after PASS, or after all")
      ->check(pass_name(true));
  app->add_flag("--pass-report", eng.optimize.report, "print each graph pass's time and node counts to stderr");
}

// Replaces this process with kiln-serve from this binary's folder, passing the arguments after "serve".
int exec_serve(int argc, char** argv) {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  std::string dir = n > 0 ? std::string(self, size_t(n)) : std::string(argv[0]);
  dir = dir.substr(0, dir.rfind('/') + 1);
  std::string server = dir + "kiln-serve";
  std::vector<char*> args = {server.data()};
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  execv(server.c_str(), args.data());
  std::fprintf(stderr, "kiln: error: kiln serve runs %s, which cannot be started: %s\n", server.c_str(), std::strerror(errno));
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kiln::cli;
  CLI::App app{"kiln: an ahead-of-time compiler and runtime for ONNX models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "kiln 0.2.0");

  LoadOptions load;
  InspectOptions inspect;
  RunOptions run;
  CompareOptions compare;
  EngineOptions eng;
  BuildCliOptions build;
  BenchOptions bench;
  QuantizeCliOptions quant;

  CLI::App* ins = app.add_subcommand("inspect", "print a model's inputs, outputs, opsets, op histogram and parameters");
  add_load_options(ins, load);
  ins->add_flag("--ir", inspect.ir, "print the imported graph as kiln IR text");
  ins->add_option("--dot", inspect.dot, "write the graph as Graphviz to FILE");

  CLI::App* r = app.add_subcommand("run", "run a model on .npy inputs and write one .npy per output");
  add_load_options(r, load);
  add_input_options(r, run);
  r->add_option("--output-dir", run.output_dir, "write OUTPUT.npy files here");
  r->add_option("--warmup", run.warmup, "untimed runs before timing")->default_val(0);
  r->add_option("--iterations", run.iterations, "timed runs (median and p99 are printed)")->default_val(1);
  r->add_option("--top-k", run.top_k, "print the K highest scores of each float output (classifiers)");
  r->add_option("--labels", run.labels, "class names, one per line, for --top-k");
  r->add_option("--batch", run.batch, "bind the leading symbolic dim of every input to N")->check(kPositiveInt);
  r->add_flag("--check-finite", run.check_finite,
              "fail when an output holds NaN or Inf that the fp32 CPU reference does not; on the GPU, name the "
              "first step that wrote any");
  add_engine_options(r, eng);

  CLI::App* cmp = app.add_subcommand("compare", "run a model and check its outputs against reference .npy files");
  add_load_options(cmp, load);
  add_input_options(cmp, run);
  cmp->add_option("--inputs", compare.inputs_dir, "folder with INPUT.npy per model input")->required();
  cmp->add_option("--reference", compare.reference_dir, "folder with OUTPUT.npy per model output")->required();
  cmp->add_option("--rtol", compare.rtol, "relative tolerance")->default_val(1e-3);
  cmp->add_option("--atol", compare.atol, "absolute tolerance")->default_val(1e-4);
  add_engine_options(cmp, eng);

  CLI::App* b = app.add_subcommand("build", "compile a model into an engine (GPU when usable) and report each node's placement");
  add_load_options(b, load);
  add_engine_options(b, eng);
  b->add_option("-o,--output", build.output, "write the engine file here (model.kiln)");
  b->add_flag("--report", build.report, "print every node's placement and kernel");
  b->add_option("--batch", build.batch, "bind the leading symbolic dim of every input to N (recorded in the engine)")
      ->check(kPositiveInt);
  b->add_flag("--int8", build.int8, "quantize first (int8 QDQ, as kiln quantize; needs --calib), then build");
  b->add_flag("--fp8", build.fp8, "quantize first (fp8 E4M3 QDQ; needs --calib), then build");
  b->add_option("--calib", build.calib, "with --int8/--fp8: calibration samples (kiln quantize's layouts)");
  b->add_option("--calib-method", build.calib_method, "with --int8/--fp8: minmax, percentile or entropy")
      ->default_val("minmax");
  b->add_option("--max-calib", build.max_calib, "with --int8/--fp8: use at most N calibration samples");
  b->add_option("--qdq-output", build.qdq_output, "with --int8/--fp8: also keep the quantized ONNX model here");

  CLI::App* be = app.add_subcommand("bench", "time a model's forward (CUDA events on the GPU)");
  be->add_option("model", load.model, "ONNX model or engine file")->required();
  be->add_option("--shapes", load.shapes, "bind an input's shape, e.g. input:1x3x224x224, or give ranges for a dynamic engine, e.g. ids:1..64x16..512@128 (repeatable)");
  add_warm_shapes_option(be, load);
  add_engine_options(be, eng);
  be->add_option("--batch", bench.batch, "bind the leading symbolic dim of every input to N")->check(kPositiveInt);
  be->add_option("--warmup", bench.warmup, "untimed forwards first")->default_val(20);
  be->add_option("--iterations", bench.iterations, "timed forwards")->default_val(100);
  be->add_option("--json", bench.json, "write the results as JSON");
  be->add_option("--seed", bench.seed, "seed of the random inputs")->default_val(0);
  be->add_flag("--profile", bench.profile,
               "GPU: also run forwards step by step: each ONNX node's time (median of five), FLOPs, bytes and place on the roofline");
  be->add_option("--trace", bench.trace, "with --profile: write that forward as a Chrome/Perfetto trace (JSON)");
  be->add_option("--plot", bench.plot, "with --profile: draw the roofline with every node as SVG");
  be->add_option("--peak-tflops", bench.peak_tflops, "with --profile: the device's peak TFLOP/s (default: its datasheet's, by precision)")
      ->check(CLI::Range(1e-3, 1e6));
  be->add_option("--peak-gbs", bench.peak_gbs, "with --profile: the device's memory bandwidth in GB/s (default: its datasheet's)")
      ->check(CLI::Range(1e-3, 1e7));
  be->add_option("--top", bench.top, "with --profile: nodes in the table")->default_val(20);
  for (const char* f : {"--trace", "--plot", "--peak-tflops", "--peak-gbs", "--top"}) be->get_option(f)->needs("--profile");
  be->add_flag("--report", bench.report, "GPU: print the timed engine's placement report (autotuned choices) first");
  be->add_flag("--shapes-sweep", bench.shapes_sweep,
               "with shape ranges: time the dynamic engine at shapes across them, each beside a static engine built for it");
  be->add_option("--sweep-points", bench.sweep_points, "shapes in the sweep")->default_val(12)->check(kPositiveInt);

  CLI::App* q = app.add_subcommand("quantize", "calibrate a model on sample inputs and write it as QDQ ONNX (int8 or fp8), "
                                                "with its accuracy against fp32");
  q->add_option("model", load.model, "ONNX model (opset 13 or newer)")->required();
  q->add_option("--calib", quant.calib, "calibration samples: DIR/<sample>/<input>.npy, DIR/<input>.npy stacked, or DIR/*.npy")
      ->required();
  q->add_option("-o,--output", quant.output, "write the quantized model here (model.qdq.onnx)")->required();
  q->add_option("--precision", quant.precision, "int8 or fp8 (E4M3)")->default_val("int8");
  q->add_option("--method", quant.method, "activation ranges: minmax, percentile or entropy (int8 only)")
      ->default_val("minmax");
  q->add_option("--percentile", quant.percentile, "for --method percentile")->default_val(99.99);
  q->add_option("--eval", quant.eval, "evaluation samples (same layouts), disjoint from --calib; default: the calibration set");
  q->add_option("--max-calib", quant.max_calib, "use at most N calibration samples");
  q->add_option("--max-eval", quant.max_eval, "use at most N evaluation samples");
  q->add_option("--keep", quant.keep, "keep this ONNX node (name or output name) in float (repeatable)");
  q->add_flag("--quantize-sensitive", quant.quantize_sensitive, "quantize the first convolution and the classifier too");
  q->add_flag("--sensitivity", quant.sensitivity, "measure each layer's error when only it is quantized");
  q->add_option("--accuracy-budget", quant.accuracy_budget, "percent of --metric: keep the fewest sensitive layers in float "
                                                            "that meet it");
  q->add_option("--metric", quant.metric, "the error sensitivity and the budget measure on the first output: top1 "
                                          "(disagreement), rel-l2, cosine (1 - mean row cosine, for embeddings), or auto "
                                          "(cosine for L2-normalized rows, top1 for other [N, C>=10] outputs, "
                                          "else rel-l2)")->default_val("auto");
  q->add_option("--report", quant.report, "write the report as JSON");

  OptimizeCliOptions optz;
  CLI::App* oz = app.add_subcommand("optimize", "build the candidate engines of a model, validate each against fp32, and "
                                                 "register the fastest within the budget as a new version in a repository");
  add_load_options(oz, load);
  add_engine_options(oz, eng);
  oz->add_option("--repo", optz.repo, "the model repository (kiln serve's layout)")->required();
  oz->add_option("--name", optz.name, "the model's folder in it")->required();
  oz->add_option("--validation", optz.validation, "validation samples (kiln quantize's layouts)")->required();
  oz->add_option("--accuracy-budget", optz.budget, "percent of --metric a candidate may lose against fp32")->default_val(0.5)
      ->check(CLI::Range(0.0, 100.0));
  oz->add_option("--metric", optz.metric, "top1, rel-l2, cosine or auto (as kiln quantize)")->default_val("auto");
  oz->add_option("--candidates", optz.candidates, "precisions to try, e.g. fp16,bf16,int8 (default: every one the device "
                                                  "runs, int8 and fp8 too with --calib)");
  oz->add_option("--calib", optz.calib, "calibration samples for the int8/fp8 candidates (kiln quantize's layouts; not "
                                        "the validation samples)");
  oz->add_option("--calib-method", optz.calib_method, "with --calib: minmax, percentile or entropy")->default_val("minmax");
  oz->add_option("--max-calib", optz.max_calib, "with --calib: use at most N calibration samples");
  oz->add_option("--reference", optz.reference, "device of the fp32 reference: cpu-ref (default), cpu or cuda")
      ->default_val("cpu-ref");
  oz->add_option("--iterations", optz.iterations, "timed forwards per candidate")->default_val(50)->check(kPositiveInt);
  oz->add_option("--max-samples", optz.max_samples, "use at most N validation samples");
  oz->add_flag("--promote", optz.promote, "serve the registered version (kiln repo promote)");
  oz->add_option("--server", optz.server, "with --promote: HOST:PORT of the kiln serve to reload");

  RepoCliOptions repo;
  CLI::App* rp = app.add_subcommand("repo", "what a model repository serves: list, promote, rollback (no downtime)");
  rp->require_subcommand(1);
  CLI::App* rl = rp->add_subcommand("list", "every model's versions: status, precision, accuracy, latency; * serves");
  rl->add_option("repo", repo.repo, "the repository")->required();
  rl->add_option("--name", repo.name, "only this model");
  CLI::App* rpr = rp->add_subcommand("promote", "serve a validated version");
  rpr->add_option("repo", repo.repo)->required();
  rpr->add_option("name", repo.name)->required();
  rpr->add_option("version", repo.version)->required()->check(kPositiveInt);
  CLI::App* rrb = rp->add_subcommand("rollback", "serve the version promoted before the current one");
  rrb->add_option("repo", repo.repo)->required();
  rrb->add_option("name", repo.name)->required();
  for (CLI::App* sub : {rpr, rrb}) sub->add_option("--server", repo.server, "HOST:PORT of the kiln serve to reload now");

  PlanParallelOptions pp;
  CLI::App* pl = app.add_subcommand("plan-parallel", "estimate per-GPU memory and communication of a tensor-parallel split "
                                                      "(measured through NCCL where the GPUs are here)");
  pl->add_option("model", load.model, "ONNX model")->required();
  pl->add_option("--shapes", load.shapes, "bind an input's shape, e.g. input_ids:1x512 (repeatable)");
  pl->add_option("--batch", pp.batch, "bind the leading symbolic dim of every input to N")->check(kPositiveInt);
  pl->add_option("--gpus", pp.gpus, "GPU counts to estimate, e.g. 1,2,4,8")->delimiter(',')->check(kPositiveInt);
  pl->add_option("--link-gbps", pp.link_gbps, "bus bandwidth (GB/s) for the estimated communication time");
  pl->add_flag("--no-measure", pp.no_measure, "do not time NCCL all-reduces even where the GPUs are present");
  pl->add_option("--json", pp.json, "write the rows as JSON");
  pl->add_flag_callback("--fp16", [&eng] { eng.precision = "fp16"; }, "16-bit storage (as a --fp16 build)");
  pl->add_flag_callback("--bf16", [&eng] { eng.precision = "bf16"; }, "16-bit storage (as a --bf16 build)");

  // `kiln serve ...` runs kiln-serve (tools/kiln-serve) from beside this binary; listed here for --help.
  app.add_subcommand("serve", "serve a model repository over the KServe v2 protocol, HTTP and gRPC (`kiln serve --help`)")
      ->allow_extras();
  if (argc > 1 && std::string(argv[1]) == "serve") return exec_serve(argc, argv);

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // A usage error reads like every other error (`kiln: error: ...`), with CLI11's exit code.
    std::fprintf(stderr, "kiln: error: %s\nRun with --help for more information.\n", e.what());
    return e.get_exit_code();
  }
  try {
    if (ins->parsed()) return inspect_main(load, inspect);
    if (r->parsed()) return run_main(load, run, eng);
    if (cmp->parsed()) return compare_main(load, run, compare, eng);
    if (b->parsed()) return build_main(load, eng, build);
    if (q->parsed()) return quantize_main(load.model, quant);
    if (oz->parsed()) return optimize_main(load, eng, optz);
    if (rp->parsed()) {
      repo.action = rl->parsed() ? "list" : (rpr->parsed() ? "promote" : "rollback");
      return repo_main(repo);
    }
    if (pl->parsed()) return plan_parallel_main(load, eng, pp);
    if (be->parsed()) return bench.shapes_sweep ? sweep_main(load, eng, bench) : bench_main(load, eng, bench);
  } catch (const std::bad_alloc&) {
    return fail(KILN_ERROR(kOutOfMemory, "out of host memory"));
  } catch (const std::exception& e) {
    return fail(KILN_ERROR(kInternal, "internal error: {}", e.what()));
  }
  return 1;
}
