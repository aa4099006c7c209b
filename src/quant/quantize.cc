#include "quant/quantize.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "backends/backend.h"
#include "frontend/onnx/importer.h"
#include "quant/fast_runner.h"
#include "quant/qdq_writer.h"
#include "support/mapped_file.h"

namespace kiln::quant {

namespace fs = std::filesystem;

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// A layer that may be quantized: its ONNX node, activation and weight inputs.
struct Candidate {
  const Node* node = nullptr;
  int act_slot = 0, weight_slot = 1, axis = 0;
  LayerReport report;
};

bool is_f32_tensor(const Value* v) { return v && v->type.is_tensor() && v->type.dtype == DType::kFloat32; }

// Conv, Gemm and MatMul nodes with a float activation and a constant float weight, in graph order;
// the others are listed with why not.
std::vector<Candidate> find_layers(const Graph& g) {
  std::vector<Candidate> out;
  for (const auto& up : g.nodes) {
    const Node* n = up.get();
    if (n->op != OpKind::kConv && n->op != OpKind::kGemm && n->op != OpKind::kMatMul) continue;
    Candidate c;
    c.node = n;
    c.report.node = n->describe();
    const Value* a = n->has_input(0) ? n->inputs[0] : nullptr;
    const Value* w = n->has_input(1) ? n->inputs[1] : nullptr;
    if (a) c.report.activation = a->name;
    if (w) c.report.weight = w->name;
    auto reject = [&](std::string why) {
      c.report.why_not = std::move(why);
      out.push_back(c);
    };
    if (n->index < 0) { reject("made by the importer, not an ONNX node"); continue; }
    if (!is_f32_tensor(a) || a->constant) { reject("its first input is not a float32 activation"); continue; }
    if (!is_f32_tensor(w) || !w->constant) {
      reject(n->op == OpKind::kMatMul ? "both operands are activations (activation products stay in float)"
                                      : "its weight is not a float32 constant");
      continue;
    }
    const int64_t rank = int64_t(w->constant->rank());
    if (n->op == OpKind::kConv) {
      if (rank < 3) { reject("weight of rank < 3"); continue; }
      c.axis = 0;
    } else if (n->op == OpKind::kGemm) {
      if (n->attr_int("transA", 0) != 0) { reject("its activation is transposed (transA)"); continue; }
      if (rank != 2) { reject("its weight is not a matrix"); continue; }
      c.axis = n->attr_int("transB", 0) ? 0 : 1;
    } else {
      if (rank < 2) { reject("a vector weight"); continue; }
      c.axis = int(rank - 1);
    }
    c.report.quantized = true;
    out.push_back(c);
  }
  return out;
}

class Quantizer {
 public:
  Quantizer(const QuantizeOptions& opt, std::string bytes, std::string dir)
      : opt_(opt), bytes_(std::move(bytes)), dir_(std::move(dir)) {}

