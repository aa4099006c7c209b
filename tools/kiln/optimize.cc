// `kiln optimize model.onnx --repo DIR --name M --validation DIR [--accuracy-budget 0.5] [--calib DIR]`:
// builds the candidate engines of a model (each precision the device runs: fp16, bf16, tf32, fp32 on
// the GPU; fp32 on the CPU; with calibration samples, int8 and fp8 as `kiln build --int8|--fp8 --calib`
// makes them: quantized products, the rest fp16 on the GPU and fp32 on the CPU), validates each
// against the fp32 reference on the validation samples, times it,
// and registers the fastest that meets the budget as the next version of DIR/M (model.kiln and
// report.json: accuracy, latency, throughput, memory, build config, the source model's SHA-256).
// When none meets it, the version is recorded as failed (report.json and candidate.kiln, which no
// server loads) and the command exits 1. `--promote` then serves it (`kiln repo promote`).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli.h"
#include "api/engine_impl.h"
#include "frontend/onnx/importer.h"
#include "quant/accuracy.h"
#include "quant/calibration.h"
#include "support/sha256.h"

namespace kiln::cli {

namespace fs = std::filesystem;

namespace {

struct Candidate {
  std::string name;  // "fp16", "int8"
  Precision precision;  // of the build (an int8/fp8 candidate's unquantized parts)
  std::optional<Engine> engine;
  std::vector<quant::OutputAccuracy> accuracy;
  double error = 0;  // percent, by the metric
  bool nonfinite = false;
  double median_ms = 0, p99_ms = 0, build_ms = 0;
  size_t weight_bytes = 0, device_bytes = 0;
  std::string why;  // empty: it meets the budget
};

std::vector<TensorView> views(const quant::Sample& s) {
  std::vector<TensorView> v;
  for (const Tensor& t : s.inputs) v.push_back(TensorView{t.dtype(), t.dims(), const_cast<void*>(t.raw()), false});
  return v;
}

Expected<std::vector<Tensor>> to_tensors(const std::vector<HostTensor>& out) {
  std::vector<Tensor> r;
  for (const HostTensor& h : out) {
    if (h.dtype() == DType::kString) {
      r.emplace_back();
      continue;
    }
    KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::create(h.dtype(), h.shape()));
    if (h.bytes()) std::memcpy(t.raw(), h.raw(), h.bytes());
    r.push_back(std::move(t));
  }
  return r;
}

bool any_nonfinite(const Tensor& t) {
  if (!dtype_is_float(t.dtype())) return false;
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (!std::isfinite(t.as_double(i))) return true;
  }
  return false;
}

Expected<std::vector<std::vector<Tensor>>> run_all(const Engine& e, const std::vector<quant::Sample>& samples) {
  KILN_ASSIGN_OR_RETURN(Session s, e.create_session());
  std::vector<std::vector<Tensor>> outs;
  for (const quant::Sample& x : samples) {
    auto o = s.run(views(x));
    if (!o) return o.status().with_context("sample " + x.source);
    KILN_ASSIGN_OR_RETURN(auto t, to_tensors(*o));
    outs.push_back(std::move(t));
  }
  return outs;
}

std::string now_iso() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

Expected<quant::ErrorMetric> parse_metric(const std::string& m) {
  if (m == "auto") return quant::ErrorMetric::kAuto;
  if (m == "top1") return quant::ErrorMetric::kTop1;
  if (m == "rel-l2") return quant::ErrorMetric::kRelL2;
  if (m == "cosine") return quant::ErrorMetric::kCosine;
  return KILN_ERROR(kInvalidArgument, "--metric is auto, top1, rel-l2 or cosine, not '{}'", m);
}

}  // namespace

