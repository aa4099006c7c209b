// `kiln build model.onnx -o model.kiln [--device D] [--fp16|--bf16|--tf32] [--shapes ...] [--report]
//  [--int8|--fp8 --calib DIR [--calib-method M] [--max-calib N] [--qdq-output FILE]]`
// and `kiln bench model.onnx|model.kiln --batch N --warmup W --iterations I [--json FILE]`.
//
// The .kiln file is the engine's plan (src/runtime/engine_file.h): the optimized graph, its weights
// and its steps. Loading it reads no ONNX and runs no graph pass; a GPU engine is lowered for the
// GPU again from the plan's graph as it loads.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli.h"

namespace kiln::cli {

using nlohmann::json;

// `--int8|--fp8 --calib DIR`: quantized as `kiln quantize --precision ... --method CALIB_METHOD`
// would (its report printed first), then built (include/kiln/quantize.h, build_quantized).
Expected<Engine> build_quantized_cli(const LoadOptions& load, const EngineOptions& eng, const BuildCliOptions& opt) {
  if (opt.int8 && opt.fp8) return KILN_ERROR(kInvalidArgument, "--int8 and --fp8 both given; give one");
  if (opt.calib.empty()) {
    return KILN_ERROR(kInvalidArgument, "--{} needs --calib DIR: calibration samples, as for kiln quantize",
                      opt.int8 ? "int8" : "fp8");
  }
  QuantizeCliOptions q;
  q.precision = opt.int8 ? "int8" : "fp8";
  q.method = opt.calib_method;
  q.calib = opt.calib;
  q.max_calib = opt.max_calib;
  KILN_ASSIGN_OR_RETURN(QuantizeConfig qc, quantize_config(q));
  KILN_ASSIGN_OR_RETURN(BuildConfig bc, build_config(load, eng, opt.batch));
  QuantizeReport report;
  Expected<Engine> e = build_quantized(load.model, qc, bc, &report, opt.qdq_output);
  if (!report.text.empty()) std::fputs(report.text.c_str(), stdout);
  if (e && !opt.qdq_output.empty()) std::printf("quantized model: %s\n", opt.qdq_output.c_str());
  return e;
}

int build_main(LoadOptions load, const EngineOptions& eng, const BuildCliOptions& opt) {
  if (is_engine_file(load.model)) {
    return fail(KILN_ERROR(kInvalidArgument, "kiln build takes an .onnx model, not the engine file '{}'", load.model));
  }
  const bool quantized = opt.int8 || opt.fp8;
  if (!quantized && (!opt.calib.empty() || !opt.qdq_output.empty() || opt.max_calib)) {
    return fail(KILN_ERROR(kInvalidArgument, "--calib, --max-calib and --qdq-output go with --int8 or --fp8"));
  }
  auto engine = quantized ? build_quantized_cli(load, eng, opt) : open_engine(load, eng, opt.batch);
  if (!engine) return fail(engine.status());
  std::string report = engine->report();
  if (opt.report) {
    std::printf("%s", report.c_str());
  } else {
    // The summary lines only (everything before the placement table).
    std::printf("%s", report.substr(0, report.find("placement:")).c_str());
  }
  std::printf("build: %.1f ms\n", engine->build_ms());
  if (opt.output.empty()) return 0;
  auto t0 = std::chrono::steady_clock::now();
  if (Status s = engine->save(opt.output); !s) return fail(s);
  const double save_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::error_code ec;
  auto size = std::filesystem::file_size(opt.output, ec);
  std::printf("wrote %s (%.1f MiB, %s engine) in %.1f ms\n", opt.output.c_str(), double(size) / (1 << 20),
              std::string(device_name(engine->device())).c_str(), save_ms);
  return 0;
}

int bench_main(LoadOptions load, EngineOptions eng, const BenchOptions& opt) {
  if (opt.iterations < 1 || opt.warmup < 0) return fail(KILN_ERROR(kInvalidArgument, "--iterations must be >= 1 and --warmup >= 0"));
  const auto t0 = std::chrono::steady_clock::now();
  auto engine = open_engine(load, eng, opt.batch);
  if (!engine) return fail(engine.status());
  // An engine file's load (what a server pays per model version), with the engine's own breakdown.
  const bool from_file = is_engine_file(load.model);
  const double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (from_file) {
    std::printf("load: %.1f ms\n", load_ms);
    print_load_note(*engine);
  }
  RunOptions ro;
  ro.random_inputs = true;
  ro.seed = opt.seed;
  if (from_file) {
    auto rs = engine_run_shapes(*engine, load);
    if (!rs) return fail(rs.status());
    ro.run_shapes = *rs;
  }
  auto inputs = gather_inputs(*engine, ro, "");
  if (!inputs) return fail(inputs.status());
  auto session = engine->create_session();
  if (!session) return fail(session.status());
  // The engine timed below: build-time autotuning may choose differently from one build to the next.
  if (opt.report) std::printf("%s", engine->report().c_str());
  auto times = session->benchmark(views(*inputs), opt.warmup, opt.iterations);
  if (!times) return fail(times.status());
  int64_t batch = opt.batch;
  if (batch <= 0) {
    const auto& in = engine->inputs();
    batch = !in.empty() && !in[0].shape.empty() && in[0].shape[0] > 0 ? in[0].shape[0] : 1;
  }
  double med = percentile(*times, 50), p90 = percentile(*times, 90), p99 = percentile(*times, 99);
  double mean = 0;
  for (double t : *times) mean += t / double(times->size());
  double thr = double(batch) * 1000.0 / med;
  std::string backend(device_name(engine->device()));
  std::string precision = backend == "cuda" ? std::string(precision_name(engine->config().precision)) : "fp32";
  std::printf("model: %s\nbackend: %s %s\nbatch: %lld\n", load.model.c_str(), backend.c_str(),
              precision.c_str(), static_cast<long long>(batch));
  // A staged GPU engine (data-dependent shapes, gpu_staged.cc) synchronises with the host inside each
  // forward: its sessions time forwards by the host clock.
  const bool events = backend == "cuda" && engine->report().find("staged GPU engine:") == std::string::npos;
  std::printf("latency (%s): median %.4f ms, p90 %.4f ms, p99 %.4f ms, mean %.4f ms over %d iterations after %d warm-up\n",
              events ? "CUDA events per forward" : "wall clock", med, p90, p99, mean, opt.iterations, opt.warmup);
  std::printf("throughput: %.1f items/s\n", thr);
  if (backend == "cuda") {
    std::printf("gpu memory: %.1f MiB (weights + arena + workspace + staging)\nbuild: %.1f ms\n",
                double(engine->weight_bytes() + session->device_bytes()) / (1 << 20), engine->build_ms());
  }
  json j;
  if (opt.profile) {
    auto timed = session->profile(views(*inputs));
    if (!timed) return fail(timed.status());
    // The GPU's name is the build report's "device: " line.
    const std::string report = engine->device() == Device::kCuda ? engine->report() : std::string();
    std::string gpu;
    if (size_t at = report.find("\ndevice: "); at != std::string::npos) {
      gpu = report.substr(at + 9, report.find('\n', at + 9) - (at + 9));
    } else if (report.rfind("device: ", 0) == 0) {
      gpu = report.substr(8, report.find('\n') - 8);
    }
    ProfilePeaks peaks = default_peaks(engine->config().precision, engine->device() == Device::kCuda, gpu);
    if (opt.peak_tflops > 0) peaks.tflops = opt.peak_tflops;
    if (opt.peak_gbs > 0) peaks.gbs = opt.peak_gbs;
    peaks.from_flags = opt.peak_tflops > 0 || opt.peak_gbs > 0;
    if (Status st = print_profile(*timed, peaks, {opt.trace, opt.plot, opt.top}, &j); !st) return fail(st);
  }
  if (!opt.json.empty()) {
    j["model"] = load.model;
    j["backend"] = backend;
    j["precision"] = precision;
    j["batch"] = batch;
    j["median_ms"] = med;
    j["p90_ms"] = p90;
    j["p99_ms"] = p99;
    j["mean_ms"] = mean;
    j["iterations"] = opt.iterations;
    j["warmup"] = opt.warmup;
    j["throughput"] = thr;
    j["gpu_memory_bytes"] = backend == "cuda" ? engine->weight_bytes() + session->device_bytes() : 0;
    j["build_ms"] = engine->build_ms();
    if (from_file) j["load_ms"] = load_ms;
    j["times_ms"] = *times;
    std::ofstream f(opt.json);
    f << j.dump(2) << "\n";
    if (!f) return fail(KILN_ERROR(kIo, "{}: cannot write", opt.json));
  }
  return 0;
}

}  // namespace kiln::cli