  Status run(QuantizeReport& rep) {
    KILN_ASSIGN_OR_RETURN(model_, import_onnx_bytes(bytes_.data(), bytes_.size(), dir_));
    Graph& g = *model_.graph;
    KILN_ASSIGN_OR_RETURN(auto calib, load_samples(g, opt_.calib_dir, opt_.max_calib));
    KILN_RETURN_IF_ERROR(check_not_constant(g, calib, opt_.calib_dir));
    rep.calib_samples = calib.size();
    layers_ = find_layers(g);
    choose(layers_);

    // Calibration: the model runs with every observed activation added to its outputs.
    const size_t n_out = g.outputs.size();
    std::vector<const Value*> observed;
    for (const Candidate& c : layers_) {
      const Value* a = c.node->inputs[size_t(c.act_slot)];
      if (c.report.quantized && std::find(observed.begin(), observed.end(), a) == observed.end()) observed.push_back(a);
    }
    std::vector<size_t> observed_at;  // each observed value's position among the outputs
    for (const Value* v : observed) {
      auto it = std::find(g.outputs.begin(), g.outputs.end(), v);
      observed_at.push_back(size_t(it - g.outputs.begin()));
      if (it == g.outputs.end()) g.outputs.push_back(const_cast<Value*>(v));
    }
    auto t0 = std::chrono::steady_clock::now();
    KILN_ASSIGN_OR_RETURN(auto exe, compile_fast_cpu(g));
    std::vector<Observer> obs(observed.size());
    std::vector<std::vector<Tensor>> calib_ref;  // fp32 outputs, reused when evaluating on the calibration set
    for (const Sample& s : calib) {
      KILN_ASSIGN_OR_RETURN(auto outs, exe->run(data_of(s)));
      for (size_t k = 0; k < observed.size(); ++k) obs[k].add(outs[observed_at[k]].tensor);
      std::vector<Tensor> ref;
      for (size_t i = 0; i < n_out; ++i) ref.push_back(std::move(outs[i].tensor));
      calib_ref.push_back(std::move(ref));
    }
    rep.calib_ms = ms_since(t0);
    for (size_t k = 0; k < observed.size(); ++k) {
      if (obs[k].nonfinite()) {
        return KILN_ERROR(kInvalidArgument, "{}: activation '{}' was not finite on {} value(s) of the calibration samples",
                          opt_.calib_dir, observed[k]->name, obs[k].nonfinite());
      }
      amax_[observed[k]->name] = {obs[k].range(opt_.method, opt_.percentile, opt_.type), obs[k].amax()};
    }
    for (Candidate& c : layers_) {
      if (!c.report.quantized) continue;
      auto [range, seen] = amax_.at(c.node->inputs[size_t(c.act_slot)]->name);
      c.report.act_amax = range;
      c.report.act_max = seen;
      if (!(range > 0)) {
        c.report.quantized = false;
        c.report.why_not = "its activation was zero on every calibration sample";
      }
    }
    g.outputs.resize(n_out);

    // Evaluation: the fp32 model's outputs (from calibration when the sets are the same).
    auto t1 = std::chrono::steady_clock::now();
    if (opt_.eval_dir.empty()) {
      eval_ = std::move(calib);
      ref_ = std::move(calib_ref);
      rep.eval_dir = opt_.calib_dir + " (the calibration samples: give --eval for a disjoint set)";
    } else {
      KILN_ASSIGN_OR_RETURN(eval_, load_samples(g, opt_.eval_dir, opt_.max_eval));
      rep.eval_dir = opt_.eval_dir;
      KILN_ASSIGN_OR_RETURN(auto fp32, compile_fast_cpu(g));
      for (const Sample& s : eval_) {
        KILN_ASSIGN_OR_RETURN(auto outs, fp32->run(data_of(s)));
        std::vector<Tensor> ref;
        for (auto& d : outs) ref.push_back(std::move(d.tensor));
        ref_.push_back(std::move(ref));
      }
    }
    rep.eval_samples = eval_.size();

    std::vector<size_t> quantized;
    for (size_t i = 0; i < layers_.size(); ++i) {
      if (layers_[i].report.quantized) quantized.push_back(i);
    }
    if (quantized.empty()) return KILN_ERROR(kUnsupported, "no Conv, Gemm or MatMul layer of this model can be quantized");
    if (opt_.sensitivity || opt_.accuracy_budget > 0) {
      for (size_t i : quantized) {
        KILN_ASSIGN_OR_RETURN(auto acc, evaluate({i}));
        layers_[i].report.sensitivity = error_of(opt_.metric, acc);
      }
    }
    KILN_ASSIGN_OR_RETURN(rep.outputs, evaluate(quantized));
    rep.error = error_of(opt_.metric, rep.outputs);
    if (opt_.accuracy_budget > 0 && rep.error > opt_.accuracy_budget) KILN_RETURN_IF_ERROR(fit_budget(quantized, rep));
    rep.eval_ms = ms_since(t1);
    rep.metric = metric_name(resolve(opt_.metric, rep.outputs));
    for (const Candidate& c : layers_) rep.layers.push_back(c.report);
    KILN_ASSIGN_OR_RETURN(written_, write(quantized));
    return Status::ok();
  }

