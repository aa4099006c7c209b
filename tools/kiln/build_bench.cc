// `kiln build model.onnx -o model.kiln [--fp16|--bf16|--tf32] [--shapes ...] [--report]` and
// `kiln bench model.onnx|model.kiln --batch N --warmup W --iterations I [--json FILE]`.
//
// The .kiln artifact is, for now, a small JSON file that records how the engine was built (the
// ONNX file beside it, its size, the bound shapes, the precision) plus the build report; loading
// it re-imports the ONNX file and rebuilds. Serializing the compiled plan comes later.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli.h"

namespace kiln::cli {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kArtifactFormat = "kiln-artifact-0";

bool is_artifact(const std::string& path) { return fs::path(path).extension() == ".kiln"; }

// Reads a .kiln file into load/eng (flags given on the command line win over the artifact's).
Status read_artifact(LoadOptions& load, EngineOptions& eng, bool precision_given) {
  std::ifstream f(load.model);
  if (!f) return KILN_ERROR(kIo, "{}: cannot open", load.model);
  json j = json::parse(f, nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("format", "") != kArtifactFormat) {
    return KILN_ERROR(kInvalidModel, "{}: not a kiln artifact (expected JSON with format '{}')", load.model, kArtifactFormat);
  }
  if (!j.contains("onnx") || !j["onnx"].is_string()) return KILN_ERROR(kInvalidModel, "{}: no 'onnx' entry", load.model);
  fs::path onnx = fs::path(load.model).parent_path() / j["onnx"].get<std::string>();
  std::error_code ec;
  auto size = fs::file_size(onnx, ec);
  if (ec) return KILN_ERROR(kIo, "{}: the ONNX file it was built from, '{}', is missing", load.model, onnx.string());
  if (j.contains("onnx_bytes") && j["onnx_bytes"].is_number() && j["onnx_bytes"].get<uintmax_t>() != size) {
    return KILN_ERROR(kInvalidModel, "{}: '{}' changed since the build ({} bytes, built from {}); rebuild", load.model,
                      onnx.string(), size, j["onnx_bytes"].get<uintmax_t>());
  }
  load.model = onnx.string();
  if (load.shapes.empty() && j.contains("shapes") && j["shapes"].is_array()) {
    for (const auto& s : j["shapes"]) {
      if (s.is_string()) load.shapes.push_back(s.get<std::string>());
    }
  }
  if (!precision_given && j.contains("precision") && j["precision"].is_string()) eng.precision = j["precision"];
  return Status::ok();
}

// --batch N: binds the leading dim of every input whose leading dim is symbolic.
Status bind_batch(LoadOptions& load, int64_t batch) {
  if (batch <= 0) return Status::ok();
  LoadOptions probe = load;
  ImportOptions io;
  io.infer = false;
  KILN_ASSIGN_OR_RETURN(Model m, import_onnx_file(probe.model, io));
  for (const Value* v : m.graph->inputs) {
    bool given = false;
    for (const auto& s : load.shapes) given |= s.rfind(v->name + ":", 0) == 0;
    if (given || !v->type.shape || v->type.shape->rank() == 0) continue;
    const auto& dims = v->type.shape->dims;
    if (dims[0].is_static()) {
      if (dims[0].value() != batch) {
        return KILN_ERROR(kInvalidArgument, "--batch {}: input '{}' has a fixed batch of {} ({})", batch, v->name,
                          dims[0].value(), v->type.shape->to_string());
      }
      continue;
    }
    std::string spec = v->name + ":" + std::to_string(batch);
    for (size_t i = 1; i < dims.size(); ++i) {
      if (!dims[i].is_static()) {
        return KILN_ERROR(kInvalidArgument, "--batch: input '{}' ({}) has other symbolic dims; give --shapes {}:...",
                          v->name, v->type.shape->to_string(), v->name);
      }
      spec += "x" + std::to_string(dims[i].value());
    }
    load.shapes.push_back(spec);
  }
  return Status::ok();
}

}  // namespace

int build_main(LoadOptions load, const EngineOptions& eng, const BuildCliOptions& opt) {
  if (is_artifact(load.model)) return fail(KILN_ERROR(kInvalidArgument, "kiln build takes an .onnx model, not '{}'", load.model));
  if (Status s = bind_batch(load, opt.batch); !s) return fail(s);
  auto m = load_model(load);
  if (!m) return fail(m.status());
  EngineOptions e = eng;
  if (e.device == "auto") e.device = "cuda";  // building is for the GPU; say so if there is none
  auto runner = make_runner(*m->graph, e);
  if (!runner) return fail(runner.status());
  std::string report = (*runner)->report();
  if (opt.report) {
    std::printf("%s", report.c_str());
  } else {
    // The summary lines only (everything before the placement table).
    std::printf("%s", report.substr(0, report.find("placement:")).c_str());
  }
  if (opt.output.empty()) return 0;
  json j;
  j["format"] = kArtifactFormat;
  std::error_code ec;
  fs::path out = fs::absolute(opt.output, ec), model = fs::absolute(load.model, ec);
  j["onnx"] = fs::relative(model, out.parent_path(), ec).string();
  j["onnx_bytes"] = fs::file_size(model, ec);
  j["shapes"] = load.shapes;
  j["precision"] = eng.precision;
  j["report"] = report;
  std::string tmp = opt.output + ".partial";
  {
    std::ofstream f(tmp);
    f << j.dump(2) << "\n";
    if (!f) return fail(KILN_ERROR(kIo, "{}: cannot write", opt.output));
  }
  fs::rename(tmp, opt.output, ec);
  if (ec) return fail(KILN_ERROR(kIo, "{}: cannot write: {}", opt.output, ec.message()));
  std::printf("wrote %s (needs %s beside it)\n", opt.output.c_str(), j["onnx"].get<std::string>().c_str());
  return 0;
}

