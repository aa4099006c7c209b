// `kiln bench --profile [--trace FILE] [--plot FILE.svg] [--peak-tflops T] [--peak-gbs B]`: the
// forward step by step (Session::profile: each step's median of five), each step's time with its
// node's estimated work (runtime/node_cost.h), then the nodes by time with their achieved TFLOP/s
// and GB/s against the device's peaks, whether each is compute- or memory-bound and how close to
// its roofline it runs; a Chrome/Perfetto trace laying those step times end to end, and the
// roofline drawn as SVG.
//
// The peaks default to the GPU's datasheet (runtime/device_peaks.h: dense fp16/bf16, tf32 or fp32
// TFLOP/s by the engine's precision, and memory GB/s; the H100 SXM: 989, 495, 67 and 3350);
// --peak-tflops and --peak-gbs give measured ones, and on the CPU or a GPU not in the table they are
// the only peaks (without them the bound and roofline columns show "-").
#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "runtime/device_peaks.h"

namespace kiln::cli {

using nlohmann::json;

namespace {

struct NodeRow {
  std::string node, op;
  double ms = 0, flops = 0, bytes = 0;
  int steps = 0;
};

// A node's place on the roofline: achieved rates, the bound, the floor time and the share of it.
struct Roof {
  double tflops = 0, gbs = 0, intensity = 0, floor_ms = 0;
  bool compute_bound = false;
};

Roof roof(const NodeRow& r, const ProfilePeaks& p) {
  Roof f;
  const double s = r.ms / 1e3;
  if (s > 0) {
    f.tflops = r.flops / s / 1e12;
    f.gbs = r.bytes / s / 1e9;
  }
  f.intensity = r.bytes > 0 ? r.flops / r.bytes : 0;
  if (p.tflops <= 0 || p.gbs <= 0) return f;  // no peaks: no floor
  const double tc = r.flops / (p.tflops * 1e12), tm = r.bytes / (p.gbs * 1e9);
  f.compute_bound = tc > tm;
  f.floor_ms = std::max(tc, tm) * 1e3;
  return f;
}

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

// A log-log roofline: TFLOP/s against FLOP/byte, the peak's roof and the bandwidth's slope, one
// circle per node (area by its share of the time, its name in the tooltip).
std::string roofline_svg(const std::vector<NodeRow>& rows, const ProfilePeaks& p, double total_ms) {
  const double W = 900, H = 600, L = 80, R = 30, T = 40, B = 60;
  const double x0 = -2, x1 = 4;                                   // log10 FLOP/byte
  const double y1 = std::ceil(std::log10(p.tflops)) + 0.3, y0 = y1 - 6;  // log10 TFLOP/s
  auto X = [&](double i) { return L + (std::log10(i) - x0) / (x1 - x0) * (W - L - R); };
  auto Y = [&](double t) { return H - B - (std::log10(t) - y0) / (y1 - y0) * (H - T - B); };
  std::string s = fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
                              "font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n", W, H);
  s += fmt::format("<text x=\"{}\" y=\"24\" font-size=\"15\">kiln roofline: {:.0f} TFLOP/s, {:.0f} GB/s</text>\n", L,
                   p.tflops, p.gbs);
  for (int e = int(x0); e <= int(x1); ++e) {
    const double x = X(std::pow(10.0, e));
    s += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#ddd\"/><text x=\"{0:.1f}\" y=\"{3}\" "
                     "text-anchor=\"middle\">1e{4}</text>\n", x, T, H - B, H - B + 18, e);
  }
  for (int e = int(std::ceil(y0)); e <= int(y1); ++e) {
    const double y = Y(std::pow(10.0, e));
    s += fmt::format("<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#ddd\"/><text x=\"{3}\" y=\"{4:.1f}\" "
                     "text-anchor=\"end\">1e{5}</text>\n", L, y, W - R, L - 6, y + 4, e);
  }
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">arithmetic intensity (FLOP/byte)</text>\n", (L + W - R) / 2, H - 18);
  s += fmt::format("<text x=\"20\" y=\"{}\" transform=\"rotate(-90 20 {})\" text-anchor=\"middle\">TFLOP/s</text>\n", (T + H - B) / 2,
                   (T + H - B) / 2);
  // The roof: bandwidth-bound below the ridge, compute-bound above it.
  std::string path;
  for (int k = 0; k <= 120; ++k) {
    const double i = std::pow(10.0, x0 + (x1 - x0) * k / 120.0);
    const double t = std::min(p.tflops, i * p.gbs / 1e3);
    if (std::log10(t) < y0) continue;
    path += fmt::format("{}{:.1f},{:.1f} ", path.empty() ? "M" : "L", X(i), Y(t));
  }
  s += fmt::format("<path d=\"{}\" fill=\"none\" stroke=\"#c00\" stroke-width=\"2\"/>\n", path);
  for (const NodeRow& r : rows) {
    const Roof f = roof(r, p);
    if (f.intensity <= 0 || f.tflops <= 0) continue;
    const double cx = X(std::clamp(f.intensity, std::pow(10.0, x0), std::pow(10.0, x1)));
    const double cy = Y(std::clamp(f.tflops, std::pow(10.0, y0), std::pow(10.0, y1)));
    const double rad = 3 + 25 * std::sqrt(total_ms > 0 ? r.ms / total_ms : 0);
    s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{:.1f}\" fill=\"{}\" fill-opacity=\"0.5\"><title>{} {:.4f} ms, "
                     "{:.2f} TFLOP/s, {:.0f} GB/s</title></circle>\n", cx, cy, rad, f.compute_bound ? "#1f77b4" : "#ff7f0e",
                     xml_escape(r.node), r.ms, f.tflops, f.gbs);
  }
  return s + "</svg>\n";
}

}  // namespace