  const std::string& written() const { return written_; }

 private:
  static std::vector<Data> data_of(const Sample& s) {
    std::vector<Data> d;
    for (const Tensor& t : s.inputs) d.emplace_back(t);
    return d;
  }

  // Keeps in float what the options say to: the first convolution and the classifier (unless
  // quantize_sensitive), and layers named in keep.
  void choose(std::vector<Candidate>& layers) {
    Candidate* first_conv = nullptr;
    Candidate* last_gemm = nullptr;
    for (Candidate& c : layers) {
      if (!c.report.quantized) continue;
      if (c.node->op == OpKind::kConv && !first_conv) first_conv = &c;
      if (c.node->op != OpKind::kConv) last_gemm = &c;
    }
    // The classifier is the last GEMM only when no convolution or GEMM comes after it.
    if (last_gemm && &layers.back() != last_gemm) {
      bool after = false;
      for (Candidate* c = last_gemm + 1; c <= &layers.back(); ++c) after = after || c->report.quantized;
      if (after) last_gemm = nullptr;
    }
    if (!opt_.quantize_sensitive) {
      if (first_conv) keep(*first_conv, "the first convolution (kept in float; --quantize-sensitive quantizes it)");
      if (last_gemm) keep(*last_gemm, "the classifier, the last GEMM before an output (kept in float; "
                                      "--quantize-sensitive quantizes it)");
    }
    for (Candidate& c : layers) {
      for (const std::string& k : opt_.keep) {
        if (c.report.quantized && (c.node->name == k || (c.node->has_output(0) && c.node->outputs[0]->name == k))) {
          keep(c, "named by --keep");
        }
      }
    }
  }
  static void keep(Candidate& c, std::string why) {
    c.report.quantized = false;
    c.report.why_not = std::move(why);
  }

  Expected<std::string> write(const std::vector<size_t>& which) const {
    QdqPlan plan;
    plan.type = opt_.type;
    for (size_t i : which) {
      const Candidate& c = layers_[i];
      const std::string& a = c.node->inputs[size_t(c.act_slot)]->name;
      const std::string& w = c.node->inputs[size_t(c.weight_slot)]->name;
      plan.inputs.push_back({c.node->index, c.act_slot, false});
      plan.inputs.push_back({c.node->index, c.weight_slot, true});
      plan.act_amax[a] = amax_.at(a).first;
      plan.weight_axis[w] = c.axis;
    }
    return write_qdq_model(bytes_, *model_.graph, plan);
  }

  // The accuracy of the model with the layers `which` quantized, on the evaluation samples.
  Expected<std::vector<OutputAccuracy>> evaluate(const std::vector<size_t>& which) const {
    KILN_ASSIGN_OR_RETURN(std::string q, write(which));
    KILN_ASSIGN_OR_RETURN(Model qm, import_onnx_bytes(q.data(), q.size(), dir_));
    KILN_ASSIGN_OR_RETURN(auto exe, compile_fast_cpu(*qm.graph));
    std::vector<Metrics> m(model_.graph->outputs.size());
    for (size_t s = 0; s < eval_.size(); ++s) {
      KILN_ASSIGN_OR_RETURN(auto outs, exe->run(data_of(eval_[s])));
      for (size_t i = 0; i < m.size(); ++i) accumulate(m[i], ref_[s][i], outs[i].tensor);
    }
    std::vector<OutputAccuracy> acc;
    for (size_t i = 0; i < m.size(); ++i) {
      m[i].acc.name = model_.graph->outputs[i]->name;
      acc.push_back(finish(m[i]));
    }
    return acc;
  }

