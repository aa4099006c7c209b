// `kiln bench model.onnx --shapes NAME:MIN..MAX... --shapes-sweep [--sweep-points N]`: one dynamic
// engine timed at N shapes across its ranges (powers of two and the numbers between), each beside a
// static engine built for exactly that shape, in one process:
//
//   shape                      static med / p99 ms   dynamic med / p99 ms   dyn/static   first run ms
//
// "first run" is the wall time of the dynamic session's first forward at that shape: its shape plan
// made (unless the build made it), a CUDA session set up and captured, the forward run.
//
// Then every shape again in reverse order, in the same session: after other shapes ran (and shared
// its memory), each must give the outputs its first run gave, and agree with the static engine's.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <fstream>

#include "cli.h"

namespace kiln::cli {

namespace {

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// max |a - b| over max |b| over every float32 output (the others are not compared; a model's outputs
// are float32 unless it declares otherwise); infinity for a NaN or infinity in one and not the
// other, or outputs of other shapes.
double rel_diff(const std::vector<HostTensor>& a, const std::vector<HostTensor>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].shape() != b[i].shape() || a[i].dtype() != b[i].dtype()) return std::numeric_limits<double>::infinity();
    if (a[i].dtype() != DType::kFloat32) continue;
    const float *x = a[i].data<float>(), *y = b[i].data<float>();
    double scale = 1e-30, diff = 0;
    for (int64_t k = 0; k < a[i].numel(); ++k) {
      if (std::isnan(x[k]) != std::isnan(y[k])) return std::numeric_limits<double>::infinity();
      if (std::isnan(y[k])) continue;
      if (std::isinf(y[k])) {  // an infinity must be the same one, and scales nothing
        if (x[k] != y[k]) return std::numeric_limits<double>::infinity();
        continue;
      }
      scale = std::max(scale, double(std::fabs(y[k])));
      diff = std::max(diff, double(std::fabs(x[k] - y[k])));
    }
    worst = std::max(worst, scale > 1e-30 ? diff / scale : diff);
  }
  return worst;
}

// `points` assignments of the engine's symbols: symbol j's value at point i lies at fraction
// f_j(i) of its range on a log scale, f_0 = i/(points-1) and the others a different permutation of
// the same grid, so that large and small values of different symbols meet.
std::vector<std::map<std::string, int64_t>> sweep_points(const std::map<std::string, DimRange>& ranges, int points) {
  std::vector<std::map<std::string, int64_t>> out;
  for (int i = 0; i < points; ++i) {
    std::map<std::string, int64_t> a;
    int j = 0;
    for (const auto& [sym, r] : ranges) {
      const int k = j == 0 ? i : (i * (2 * j + 3) + j) % points;
      const double f = points > 1 ? double(k) / (points - 1) : 1.0;
      int64_t v = int64_t(std::llround(std::exp(std::log(double(r.min)) + f * (std::log(double(r.max)) - std::log(double(r.min))))));
      a[sym] = std::clamp(v, r.min, r.max);
      ++j;
    }
    if (std::find(out.begin(), out.end(), a) == out.end()) out.push_back(a);
  }
  return out;
}

}  // namespace

