#include "quant/qdq_writer.h"

#include <cmath>
#include <cstring>
#include <set>

#include "frontend/onnx/onnx_tensor.h"
#include "support/float_types.h"

namespace kiln::quant {

namespace {

const std::set<std::string> kReduceAxesAt18 = {"ReduceL1",  "ReduceL2",  "ReduceLogSum", "ReduceLogSumExp", "ReduceMax",
                                               "ReduceMean", "ReduceMin", "ReduceProd",   "ReduceSumSquare"};

bool default_domain(const std::string& d) { return d.empty() || d == "ai.onnx"; }

// Every tensor and node name in g and its subgraphs, so new names never collide.
void collect_names(const onnx::GraphProto& g, std::set<std::string>& names) {
  for (const auto& t : g.initializer()) names.insert(t.name());
  for (const auto& v : g.input()) names.insert(v.name());
  for (const auto& v : g.output()) names.insert(v.name());
  for (const auto& n : g.node()) {
    names.insert(n.name());
    for (const auto& o : n.output()) names.insert(o);
    for (const auto& a : n.attribute()) {
      if (a.has_g()) collect_names(a.g(), names);
      for (const auto& sg : a.graphs()) collect_names(sg, names);
    }
  }
}

// Names read by g's nodes, its subgraphs included (a subgraph may read an outer initializer).
void collect_reads(const onnx::GraphProto& g, std::multiset<std::string>& reads) {
  for (const auto& n : g.node()) {
    for (const auto& i : n.input()) reads.insert(i);
    for (const auto& a : n.attribute()) {
      if (a.has_g()) collect_reads(a.g(), reads);
      for (const auto& sg : a.graphs()) collect_reads(sg, reads);
    }
  }
}

// Opset 13..17 -> 18+: the Reduce* ops other than ReduceSum take `axes` as an input; opset < 16
// RoiAlign defaulted to output_half_pixel coordinates. Applied to g and its subgraphs.
void upgrade_graph(onnx::GraphProto& g, int64_t from, std::set<std::string>& names) {
  auto fresh = [&](const std::string& base) {
    std::string n = base;
    for (int k = 1; names.count(n); ++k) n = base + "_" + std::to_string(k);
    names.insert(n);
    return n;
  };
  for (auto& n : *g.mutable_node()) {
    for (auto& a : *n.mutable_attribute()) {
      if (a.has_g()) upgrade_graph(*a.mutable_g(), from, names);
      for (auto& sg : *a.mutable_graphs()) upgrade_graph(sg, from, names);
    }
    if (!default_domain(n.domain())) continue;
    if (from < 18 && kReduceAxesAt18.count(n.op_type())) {
      auto* attrs = n.mutable_attribute();
      for (int i = 0; i < attrs->size(); ++i) {
        if (attrs->Get(i).name() != "axes") continue;
        onnx::TensorProto* t = g.add_initializer();
        t->set_name(fresh(n.output(0) + "_axes"));
        t->set_data_type(onnx::TensorProto::INT64);
        t->add_dims(attrs->Get(i).ints_size());
        for (int64_t x : attrs->Get(i).ints()) t->add_int64_data(x);
        if (n.input_size() < 2) n.add_input(t->name());
        attrs->DeleteSubrange(i, 1);
        break;
      }
    }
    if (from < 16 && n.op_type() == "RoiAlign") {
      bool has = false;
      for (const auto& a : n.attribute()) has = has || a.name() == "coordinate_transformation_mode";
      if (!has) {
        auto* a = n.add_attribute();
        a->set_name("coordinate_transformation_mode");
        a->set_type(onnx::AttributeProto::STRING);
        a->set_s("output_half_pixel");
      }
    }
  }
}

onnx::TensorProto::DataType q_dtype(QuantType t) {
  return t == QuantType::kInt8 ? onnx::TensorProto::INT8 : onnx::TensorProto::FLOAT8E4M3FN;
}

uint8_t quantize_value(double x, double scale, QuantType t) {
  double q = x / scale;
  if (t == QuantType::kInt8) return uint8_t(int8_t(std::clamp(std::nearbyint(q), -127.0, 127.0)));
  return float_to_f8(float(q), F8Format::kE4M3FN, /*saturate=*/true);
}

}  // namespace

QuantizedWeight quantize_weight(const Tensor& w, int axis, QuantType type) {
  const int64_t channels = w.dim(size_t(axis));
  int64_t inner = 1;
  for (size_t i = size_t(axis) + 1; i < w.rank(); ++i) inner *= w.dim(i);
  QuantizedWeight q;
  std::vector<double> amax(size_t(channels), 0.0);
  for (int64_t i = 0; i < w.numel(); ++i) {
    size_t c = size_t((i / inner) % channels);
    amax[c] = std::max(amax[c], std::fabs(w.as_double(i)));
  }
  for (double a : amax) q.scales.push_back(a > 0 ? float(a / quant_type_max(type)) : 1.0f);
  q.bytes.resize(size_t(w.numel()));
  for (int64_t i = 0; i < w.numel(); ++i) {
    q.bytes[size_t(i)] = char(quantize_value(w.as_double(i), q.scales[size_t((i / inner) % channels)], type));
  }
  return q;
}

Expected<std::string> write_qdq_model(const std::string& onnx_bytes, const Graph& g, const QdqPlan& plan) {
  onnx::ModelProto m;
  if (!m.ParseFromString(onnx_bytes)) return KILN_ERROR(kInvalidModel, "not a valid ONNX protobuf");
  onnx::GraphProto& graph = *m.mutable_graph();
  for (const auto& t : graph.initializer()) {
    if (t.data_location() == onnx::TensorProto::EXTERNAL) {
      return KILN_ERROR(kUnsupported, "initializer '{}' is stored as external data: kiln quantize writes models whose "
                        "weights are inside the file (under 2 GB)", t.name());
    }
  }
  const int64_t need = plan.type == QuantType::kInt8 ? 13 : 19;
  onnx::OperatorSetIdProto* opset = nullptr;
  for (auto& o : *m.mutable_opset_import()) {
    if (default_domain(o.domain())) opset = &o;
  }
  if (!opset) {
    opset = m.add_opset_import();
    opset->set_domain("");
    opset->set_version(need);
  }
  std::set<std::string> names;
  collect_names(graph, names);
  if (opset->version() < 13) {
    return KILN_ERROR(kUnsupported, "the model is opset {}; kiln quantize needs opset 13 or newer (per-channel "
                      "DequantizeLinear): convert it first, e.g. with onnx.version_converter", opset->version());
  }
  if (opset->version() < need) {
    upgrade_graph(graph, opset->version(), names);
    opset->set_version(need);
  }
  m.set_ir_version(std::max<int64_t>(m.ir_version(), plan.type == QuantType::kInt8 ? 7 : 9));

  auto fresh = [&](const std::string& base) {
    std::string n = base;
    for (int k = 1; names.count(n); ++k) n = base + "_" + std::to_string(k);
    names.insert(n);
    return n;
  };
  const double qmax = quant_type_max(plan.type);
  std::vector<onnx::NodeProto> emitted;  // Q/DQ nodes to place before the node being copied
  std::map<std::string, std::string> replaced;  // original tensor -> its dequantized form
  auto zero_point = [&](const std::string& base, int64_t n) {
    onnx::TensorProto* t = graph.add_initializer();
    t->set_name(fresh(base));
    t->set_data_type(q_dtype(plan.type));
    if (n > 0) t->add_dims(n);
    t->set_raw_data(std::string(size_t(std::max<int64_t>(n, 1)), '\0'));  // int8 0 and E4M3FN +0 are both 0x00
    return t->name();
  };
  auto dequantized = [&](const std::string& tensor, bool weight) -> Expected<std::string> {
    if (auto it = replaced.find(tensor); it != replaced.end()) return it->second;
    onnx::NodeProto dq;
    dq.set_op_type("DequantizeLinear");
    dq.set_name(fresh(tensor + "_DequantizeLinear"));
    if (weight) {
      const Value* v = g.lookup(tensor);
      if (!v || !v->constant) return KILN_ERROR(kInternal, "weight '{}' has no constant value", tensor);
      const int axis = plan.weight_axis.at(tensor);
      QuantizedWeight q = quantize_weight(*v->constant, axis, plan.type);
      onnx::TensorProto* wq = graph.add_initializer();
      wq->set_name(fresh(tensor + "_quantized"));
      wq->set_data_type(q_dtype(plan.type));
      for (int64_t d : v->constant->dims()) wq->add_dims(d);
      wq->set_raw_data(std::move(q.bytes));
      onnx::TensorProto* sc = graph.add_initializer();
      sc->set_name(fresh(tensor + "_scale"));
      sc->set_data_type(onnx::TensorProto::FLOAT);
      sc->add_dims(int64_t(q.scales.size()));
      for (float s : q.scales) sc->add_float_data(s);
      std::string zp = zero_point(tensor + "_zero_point", int64_t(q.scales.size()));
      dq.add_input(wq->name());
      dq.add_input(sc->name());
      dq.add_input(zp);
      auto* a = dq.add_attribute();
      a->set_name("axis");
      a->set_type(onnx::AttributeProto::INT);
      a->set_i(axis);
    } else {
      const double amax = plan.act_amax.at(tensor);
      onnx::TensorProto* sc = graph.add_initializer();
      sc->set_name(fresh(tensor + "_scale"));
      sc->set_data_type(onnx::TensorProto::FLOAT);
      sc->add_float_data(float(amax / qmax));
      std::string zp = zero_point(tensor + "_zero_point", 0);
      onnx::NodeProto q;
      q.set_op_type("QuantizeLinear");
      q.set_name(fresh(tensor + "_QuantizeLinear"));
      q.add_input(tensor);
      q.add_input(sc->name());
      q.add_input(zp);
      q.add_output(fresh(tensor + "_quantized"));
      emitted.push_back(q);
      dq.add_input(q.output(0));
      dq.add_input(sc->name());
      dq.add_input(zp);
    }
    dq.add_output(fresh(tensor + "_dequantized"));
    emitted.push_back(dq);
    replaced[tensor] = dq.output(0);
    return dq.output(0);
  };

  std::map<int, std::vector<QdqInput>> by_node;
  for (const QdqInput& in : plan.inputs) by_node[in.node].push_back(in);
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  for (int i = 0; i < graph.node_size(); ++i) {
    onnx::NodeProto n = graph.node(i);
    for (const QdqInput& in : by_node[i]) {
      if (in.slot >= n.input_size() || n.input(in.slot).empty()) {
        return KILN_ERROR(kInternal, "node #{} has no input {}", i, in.slot);
      }
      KILN_ASSIGN_OR_RETURN(std::string r, dequantized(n.input(in.slot), in.weight));
      n.set_input(in.slot, r);
    }
    for (auto& e : emitted) *nodes.Add() = std::move(e);
    emitted.clear();
    *nodes.Add() = std::move(n);
  }
  graph.mutable_node()->Swap(&nodes);

  // Weights nothing reads any more (each was replaced by its quantized form) leave the file.
  std::multiset<std::string> reads;
  collect_reads(graph, reads);
  for (const auto& o : graph.output()) reads.insert(o.name());
  std::set<std::string> dropped;
  auto* inits = graph.mutable_initializer();
  for (int i = inits->size() - 1; i >= 0; --i) {
    const std::string& name = inits->Get(i).name();
    if (plan.weight_axis.count(name) && !reads.count(name)) {
      dropped.insert(name);
      inits->DeleteSubrange(i, 1);
    }
  }
  auto* ins = graph.mutable_input();  // IR < 4 lists initializers among the inputs too
  for (int i = ins->size() - 1; i >= 0; --i) {
    if (dropped.count(ins->Get(i).name())) ins->DeleteSubrange(i, 1);
  }
  std::string out;
  if (!m.SerializeToString(&out)) return KILN_ERROR(kInternal, "could not serialize the quantized model");
  return out;
}

}  // namespace kiln::quant