  // Keeps the most sensitive layers in float, fewest first: k = 1, 2, 4, ... until the budget is
  // met, then the smallest k between the last two that meets it.
  Status fit_budget(std::vector<size_t>& quantized, QuantizeReport& rep) {
    std::vector<size_t> order = quantized;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return layers_[a].report.sensitivity > layers_[b].report.sensitivity;
    });
    auto without = [&](size_t k) {
      std::vector<size_t> q;
      for (size_t i : quantized) {
        if (std::find(order.begin(), order.begin() + long(k), i) == order.begin() + long(k)) q.push_back(i);
      }
      return q;
    };
    std::map<size_t, std::vector<OutputAccuracy>> tried;
    auto meets = [&](size_t k) -> Expected<bool> {
      if (k >= order.size()) return true;
      if (!tried.count(k)) { KILN_ASSIGN_OR_RETURN(tried[k], evaluate(without(k))); }
      return error_of(opt_.metric, tried[k]) <= opt_.accuracy_budget;
    };
    size_t lo = 0, hi = 1;
    for (;;) {
      KILN_ASSIGN_OR_RETURN(bool ok, meets(hi));
      if (ok) break;
      lo = hi;
      hi = std::min(order.size(), hi * 2);
    }
    while (hi - lo > 1) {
      size_t mid = (lo + hi) / 2;
      KILN_ASSIGN_OR_RETURN(bool ok, meets(mid));
      (ok ? hi : lo) = mid;
    }
    for (size_t k = 0; k < hi && k < order.size(); ++k) {
      Candidate& c = layers_[order[k]];
      keep(c, fmt::format("kept by the accuracy budget (sensitivity {:.3g})", c.report.sensitivity));
      rep.budget_kept.push_back(c.report.node);
    }
    quantized = without(hi);
    if (quantized.empty()) {
      return KILN_ERROR(kInvalidArgument, "no layer can be quantized within an accuracy budget of {}% (every layer kept "
                        "in float)", opt_.accuracy_budget);
    }
    if (!tried.count(hi)) { KILN_ASSIGN_OR_RETURN(tried[hi], evaluate(quantized)); }
    rep.outputs = tried[hi];
    rep.error = error_of(opt_.metric, rep.outputs);
    return Status::ok();
  }

  const QuantizeOptions& opt_;
  std::string bytes_, dir_;
  Model model_;
  std::vector<Candidate> layers_;
  std::map<std::string, std::pair<double, double>> amax_;  // activation -> (range, largest |x|)
  std::vector<Sample> eval_;
  std::vector<std::vector<Tensor>> ref_;
  std::string written_;
};

}  // namespace

Expected<QuantizeReport> quantize_model(const std::string& model_path, const std::string& out_path,
                                        const QuantizeOptions& opt) {
  if (opt.calib_dir.empty()) return KILN_ERROR(kInvalidArgument, "quantize: a calibration folder is required (--calib DIR)");
  if (opt.method == CalibMethod::kEntropy && opt.type != QuantType::kInt8) {
    return KILN_ERROR(kInvalidArgument, "quantize: the entropy method applies to int8; fp8 takes minmax or percentile");
  }
  if (opt.method == CalibMethod::kPercentile && !(opt.percentile > 50 && opt.percentile <= 100)) {
    return KILN_ERROR(kInvalidArgument, "quantize: percentile {} is outside (50, 100]", opt.percentile);
  }
  if (opt.accuracy_budget < 0) return KILN_ERROR(kInvalidArgument, "quantize: the accuracy budget must be positive");
  KILN_ASSIGN_OR_RETURN(auto mapped, map_file(model_path));
  std::string bytes(mapped->view());
  QuantizeReport rep;
  rep.model = model_path;
  rep.output = out_path;
  rep.calib_dir = opt.calib_dir;
  rep.type = opt.type;
  rep.method = opt.method;
  rep.bytes_in = bytes.size();
  fs::path dir = fs::path(model_path).parent_path();
  Quantizer q(opt, std::move(bytes), dir.empty() ? "." : dir.string());
  if (Status s = q.run(rep); !s) return s.with_context(model_path);
  rep.bytes_out = q.written().size();
  KILN_RETURN_IF_ERROR(write_file_atomic(out_path, q.written()));
  return rep;
}