ProfilePeaks default_peaks(Precision p, bool gpu, std::string_view gpu_name) {
  ProfilePeaks k;
  if (!gpu) return k;  // no datasheet for whatever CPU this is: the flags give its peaks
  std::optional<DevicePeaks> d = datasheet_peaks(gpu_name);
  if (!d) {
    k.source = fmt::format("no datasheet for GPU '{}'", gpu_name);
    return k;
  }
  k.tflops = p == Precision::kFp16 || p == Precision::kBf16 ? d->f16_tflops
             : p == Precision::kTf32                         ? d->tf32_tflops
                                                             : d->f32_tflops;
  k.gbs = d->gbs;
  k.source = fmt::format("{} datasheet", d->model);
  return k;
}

Status print_profile(const std::vector<StepTime>& steps, const ProfilePeaks& peaks, const ProfileOutputs& out, json* j) {
  if (steps.empty()) {
    std::printf("profile: this engine has no step-by-step profile (the CPU backend's)\n");
    if (!out.trace.empty() || !out.plot.empty()) return KILN_ERROR(kInvalidArgument, "--trace and --plot need a GPU engine");
    return Status::ok();
  }
  double total = 0;
  for (const StepTime& st : steps) total += st.ms;
  const bool roofline = peaks.tflops > 0 && peaks.gbs > 0;
  if (!out.plot.empty() && !roofline) {
    return KILN_ERROR(kInvalidArgument, "--plot draws against the device's peaks: give --peak-tflops and --peak-gbs for this CPU");
  }
  if (roofline) {
    std::printf("profile: %zu steps, %.4f ms step by step (no graph); peaks %.1f TFLOP/s, %.0f GB/s%s\n", steps.size(), total,
                peaks.tflops, peaks.gbs,
                peaks.from_flags ? " (given)" : (" (" + peaks.source + "; --peak-tflops/--peak-gbs to change)").c_str());
  } else {
    std::printf("profile: %zu steps, %.4f ms step by step; no peaks for this device%s (--peak-tflops and --peak-gbs give "
                "the bound and roofline columns)\n", steps.size(), total,
                peaks.source.empty() ? "" : (": " + peaks.source).c_str());
  }
  // "-" where the bound or the roofline share needs peaks not given (or a node with no work).
  auto bound = [&](const Roof& f, bool work) -> std::string {
    return !work || !roofline ? "-" : f.compute_bound ? "compute" : "memory";
  };
  auto share = [&](const Roof& f, double ms) -> std::string {
    return roofline && ms > 0 ? fmt::format("{:.1f}%", 100 * f.floor_ms / ms) : "-";
  };
  std::vector<const StepTime*> sorted;
  for (const StepTime& st : steps) sorted.push_back(&st);
  std::stable_sort(sorted.begin(), sorted.end(), [](const StepTime* a, const StepTime* b) { return a->ms > b->ms; });
  std::printf("slowest steps:\n");
  for (size_t i = 0; i < sorted.size() && i < 15; ++i) std::printf("  %8.4f ms  %s\n", sorted[i]->ms, sorted[i]->step.c_str());
  // By node: its steps' time, its work once.
  std::map<std::string, NodeRow> by_node;
  std::vector<std::string> order;
  for (const StepTime& st : steps) {
    const std::string key = st.node.empty() ? "(no node) " + st.step : st.node;
    auto [it, fresh] = by_node.try_emplace(key);
    if (fresh) order.push_back(key);
    NodeRow& r = it->second;
    r.node = key;
    r.op = st.op.empty() ? "-" : st.op;
    r.ms += st.ms;
    r.flops += st.flops;
    r.bytes += st.bytes;
    r.steps += 1;
  }
  std::vector<NodeRow> rows;
  for (const std::string& k : order) rows.push_back(by_node[k]);
  std::vector<NodeRow> top = rows;
  std::stable_sort(top.begin(), top.end(), [](const NodeRow& a, const NodeRow& b) { return a.ms > b.ms; });
  double flops = 0, bytes = 0;
  for (const NodeRow& r : rows) {
    flops += r.flops;
    bytes += r.bytes;
  }
  std::printf("by ONNX node (top %zu of %zu): ms, share, GFLOP, MB, TFLOP/s, GB/s, FLOP/B, bound, roofline share\n",
              std::min<size_t>(top.size(), out.top), top.size());
  for (size_t i = 0; i < top.size() && i < out.top; ++i) {
    const NodeRow& r = top[i];
    const Roof f = roof(r, peaks);
    const bool work = r.flops > 0 || r.bytes > 0;
    std::printf("  %8.4f %5.1f%% %9.3f %8.2f %8.2f %7.0f %7.1f %-7s %6s  %s\n", r.ms, total > 0 ? 100 * r.ms / total : 0.0,
                r.flops / 1e9, r.bytes / 1e6, f.tflops, f.gbs, f.intensity, bound(f, work).c_str(), share(f, r.ms).c_str(),
                r.node.c_str());
  }
  std::map<std::string, NodeRow> by_op;
  for (const NodeRow& r : rows) {
    NodeRow& o = by_op[r.op];
    o.node = o.op = r.op;
    o.ms += r.ms;
    o.flops += r.flops;
    o.bytes += r.bytes;
    o.steps += 1;
  }
  std::vector<NodeRow> ops;
  for (auto& [k, v] : by_op) ops.push_back(v);
  std::stable_sort(ops.begin(), ops.end(), [](const NodeRow& a, const NodeRow& b) { return a.ms > b.ms; });
  std::printf("by op type: ms, share, nodes, TFLOP/s, GB/s, roofline share\n");
  for (const NodeRow& o : ops) {
    const Roof f = roof(o, peaks);
    std::printf("  %8.4f %5.1f%% %5d %8.2f %7.0f %6s  %s\n", o.ms, total > 0 ? 100 * o.ms / total : 0.0, o.steps, f.tflops,
                f.gbs, share(f, o.ms).c_str(), o.op.c_str());
  }
  NodeRow all;
  all.ms = total;
  all.flops = flops;
  all.bytes = bytes;
  const Roof f = roof(all, peaks);
  if (roofline) {
    std::printf("whole forward: %.3f GFLOP, %.2f MB crossing kernel edges (an estimate of the traffic), floor %.4f ms "
                "(max of FLOPs / peak and bytes / bandwidth), %.1f%% of it step by step\n",
                flops / 1e9, bytes / 1e6, f.floor_ms, total > 0 ? 100 * f.floor_ms / total : 0.0);
  } else {
    std::printf("whole forward: %.3f GFLOP, %.2f MB crossing kernel edges (an estimate of the traffic), %.1f GFLOP/s step "
                "by step\n", flops / 1e9, bytes / 1e6, total > 0 ? flops / 1e6 / total : 0.0);
  }
  if (j) {
    (*j)["profile"] = json::array();
    for (const StepTime& st : steps) {
      (*j)["profile"].push_back({{"step", st.step}, {"ms", st.ms}, {"node", st.node}, {"op", st.op}, {"flops", st.flops},
                                 {"bytes", st.bytes}});
    }
    (*j)["peaks"] = {{"tflops", peaks.tflops}, {"gbs", peaks.gbs}};
  }
  if (!out.trace.empty()) {  // Chrome's trace event format: one complete event per step, end to end
    json t;
    t["displayTimeUnit"] = "ms";
    t["traceEvents"] = json::array();
    double at = 0;
    for (const StepTime& st : steps) {
      t["traceEvents"].push_back({{"name", st.node.empty() ? st.step : st.node}, {"cat", st.op.empty() ? "-" : st.op},
                                  {"ph", "X"}, {"ts", at * 1e3}, {"dur", st.ms * 1e3}, {"pid", 0}, {"tid", 0},
                                  {"args", {{"step", st.step}, {"flops", st.flops}, {"bytes", st.bytes}}}});
      at += st.ms;
    }
    std::ofstream f(out.trace);
    f << t.dump() << "\n";
    if (!f) return KILN_ERROR(kIo, "{}: cannot write the trace", out.trace);
    std::printf("trace: %s (chrome://tracing or ui.perfetto.dev)\n", out.trace.c_str());
  }
  if (!out.plot.empty()) {
    std::ofstream f(out.plot);
    f << roofline_svg(rows, peaks, total);
    if (!f) return KILN_ERROR(kIo, "{}: cannot write the plot", out.plot);
    std::printf("roofline: %s\n", out.plot.c_str());
  }
  return Status::ok();
}

}  // namespace kiln::cli