int bench_main(LoadOptions load, EngineOptions eng, const BenchOptions& opt) {
  if (opt.iterations < 1 || opt.warmup < 0) return fail(KILN_ERROR(kInvalidArgument, "--iterations must be >= 1 and --warmup >= 0"));
  if (is_artifact(load.model)) {
    if (Status s = read_artifact(load, eng, eng.precision != "fp32"); !s) return fail(s);
  }
  if (Status s = bind_batch(load, opt.batch); !s) return fail(s);
  auto m = load_model(load);
  if (!m) return fail(m.status());
  Graph& g = *m->graph;
  RunOptions ro;
  ro.random_inputs = true;
  ro.seed = opt.seed;
  auto inputs = gather_inputs(g, ro, "");
  if (!inputs) return fail(inputs.status());
  auto runner = make_runner(g, eng);
  if (!runner) return fail(runner.status());
  // The engine timed below: build-time autotuning may choose differently from one build to the next.
  if (opt.report) std::printf("%s", (*runner)->report().c_str());
  auto times = (*runner)->bench(*inputs, opt.warmup, opt.iterations);
  if (!times) return fail(times.status());
  int64_t batch = opt.batch;
  if (batch <= 0) {
    batch = 1;
    if (!g.inputs.empty() && g.inputs[0]->type.shape && g.inputs[0]->type.shape->rank() > 0 &&
        g.inputs[0]->type.shape->dims[0].is_static()) {
      batch = g.inputs[0]->type.shape->dims[0].value();
    }
  }
  double med = percentile(*times, 50), p90 = percentile(*times, 90), p99 = percentile(*times, 99);
  double mean = 0;
  for (double t : *times) mean += t / double(times->size());
  double thr = double(batch) * 1000.0 / med;
  std::string backend = (*runner)->name();
  std::printf("model: %s\nbackend: %s %s\nbatch: %lld\n", load.model.c_str(), backend.c_str(),
              backend == "cuda" ? eng.precision.c_str() : "fp32", static_cast<long long>(batch));
  std::printf("latency (%s): median %.4f ms, p90 %.4f ms, p99 %.4f ms, mean %.4f ms over %d iterations after %d warm-up\n",
              backend == "cuda" ? "CUDA events per forward" : "wall clock", med, p90, p99, mean, opt.iterations,
              opt.warmup);
  std::printf("throughput: %.1f items/s\n", thr);
  if (backend == "cuda") {
    std::printf("gpu memory: %.1f MiB (weights + arena + workspace + staging)\nbuild: %.1f ms\n",
                double((*runner)->device_bytes()) / (1 << 20), (*runner)->build_ms());
  }
  std::vector<std::pair<std::string, double>> profile_steps;
  if (opt.profile) {
    auto steps = (*runner)->profile(*inputs);
    if (!steps) return fail(steps.status());
    double total = 0;
    for (const auto& st : *steps) total += st.second;
    std::printf("profile: %zu steps, %.4f ms step by step (no graph); slowest:\n", steps->size(), total);
    std::vector<std::pair<std::string, double>> sorted = *steps;
    std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    for (size_t i = 0; i < sorted.size() && i < 25; ++i) {
      std::printf("  %8.4f ms  %s\n", sorted[i].second, sorted[i].first.c_str());
    }
    // By kind: the op type and the implementation's name, shapes dropped.
    std::map<std::string, std::pair<double, int>> kinds;
    for (const auto& st : *steps) {
      std::string op = "-", impl = st.first;
      if (size_t c = st.first.find("): "); c != std::string::npos) {
        size_t o = st.first.rfind(" (", c);
        if (o != std::string::npos) op = st.first.substr(o + 2, st.first.find(',', o) - o - 2);
        impl = st.first.substr(c + 3);
      } else if (size_t c2 = st.first.find(": "); c2 != std::string::npos) {
        impl = st.first.substr(c2 + 2);
      }
      impl = impl.substr(0, std::min(impl.find(" m="), impl.find(" [")));
      auto& k = kinds[op + "  " + impl];
      k.first += st.second;
      k.second += 1;
    }
    std::vector<std::pair<std::string, std::pair<double, int>>> by(kinds.begin(), kinds.end());
    std::stable_sort(by.begin(), by.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
    std::printf("profile by kind (ms, steps, share):\n");
    for (const auto& [name, v] : by) {
      std::printf("  %8.4f ms %4d  %5.1f%%  %s\n", v.first, v.second, total > 0 ? 100.0 * v.first / total : 0.0,
                  name.c_str());
    }
    profile_steps = *steps;
  }
  if (!opt.json.empty()) {
    json j;
    j["model"] = load.model;
    j["backend"] = backend;
    j["precision"] = backend == "cuda" ? eng.precision : "fp32";
    j["batch"] = batch;
    j["median_ms"] = med;
    j["p90_ms"] = p90;
    j["p99_ms"] = p99;
    j["mean_ms"] = mean;
    if (!profile_steps.empty()) {
      j["profile"] = json::array();
      for (const auto& [label, ms] : profile_steps) j["profile"].push_back({{"step", label}, {"ms", ms}});
    }
    j["iterations"] = opt.iterations;
    j["warmup"] = opt.warmup;
    j["throughput"] = thr;
    j["gpu_memory_bytes"] = (*runner)->device_bytes();
    j["build_ms"] = (*runner)->build_ms();
    j["times_ms"] = *times;
    std::ofstream f(opt.json);
    f << j.dump(2) << "\n";
    if (!f) return fail(KILN_ERROR(kIo, "{}: cannot write", opt.json));
  }
  return 0;
}

}  // namespace kiln::cli