int sweep_main(const LoadOptions& load, const EngineOptions& eng, const BenchOptions& opt) {
  if (is_engine_file(load.model)) {
    return fail(KILN_ERROR(kInvalidArgument, "--shapes-sweep builds static engines to compare with: give the .onnx model"));
  }
  auto dyn = open_engine(load, eng, 0);
  if (!dyn) return fail(dyn.status());
  std::map<std::string, DimRange> ranges;  // the engine's symbols
  for (const TensorInfo& t : dyn->inputs()) {
    for (size_t k = 0; k < t.shape.size(); ++k) {
      if (t.shape[k] < 0 && t.max_shape[k] != std::numeric_limits<int64_t>::max()) {
        ranges[t.dim_names[k]] = DimRange{t.min_shape[k], t.max_shape[k], 0};
      }
    }
  }
  if (ranges.empty()) return fail(KILN_ERROR(kInvalidArgument, "--shapes-sweep needs shape ranges (--shapes NAME:MIN..MAX)"));
  const std::string built = dyn->report();
  std::printf("%s", built.substr(0, built.find("placement:")).c_str());
  std::printf("dynamic engine built in %.0f ms\n", dyn->build_ms());
  auto session = dyn->create_session();
  if (!session) return fail(session.status());
  nlohmann::json rows = nlohmann::json::array();
  std::printf("%-40s %22s %22s %10s %13s %12s %14s\n", "shape", "static med / p99 ms", "dynamic med / p99 ms",
              "dyn/static", "first run ms", "warm run ms", "first run cost");
  struct Seen {
    std::string label;
    std::vector<Tensor> inputs;
    std::vector<HostTensor> first, stat;  // the dynamic session's first outputs, the static engine's
  };
  std::vector<Seen> seen;
  for (const auto& a : sweep_points(ranges, opt.sweep_points)) {
    RunOptions ro;
    ro.random_inputs = true;
    ro.seed = opt.seed;
    std::string label;
    for (const TensorInfo& t : dyn->inputs()) {
      std::vector<int64_t> dims;
      for (size_t k = 0; k < t.shape.size(); ++k) dims.push_back(t.shape[k] >= 0 ? t.shape[k] : a.at(t.dim_names[k]));
      label += (label.empty() ? "" : " ") + t.name + ":";
      for (size_t k = 0; k < dims.size(); ++k) label += (k ? "x" : "") + std::to_string(dims[k]);
      ro.run_shapes[t.name] = dims;
    }
    auto inputs = gather_inputs(*dyn, ro, "");
    if (!inputs) return fail(inputs.status());
    auto t0 = std::chrono::steady_clock::now();
    auto first = session->run(views(*inputs));
    const double first_ms = ms_since(t0);
    if (!first) return fail(first.status());
    auto dt = session->benchmark(views(*inputs), opt.warmup, opt.iterations);
    if (!dt) return fail(dt.status());
    // The same call once the shape is warm (its host copies included): the first run's cost is
    // what it takes beyond this.
    auto t1 = std::chrono::steady_clock::now();
    auto warm = session->run(views(*inputs));
    const double warm_ms = ms_since(t1);
    if (!warm) return fail(warm.status());
    // The static engine for exactly this shape, built the way the dynamic one was.
    BuildConfig c = dyn->config();
    c.shape_ranges.clear();
    c.warm_shapes.clear();
    c.shapes = ro.run_shapes;
    auto st = build(load.model, c);
    if (!st) return fail(st.status());
    auto ss = st->create_session();
    if (!ss) return fail(ss.status());
    auto stt = ss->benchmark(views(*inputs), opt.warmup, opt.iterations);
    if (!stt) return fail(stt.status());
    auto sout = ss->run(views(*inputs));
    if (!sout) return fail(sout.status());
    seen.push_back({label, std::move(*inputs), std::move(*first), std::move(*sout)});
    const double sm = percentile(*stt, 50), sp = percentile(*stt, 99), dm = percentile(*dt, 50), dp = percentile(*dt, 99);
    std::printf("%-40s %10.4f / %9.4f %10.4f / %9.4f %10.3f %13.1f %12.1f %14.1f\n", label.c_str(), sm, sp, dm, dp,
                dm / sm, first_ms, warm_ms, first_ms - warm_ms);
    std::fflush(stdout);
    rows.push_back({{"shape", label}, {"static_median_ms", sm}, {"static_p99_ms", sp}, {"dynamic_median_ms", dm},
                    {"dynamic_p99_ms", dp}, {"ratio", dm / sm}, {"first_run_ms", first_ms}, {"warm_run_ms", warm_ms},
                    {"first_run_cost_ms", first_ms - warm_ms}});
  }
  // Back through the shapes in the same session: each after others ran in its memory.
  bool same = true;
  for (auto it = seen.rbegin(); it != seen.rend(); ++it) {
    auto again = session->run(views(it->inputs));
    if (!again) return fail(again.status());
    const double d_first = rel_diff(*again, it->first), d_static = rel_diff(*again, it->stat);
    std::printf("again %-34s vs its first run %.2e, vs the static engine %.2e\n", it->label.c_str(), d_first, d_static);
    same = same && d_first <= 1e-3;  // the same plan and inputs: bit for bit unless a kernel is not deterministic
    for (auto& r : rows) {
      if (r["shape"] == it->label) r["again_vs_first"] = d_first, r["again_vs_static"] = d_static;
    }
  }
  const std::string rep = dyn->report();
  for (const char* line : {"shape plans made so far", "grid warmed", "shape plans made while running",
                           "  lowering by op", "CUDA sessions made while running"}) {
    if (size_t at = rep.find(line); at != std::string::npos) {
      std::printf("%s\n", rep.substr(at, rep.find('\n', at) - at).c_str());
    }
  }
  if (!opt.json.empty()) {
    std::ofstream f(opt.json);
    f << nlohmann::json{{"model", load.model}, {"build_ms", dyn->build_ms()}, {"rows", rows}}.dump(2) << "\n";
    if (!f) return fail(KILN_ERROR(kIo, "{}: cannot write", opt.json));
  }
  if (!same) return fail(KILN_ERROR(kInternal, "a shape run again in the same session gave other outputs than its first run"));
  return 0;
}

}  // namespace kiln::cli