int optimize_main(const LoadOptions& load, const EngineOptions& eng, const OptimizeCliOptions& opt) {
  auto go = [&]() -> Expected<int> {
    if (opt.name.empty() || opt.name.find('/') != std::string::npos || opt.name == "." || opt.name == "..") {
      return KILN_ERROR(kInvalidArgument, "--name '{}' is not a model name", opt.name);
    }
    KILN_ASSIGN_OR_RETURN(quant::ErrorMetric metric, parse_metric(opt.metric));
    KILN_ASSIGN_OR_RETURN(Device reference_device, parse_device(opt.reference));
    KILN_ASSIGN_OR_RETURN(Model model, import_onnx_file(load.model));
    KILN_ASSIGN_OR_RETURN(std::vector<quant::Sample> samples,
                          quant::load_samples(*model.graph, opt.validation, opt.max_samples));
    if (samples.empty()) return KILN_ERROR(kInvalidArgument, "{}: no validation samples", opt.validation);
    KILN_ASSIGN_OR_RETURN(BuildConfig base, build_config(load, eng, 0));
    KILN_ASSIGN_OR_RETURN(std::string source_hash, sha256_file(load.model));

    // The reference: fp32 on the reference device (the CPU reference kernels by default).
    BuildConfig rc = base;
    rc.device = reference_device;
    rc.precision = Precision::kFp32;
    KILN_ASSIGN_OR_RETURN(Engine ref_engine, build(load.model, rc));
    KILN_ASSIGN_OR_RETURN(auto reference, run_all(ref_engine, samples));
    std::printf("reference: fp32 on %s, %zu validation samples from %s\n", std::string(device_name(ref_engine.device())).c_str(),
                samples.size(), opt.validation.c_str());

    // Candidates: fp32 first (it says which device the build lands on), then the 16/19-bit forms.
    std::vector<std::string> names;
    for (size_t at = 0; at <= opt.candidates.size();) {
      size_t end = opt.candidates.find(',', at);
      if (end == std::string::npos) end = opt.candidates.size();
      if (end > at) names.push_back(opt.candidates.substr(at, end - at));
      at = end + 1;
    }
    std::vector<Candidate> cands;
    const auto is_quantized = [](const std::string& n) { return n == "int8" || n == "fp8"; };
    bool gpu = false;  // set by the fp32 candidate, built first
    auto measure = [&](const std::string& n) -> Status {
      Candidate c;
      c.name = n;
      BuildConfig bc = base;
      Expected<Engine> e = KILN_ERROR(kInternal, "not built");
      const auto t0 = std::chrono::steady_clock::now();
      if (is_quantized(n)) {
        QuantizeCliOptions q;
        q.precision = n;
        q.method = opt.calib_method;
        q.calib = opt.calib;
        q.max_calib = opt.max_calib;
        KILN_ASSIGN_OR_RETURN(QuantizeConfig qc, quantize_config(q));
        c.precision = gpu ? Precision::kFp16 : Precision::kFp32;
        bc.precision = c.precision;
        e = build_quantized(load.model, qc, bc);
      } else {
        KILN_ASSIGN_OR_RETURN(c.precision, parse_precision(n));
        bc.precision = c.precision;
        e = build(load.model, bc);
      }
      c.build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (!e) {
        c.why = "build failed: " + e.status().message();
        cands.push_back(std::move(c));
        return Status::ok();
      }
      auto ran = run_all(*e, samples);
      if (!ran) {  // recorded, and the other candidates still run
        c.why = "run failed: " + ran.status().message();
        cands.push_back(std::move(c));
        return Status::ok();
      }
      auto& outs = *ran;
      std::vector<quant::Metrics> m(reference[0].size());
      for (size_t s = 0; s < samples.size(); ++s) {
        for (size_t k = 0; k < m.size() && k < outs[s].size(); ++k) {
          quant::accumulate(m[k], reference[s][k], outs[s][k]);
          c.nonfinite = c.nonfinite || (any_nonfinite(outs[s][k]) && !any_nonfinite(reference[s][k]));
        }
      }
      for (size_t k = 0; k < m.size(); ++k) {
        c.accuracy.push_back(quant::finish(m[k]));
        c.accuracy.back().name = e->outputs()[k].name;
      }
      c.error = c.nonfinite ? std::numeric_limits<double>::infinity() : quant::error_of(metric, c.accuracy);
      KILN_ASSIGN_OR_RETURN(Session s, e->create_session());
      auto timed = s.benchmark(views(samples[0]), 10, opt.iterations);
      if (!timed) {
        c.why = "timing failed: " + timed.status().message();
        cands.push_back(std::move(c));
        return Status::ok();
      }
      std::vector<double>& ms = *timed;
      std::sort(ms.begin(), ms.end());
      c.median_ms = ms[ms.size() / 2];
      c.p99_ms = ms[std::min(ms.size() - 1, size_t(std::ceil(0.99 * double(ms.size()))) - 1)];
      c.weight_bytes = e->weight_bytes();
      c.device_bytes = s.device_bytes();
      if (c.nonfinite) c.why = "NaN or Inf the fp32 reference does not have";
      else if (c.error > opt.budget) c.why = fmt::format("error {:.4g}% over the budget {}%", c.error, opt.budget);
      c.engine = std::move(*e);
      cands.push_back(std::move(c));
      return Status::ok();
    };
    for (const std::string& n : names) {
      if (is_quantized(n) && opt.calib.empty()) {
        return KILN_ERROR(kInvalidArgument, "candidate {} needs --calib DIR: calibration samples, apart from the "
                          "validation samples", n);
      }
    }
    if (opt.calib.empty() && (opt.max_calib || opt.calib_method != "minmax")) {
      return KILN_ERROR(kInvalidArgument, "--calib-method and --max-calib go with --calib");
    }
    if (!opt.calib.empty()) {  // a bad calibration folder is the user's error, not a candidate that failed
      KILN_ASSIGN_OR_RETURN(std::vector<quant::Sample> calib, quant::load_samples(*model.graph, opt.calib, opt.max_calib));
      if (calib.empty()) return KILN_ERROR(kInvalidArgument, "{}: no calibration samples", opt.calib);
    }
    KILN_RETURN_IF_ERROR(measure("fp32"));
    gpu = cands[0].engine && cands[0].engine->device() == Device::kCuda;
    if (names.empty()) {
      if (gpu) names = {"fp16", "bf16", "tf32"};
      if (!opt.calib.empty()) names.insert(names.end(), {"int8", "fp8"});
    }
    for (const std::string& n : names) {
      if (n == "fp32") continue;
      if (!gpu && !is_quantized(n)) {
        std::fprintf(stderr, "kiln: warning: candidate %s skipped: the CPU backend computes in fp32\n", n.c_str());
        continue;
      }
      KILN_RETURN_IF_ERROR(measure(n));
    }
    const std::string metric_text = quant::metric_name(quant::resolve(metric, cands[0].accuracy));

    // The fastest within the budget, else the most accurate (recorded, never served).
    Candidate* chosen = nullptr;
    for (Candidate& c : cands) {
      if (c.engine && c.why.empty() && (!chosen || c.median_ms < chosen->median_ms)) chosen = &c;
    }
    Candidate* kept = chosen;
    if (!chosen) {
      for (Candidate& c : cands) {
        if (c.engine && (!kept || c.error < kept->error)) kept = &c;
      }
    }

    const fs::path dir = fs::path(opt.repo) / opt.name;
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) return KILN_ERROR(kIo, "{}: {}", dir.string(), ec.message());
    const std::vector<int64_t> existing = version_folders(dir.string());
    const int64_t version = existing.empty() ? 1 : existing.back() + 1;
    const fs::path vdir = dir / std::to_string(version);
    fs::create_directories(vdir, ec);
    if (ec) return KILN_ERROR(kIo, "{}: {}", vdir.string(), ec.message());
    if (kept) KILN_RETURN_IF_ERROR(kept->engine->save((vdir / (chosen ? "model.kiln" : "candidate.kiln")).string()));

    nlohmann::json report = {{"status", chosen ? "validated" : "failed"},
                             {"model", opt.name},
                             {"version", version},
                             {"created", now_iso()},
                             {"source", fs::absolute(load.model).string()},
                             {"source_sha256", source_hash},
                             {"validation", {{"dir", fs::absolute(opt.validation).string()}, {"samples", samples.size()},
                                             {"reference", std::string(device_name(ref_engine.device())) + " fp32"}}},
                             {"metric", metric_text},
                             {"accuracy_budget_percent", opt.budget},
                             {"candidates", nlohmann::json::array()}};
    std::printf("\n%-6s %12s %10s %10s %12s %10s  %s\n", "cand.", "error %", "median ms", "p99 ms", "weights MiB",
                "build s", "verdict");
    for (const Candidate& c : cands) {
      nlohmann::json j = {{"precision", c.name}, {"error_percent", std::isfinite(c.error) ? nlohmann::json(c.error) : nlohmann::json("inf")},
                          {"median_ms", c.median_ms}, {"p99_ms", c.p99_ms}, {"weight_bytes", c.weight_bytes},
                          {"session_device_bytes", c.device_bytes}, {"build_ms", c.build_ms},
                          {"meets_budget", c.why.empty()}, {"outputs", nlohmann::json::array()}};
      if (!c.why.empty()) j["why"] = c.why;
      if (is_quantized(c.name)) {
        j["quantization"] = {{"calib", fs::absolute(opt.calib).string()}, {"method", opt.calib_method},
                             {"max_calib", opt.max_calib}};
      }
      if (c.engine && !samples[0].inputs.empty() && !samples[0].inputs[0].dims().empty() && c.median_ms > 0) {
        j["throughput_rows_per_s"] = double(samples[0].inputs[0].dims()[0]) * 1000.0 / c.median_ms;
      }
      for (const auto& o : c.accuracy) {
        nlohmann::json x = {{"name", o.name}, {"rel_l2", o.rel_l2}, {"cosine", o.cosine}, {"max_abs", o.max_abs}};
        if (o.top1 >= 0) x["top1_agreement"] = o.top1, x["top5_overlap"] = o.top5;
        j["outputs"].push_back(x);
      }
      if (&c == kept && c.engine) j["build_config"] = config_to_json(c.engine->config());
      report["candidates"].push_back(j);
      std::printf("%-6s %12.4g %10.4f %10.4f %12.1f %10.1f  %s\n", c.name.c_str(), c.error, c.median_ms, c.p99_ms,
                  double(c.weight_bytes) / (1 << 20), c.build_ms / 1000, &c == chosen ? "chosen" : (c.why.empty() ? "ok" : c.why.c_str()));
    }
    if (chosen) report["chosen"] = chosen->name;
    {
      std::ofstream f(vdir / "report.json");
      f << report.dump(1) << "\n";
      if (!f) return KILN_ERROR(kIo, "{}: cannot be written", (vdir / "report.json").string());
    }
    std::printf("\nmetric: %s, budget %g%%\n", metric_text.c_str(), opt.budget);
    if (!chosen) {
      std::printf("version %lld of '%s' recorded as FAILED (%s): no candidate met the budget; it is never served\n",
                  static_cast<long long>(version), opt.name.c_str(), vdir.string().c_str());
      return 1;
    }
    std::printf("version %lld of '%s' registered: %s (%s)\n", static_cast<long long>(version), opt.name.c_str(),
                chosen->name.c_str(), (vdir / "model.kiln").string().c_str());
    if (opt.promote) KILN_RETURN_IF_ERROR(promote_version(opt.repo, opt.name, version, opt.server, false));
    return 0;
  };
  auto r = go();
  if (!r) return fail(r.status());
  return *r;
}

}  // namespace kiln::cli