std::string QuantizeReport::to_text() const {
  int n = 0, kept = 0;
  for (const LayerReport& l : layers) (l.quantized ? n : kept) += 1;
  std::string out = fmt::format("quantized {} -> {} ({}, {} calibration, {} sample(s)): {} layer(s) {}, {} kept in float\n",
                                model, output, quant_type_name(type), calib_method_name(method), calib_samples, n,
                                quant_type_name(type), kept);
  out += fmt::format("file: {:.2f} MiB -> {:.2f} MiB\n", double(bytes_in) / (1 << 20), double(bytes_out) / (1 << 20));
  out += fmt::format("accuracy against fp32 on {} sample(s) of {}:\n", eval_samples, eval_dir);
  for (const OutputAccuracy& o : outputs) {
    out += fmt::format("  {}: rel-L2 {:.4g}, cosine {:.6f} (rows: mean {:.6f}, least {:.6f}), max |diff| {:.4g}", o.name,
                       o.rel_l2, o.cosine, o.row_cosine_mean, o.row_cosine_min, o.max_abs);
    if (o.top1 >= 0) out += fmt::format(", top-1 agreement {:.2f}%, top-5 overlap {:.2f}%", o.top1, o.top5);
    out += "\n";
  }
  if (!budget_kept.empty()) {
    out += fmt::format("accuracy budget: {} layer(s) kept in float, {} {:.4g}\n", budget_kept.size(), metric, error);
  }
  out += "layers:\n";
  for (const LayerReport& l : layers) {
    out += fmt::format("  {:<5} {}", l.quantized ? quant_type_name(type) : "float", l.node);
    if (l.quantized) out += fmt::format("  amax {:.4g} (largest {:.4g})", l.act_amax, l.act_max);
    if (l.sensitivity >= 0) out += fmt::format("  sensitivity {:.4g}", l.sensitivity);
    if (!l.why_not.empty()) out += "  - " + l.why_not;
    out += "\n";
  }
  return out;
}

std::string QuantizeReport::to_json() const {
  nlohmann::json j = {{"model", model},           {"output", output},
                      {"precision", quant_type_name(type)}, {"method", calib_method_name(method)},
                      {"calibration", {{"folder", calib_dir}, {"samples", calib_samples}, {"ms", calib_ms}}},
                      {"evaluation", {{"folder", eval_dir}, {"samples", eval_samples}, {"ms", eval_ms}}},
                      {"bytes", {{"in", bytes_in}, {"out", bytes_out}}},
                      {"metric", metric},         {"error", error},
                      {"budget_kept", budget_kept}};
  for (const OutputAccuracy& o : outputs) {
    nlohmann::json x = {{"name", o.name},         {"rel_l2", o.rel_l2},
                         {"cosine", o.cosine},     {"row_cosine_mean", o.row_cosine_mean},
                         {"row_cosine_min", o.row_cosine_min}, {"max_abs", o.max_abs}};
    if (o.top1 >= 0) { x["top1_agreement"] = o.top1; x["top5_overlap"] = o.top5; }
    j["outputs"].push_back(x);
  }
  for (const LayerReport& l : layers) {
    nlohmann::json x = {{"node", l.node}, {"activation", l.activation}, {"weight", l.weight}, {"quantized", l.quantized}};
    if (l.quantized) { x["amax"] = l.act_amax; x["largest"] = l.act_max; }
    if (l.sensitivity >= 0) x["sensitivity"] = l.sensitivity;
    if (!l.why_not.empty()) x["why_float"] = l.why_not;
    j["layers"].push_back(x);
  }
  return j.dump(1);
}

}  // namespace kiln::quant
