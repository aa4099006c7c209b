// Shape ranges (BuildConfig::shape_ranges): binding them into the graph at build, recovering the
// symbols' ranges from a built graph, and checking the shapes a session is given against them.
//
//   config.shape_ranges["input_ids"] = {{1, 64}, {16, 512}};
//   KILN_ASSIGN_OR_RETURN(auto ranges, bind_shape_ranges(g, config.shape_ranges));  // "batch" -> 1..64
//   ... at run time: check_run_shapes(engine_inputs, views) names the input, the dim and the range.
#include <chrono>
#include <limits>

#include "api/engine_impl.h"
#include "frontend/onnx/importer.h"
#include "ops/infer.h"
#include "passes/derived_constants.h"
#include "passes/pipeline.h"
#include "passes/value_inputs.h"
#include "runtime/engine_file.h"

namespace kiln {

std::string describe_range(const DimRange& r) {
  std::string s = fmt::format("{}..{}", r.min, r.max);
  if (r.opt != 0 && r.opt != r.max) s += fmt::format("@{}", r.opt);
  return s;
}

Status check_dim_range(const std::string& input, size_t k, const DimRange& r) {
  if (r.min < 1 || r.max < r.min || r.opt < 0 || (r.opt != 0 && (r.opt < r.min || r.opt > r.max))) {
    return KILN_ERROR(kInvalidArgument, "shape range {} for input '{}' dimension {}: expected 1 <= min <= opt <= max",
                      describe_range(r), input, k);
  }
  if (r.max > (int64_t(1) << 40)) {
    return KILN_ERROR(kInvalidArgument, "shape range {} for input '{}' dimension {}: max is too large", describe_range(r),
                      input, k);
  }
  return Status::ok();
}

Expected<std::map<std::string, DimRange>> bind_shape_ranges(Graph& g,
                                                            const std::map<std::string, std::vector<DimRange>>& ranges) {
  std::map<std::string, DimRange> symbols;  // symbol -> its range (min == max: bound to a value)
  std::map<std::string, std::string> where;  // symbol -> the input that gave its range
  for (const auto& [name, dims] : ranges) {
    KILN_ASSIGN_OR_RETURN(Value * input, find_tensor_input(g, name, "shape_ranges"));
    Value& v = *input;
    if (v.type.shape && v.type.shape->rank() != dims.size()) {
      return KILN_ERROR(kInvalidArgument, "shape ranges give input '{}' {} dims, but the model declares {}", name,
                        dims.size(), v.type.shape->to_string());
    }
    if (!v.type.shape) v.type.shape = Shape(std::vector<Dim>(dims.size()));
    for (size_t k = 0; k < dims.size(); ++k) {
      DimRange r = dims[k];
      KILN_RETURN_IF_ERROR(check_dim_range(name, k, r));
      if (r.opt == 0) r.opt = r.max;
      Dim& d = v.type.shape->dims[k];
      if (d.is_static()) {
        if (r.min != d.value() || r.max != d.value()) {
          return KILN_ERROR(kInvalidArgument, "shape ranges give input '{}' dimension {} the range {}, but the model fixes it at {}",
                            name, k, describe_range(r), d.value());
        }
        continue;
      }
      std::string sym = d.is_symbolic() ? d.to_string() : fmt::format("{}_{}", name, k);
      if (d.is_symbolic() && !Dim::symbol(sym).same_as(d)) {
        return KILN_ERROR(kInvalidArgument, "shape ranges: input '{}' dimension {} is '{}' in the model, an expression, not a name",
                          name, k, sym);
      }
      auto [b, fresh] = symbols.emplace(sym, r);
      if (fresh) {
        where[sym] = name;
      } else if (b->second.min != r.min || b->second.max != r.max) {
        return KILN_ERROR(kInvalidArgument, "shape ranges give dim '{}' the range {} in input '{}' and {} in input '{}'", sym,
                          describe_range(r), name, describe_range(b->second), where[sym]);
      }
      d = r.min == r.max ? Dim(r.min) : Dim::symbol(sym);
    }
  }
  // Inputs not named share the symbols: fixed ones become their value.
  for (Value* v : g.inputs) {
    if (!v->type.has_rank() || ranges.count(v->name)) continue;
    for (Dim& d : v->type.shape->dims) {
      if (!d.is_symbolic()) continue;
      auto b = symbols.find(d.to_string());
      if (b != symbols.end() && b->second.min == b->second.max) d = Dim(b->second.min);
    }
  }
  for (auto it = symbols.begin(); it != symbols.end();) {
    it = it->second.min == it->second.max ? symbols.erase(it) : std::next(it);
  }
  return symbols;
}

std::map<std::string, DimRange> symbol_ranges(const Graph& g, const std::map<std::string, std::vector<DimRange>>& ranges) {
  std::map<std::string, DimRange> out;
  for (const Value* v : g.inputs) {
    auto r = ranges.find(v->name);
    if (r == ranges.end() || !v->type.has_rank() || v->type.shape->rank() != r->second.size()) continue;
    for (size_t k = 0; k < r->second.size(); ++k) {
      const Dim& d = v->type.shape->dims[k];
      if (!d.is_symbolic()) continue;
      DimRange x = r->second[k];
      if (x.opt == 0) x.opt = x.max;
      out.emplace(d.to_string(), x);
    }
  }
  return out;
}

std::vector<TensorInfo> tensor_infos(const std::vector<Value*>& values, const std::map<std::string, DimRange>& ranges) {
  std::vector<TensorInfo> out;
  for (const Value* v : values) {
    TensorInfo t;
    t.name = v ? v->name : "";
    if (v && v->type.kind == Type::Kind::kTensor) {
      t.dtype = v->type.dtype;
      if (v->type.shape) {
        for (const Dim& d : v->type.shape->dims) {
          if (d.is_static()) {
            t.shape.push_back(d.value());
            t.min_shape.push_back(d.value());
            t.max_shape.push_back(d.value());
            t.dim_names.emplace_back();
            continue;
          }
          t.shape.push_back(-1);
          std::string name = d.is_symbolic() ? d.to_string() : "";
          auto r = ranges.find(name);
          t.min_shape.push_back(r == ranges.end() ? 0 : r->second.min);
          t.max_shape.push_back(r == ranges.end() ? std::numeric_limits<int64_t>::max() : r->second.max);
          t.dim_names.push_back(name);
        }
      }
    }
    out.push_back(std::move(t));
  }
  return out;
}

Status check_run_shapes(const std::vector<TensorInfo>& infos, const std::vector<std::vector<int64_t>>& shapes) {
  if (shapes.size() != infos.size()) {
    return KILN_ERROR(kInvalidArgument, "expected {} inputs, got {}", infos.size(), shapes.size());
  }
  std::map<std::string, std::pair<int64_t, size_t>> seen;  // dim name -> value, the input that gave it
  for (size_t i = 0; i < infos.size(); ++i) {
    const TensorInfo& t = infos[i];
    const std::vector<int64_t>& s = shapes[i];
    if (t.shape.empty() && t.dim_names.empty()) continue;  // no declared shape (or rank 0, checked below)
    if (s.size() != t.shape.size()) {
      return KILN_ERROR(kInvalidArgument, "input '{}': got {} dims {}, the engine takes {} dims", t.name, s.size(),
                        dims_to_string(s), t.shape.size());
    }
    for (size_t k = 0; k < s.size(); ++k) {
      if (t.shape[k] >= 0) {
        if (s[k] != t.shape[k]) {
          return KILN_ERROR(kInvalidArgument, "input '{}': dimension {} is {}, the engine takes {} (got shape {})", t.name,
                            k, s[k], t.shape[k], dims_to_string(s));
        }
        continue;
      }
      const std::string& name = t.dim_names[k];
      if (s[k] < t.min_shape[k] || s[k] > t.max_shape[k]) {
        return KILN_ERROR(kInvalidArgument, "input '{}': dimension {} ('{}') is {}, outside the engine's range {}..{}",
                          t.name, k, name, s[k], t.min_shape[k], t.max_shape[k]);
      }
      if (name.empty()) continue;
      auto [it, fresh] = seen.emplace(name, std::make_pair(s[k], i));
      if (!fresh && it->second.first != s[k]) {
        return KILN_ERROR(kInvalidArgument, "input '{}': dimension {} ('{}') is {}, but {} in input '{}'", t.name, k,
                          name, s[k], it->second.first, infos[it->second.second].name);
      }
    }
  }
  return Status::ok();
}

Expected<std::unique_ptr<Graph>> specialize_graph(const Graph& g, const std::vector<std::vector<int64_t>>& shapes,
                                                  const BuildConfig& config,
                                                  const std::vector<std::pair<size_t, Tensor>>& values,
                                                  DerivedConstants* memo, SpecializeStats* stats, bool provenance) {
  if (shapes.size() != g.inputs.size()) {
    return KILN_ERROR(kInvalidArgument, "expected {} input shapes, got {}", g.inputs.size(), shapes.size());
  }
  SpecializeStats local;
  SpecializeStats& st = stats ? *stats : local;
  auto t = std::chrono::steady_clock::now();
  auto lap = [&t](double& into) {
    auto now = std::chrono::steady_clock::now();
    into += std::chrono::duration<double, std::milli>(now - t).count();
    t = now;
  };
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> out, clone_graph(g));
  if (memo) {  // the storage every copy shares with g (clone_graph copies only the small constants)
    for (const auto& v : g.values) {
      if (v->constant) memo->share(*v->constant);
    }
  }
  lap(st.clone_ms);
  std::map<std::string, std::vector<int64_t>> bind;
  for (size_t i = 0; i < shapes.size(); ++i) bind[out->inputs[i]->name] = shapes[i];
  KILN_RETURN_IF_ERROR(bind_input_shapes(*out, bind));
  KILN_RETURN_IF_ERROR(bind_value_inputs(*out, values));
  KILN_RETURN_IF_ERROR(infer_types(*out));
  lap(st.infer_ms);
  PassOptions po;
  po.disabled = config.disabled_passes;
  po.track_provenance = provenance;
  // Folding the shape arithmetic makes constants that inference could not see before (an Expand's
  // target from Shape -> Concat in a BERT export): infer again after the passes, and once more
  // around the pipeline if a value is still not static.
  for (int round = 0; round < 2; ++round) {
    st.rounds = round + 1;
    KILN_RETURN_IF_ERROR(run_passes(*out, default_pipeline(memo), po).status());
    lap(st.passes_ms);
    KILN_RETURN_IF_ERROR(infer_types(*out));
    lap(st.infer_ms);
    bool fixed = true;
    for (const auto& v : out->values) {
      if (!v->constant && v->type.is_tensor() && v->type.shape && !v->type.shape->is_static()) fixed = false;
    }
    if (fixed) break;
  }
  return out;
}

}  // namespace kiln
