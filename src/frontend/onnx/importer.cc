#include "frontend/onnx/importer.h"

#include <google/protobuf/io/coded_stream.h>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <fstream>
#include <set>

#include "frontend/onnx/normalize.h"
#include "frontend/onnx/onnx_tensor.h"
#include "ops/infer.h"
#include "support/mapped_file.h"

namespace kiln {

namespace {

namespace fs = std::filesystem;

std::string describe_proto_node(const onnx::NodeProto& n, int index) {
  return fmt::format("node '{}' ({}, #{})", n.name(), n.op_type(), index);
}

class Importer {
 public:
  Importer(Model& m, const ImportOptions& opt, std::string base_dir, std::shared_ptr<const onnx::ModelProto> proto)
      : model_(m), opt_(opt) {
    topt_.base_dir = std::move(base_dir);
    topt_.owner = std::move(proto);
  }

  Status import(const onnx::ModelProto& p) {
    if (!p.has_ir_version()) {
      return KILN_ERROR(kInvalidModel, "no ir_version: this is not an ONNX model (a different protobuf, or corrupt)");
    }
    if (!p.has_graph()) return KILN_ERROR(kInvalidModel, "the model has no graph");
    model_.ir_version = p.ir_version();
    if (p.ir_version() < 3 || p.ir_version() > kMaxIrVersion) {
      return KILN_ERROR(kUnsupported, "IR version {} is not supported (kiln reads 3 to {})", p.ir_version(), kMaxIrVersion);
    }
    for (const auto& o : p.opset_import()) {
      std::string d = o.domain() == "ai.onnx" ? "" : o.domain();
      model_.opsets[d] = o.version();
    }
    if (!model_.opsets.count("")) {
      if (p.opset_import_size() == 0) model_.opsets[""] = 1;  // IR < 3 default; harmless otherwise
    }
    for (const auto& [d, v] : model_.opsets) {
      int64_t max = d.empty() ? kMaxOnnxOpset : d == "ai.onnx.ml" ? kMaxOnnxMlOpset : -1;
      if (max < 0) continue;  // other domains fail when a node uses them
      if (v < 1 || v > max) {
        return KILN_ERROR(kUnsupported, "opset {} of domain '{}' is not supported (kiln reads 1 to {})", v,
                          d.empty() ? "ai.onnx" : d, max);
      }
    }
    for (const auto& f : p.functions()) functions_[{f.domain(), f.name()}] = &f;
    // Inlining rewrites graphs into temporary copies; their tensors must be copied, not viewed.
    if (!functions_.empty()) topt_.owner = nullptr;
    model_.producer_name = p.producer_name();
    model_.producer_version = p.producer_version();
    model_.domain = p.domain();
    model_.doc = p.doc_string();
    model_.model_version = p.model_version();
    for (const auto& kv : p.metadata_props()) model_.metadata.emplace_back(kv.key(), kv.value());
    KILN_ASSIGN_OR_RETURN(model_.graph, convert_graph(p.graph(), nullptr, nullptr, 0));
    return Status::ok();
  }

 private:
  Expected<Type> convert_type(const onnx::TypeProto& t, const std::string& what, int depth = 0) {
    if (depth > 16) return KILN_ERROR(kInvalidModel, "{}: type nested too deeply", what);
    switch (t.value_case()) {
      case onnx::TypeProto::kTensorType: {
        const auto& tt = t.tensor_type();
        Type out;
        if (tt.elem_type() == 0) return out;  // undefined element type: unknown
        auto dt = dtype_from_onnx(tt.elem_type());
        if (!dt) {
          return KILN_ERROR(kUnsupported, "{}: element type {} is not supported", what,
                            onnx::TensorProto_DataType_IsValid(tt.elem_type())
                                ? onnx::TensorProto_DataType_Name(onnx::TensorProto_DataType(tt.elem_type()))
                                : std::to_string(tt.elem_type()));
        }
        out = Type::tensor(*dt);
        if (tt.has_shape()) {
          Shape s;
          for (const auto& d : tt.shape().dim()) {
            if (d.has_dim_value()) {
              if (d.dim_value() < 0) {
                return KILN_ERROR(kInvalidModel, "{}: negative dimension {}", what, d.dim_value());
              }
              s.dims.emplace_back(d.dim_value());
            } else if (d.has_dim_param() && !d.dim_param().empty()) {
              s.dims.push_back(Dim::symbol(d.dim_param()));
            } else {
              s.dims.emplace_back();
            }
          }
          out.shape = std::move(s);
        }
        return out;
      }
      case onnx::TypeProto::kSequenceType: {
        KILN_ASSIGN_OR_RETURN(Type e, convert_type(t.sequence_type().elem_type(), what, depth + 1));
        return Type::sequence(std::move(e));
      }
      case onnx::TypeProto::kOptionalType: {
        KILN_ASSIGN_OR_RETURN(Type e, convert_type(t.optional_type().elem_type(), what, depth + 1));
        return Type::optional(std::move(e));
      }
      case onnx::TypeProto::kMapType:
        return KILN_ERROR(kUnsupported, "{}: map types are not supported", what);
      case onnx::TypeProto::kOpaqueType:
        return KILN_ERROR(kUnsupported, "{}: opaque types are not supported", what);
      case onnx::TypeProto::kSparseTensorType:
        return KILN_ERROR(kUnsupported, "{}: sparse tensors are not supported", what);
      case onnx::TypeProto::VALUE_NOT_SET:
        return Type();
    }
    return Type();
  }

  Expected<Attribute> convert_attr(const onnx::AttributeProto& a, Graph* g, Node* node, int depth,
                                   const std::string& what) {
    using K = Attribute::Kind;
    Attribute out;
    auto type = a.type();
    if (type == onnx::AttributeProto::UNDEFINED) {  // very old models: infer from the set field
      if (a.has_f()) type = onnx::AttributeProto::FLOAT;
      else if (a.has_i()) type = onnx::AttributeProto::INT;
      else if (a.has_s()) type = onnx::AttributeProto::STRING;
      else if (a.has_t()) type = onnx::AttributeProto::TENSOR;
      else if (a.has_g()) type = onnx::AttributeProto::GRAPH;
      else if (a.floats_size()) type = onnx::AttributeProto::FLOATS;
      else if (a.ints_size()) type = onnx::AttributeProto::INTS;
      else if (a.strings_size()) type = onnx::AttributeProto::STRINGS;
      else if (a.tensors_size()) type = onnx::AttributeProto::TENSORS;
      else if (a.graphs_size()) type = onnx::AttributeProto::GRAPHS;
    }
    std::string aw = what + " attribute '" + a.name() + "'";
    switch (type) {
      case onnx::AttributeProto::FLOAT: out.kind = K::kFloat; out.f = a.f(); break;
      case onnx::AttributeProto::INT: out.kind = K::kInt; out.i = a.i(); break;
      case onnx::AttributeProto::STRING: out.kind = K::kString; out.s = a.s(); break;
      case onnx::AttributeProto::TENSOR: {
        out.kind = K::kTensor;
        KILN_ASSIGN_OR_RETURN(out.t, onnx_io::tensor_from_proto(a.t(), topt_, aw));
        break;
      }
      case onnx::AttributeProto::GRAPH: {
        out.kind = K::kGraph;
        KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> sg, convert_graph(a.g(), g, node, depth + 1));
        out.g = std::move(sg);
        break;
      }
      case onnx::AttributeProto::FLOATS: out.kind = K::kFloats; out.floats.assign(a.floats().begin(), a.floats().end()); break;
      case onnx::AttributeProto::INTS: out.kind = K::kInts; out.ints.assign(a.ints().begin(), a.ints().end()); break;
      case onnx::AttributeProto::STRINGS: out.kind = K::kStrings; out.strings.assign(a.strings().begin(), a.strings().end()); break;
      case onnx::AttributeProto::TENSORS:
        out.kind = K::kTensors;
        for (const auto& t : a.tensors()) {
          KILN_ASSIGN_OR_RETURN(Tensor x, onnx_io::tensor_from_proto(t, topt_, aw));
          out.tensors.push_back(std::move(x));
        }
        break;
      case onnx::AttributeProto::GRAPHS:
        out.kind = K::kGraphs;
        for (const auto& sgp : a.graphs()) {
          KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> sg, convert_graph(sgp, g, node, depth + 1));
          out.graphs.push_back(std::move(sg));
        }
        break;
      case onnx::AttributeProto::TYPE_PROTO: {
        out.kind = K::kType;
        KILN_ASSIGN_OR_RETURN(Type t, convert_type(a.tp(), aw));
        out.types.push_back(std::move(t));
        break;
      }
      case onnx::AttributeProto::TYPE_PROTOS:
        out.kind = K::kTypes;
        for (const auto& tp : a.type_protos()) {
          KILN_ASSIGN_OR_RETURN(Type t, convert_type(tp, aw));
          out.types.push_back(std::move(t));
        }
        break;
      default:
        return KILN_ERROR(kInvalidModel, "{} has an unsupported attribute type {}", aw, int(type));
    }
    return out;
  }

  // Model-local functions are inlined: their nodes replace the call, with fresh value names.
  Status inline_functions(const onnx::GraphProto& in, onnx::GraphProto* out, int depth) {
    *out = in;
    bool changed = true;
    int rounds = 0;
    while (changed) {
      changed = false;
      if (++rounds > 16) return KILN_ERROR(kInvalidModel, "model-local functions nest more than 16 deep (recursive?)");
      google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
      for (const auto& n : out->node()) {
        auto it = functions_.find({n.domain(), n.op_type()});
        if (it == functions_.end()) { *nodes.Add() = n; continue; }
        changed = true;
        const onnx::FunctionProto& f = *it->second;
        std::string prefix = fmt::format("{}__{}_", n.name().empty() ? f.name() : n.name(), inline_counter_++);
        std::map<std::string, std::string> rename;
        for (int i = 0; i < f.input_size(); ++i) rename[f.input(i)] = i < n.input_size() ? n.input(i) : "";
        for (int i = 0; i < f.output_size(); ++i) rename[f.output(i)] = i < n.output_size() ? n.output(i) : "";
        std::map<std::string, const onnx::AttributeProto*> call_attrs;
        for (const auto& a : n.attribute()) call_attrs[a.name()] = &a;
        for (const auto& a : f.attribute_proto()) call_attrs.emplace(a.name(), &a);  // defaults
        for (const auto& fn : f.node()) {
          onnx::NodeProto c = fn;
          c.set_name(prefix + fn.name());
          auto map_name = [&](const std::string& s) {
            if (s.empty()) return s;
            auto r = rename.find(s);
            return r != rename.end() ? r->second : prefix + s;
          };
          for (auto& s : *c.mutable_input()) s = map_name(s);
          for (auto& s : *c.mutable_output()) s = map_name(s);
          google::protobuf::RepeatedPtrField<onnx::AttributeProto> attrs;
          for (const auto& a : c.attribute()) {
            if (a.ref_attr_name().empty()) { *attrs.Add() = a; continue; }
            auto r = call_attrs.find(a.ref_attr_name());
            if (r == call_attrs.end()) continue;  // not given: the op's default applies
            onnx::AttributeProto b = *r->second;
            b.set_name(a.name());
            *attrs.Add() = b;
          }
          *c.mutable_attribute() = attrs;
          *nodes.Add() = c;
        }
      }
      *out->mutable_node() = nodes;
    }
    (void)depth;
    return Status::ok();
  }

  Expected<std::unique_ptr<Graph>> convert_graph(const onnx::GraphProto& gp_in, Graph* parent, Node* parent_node,
                                                 int depth) {
    if (depth > opt_.max_subgraph_depth) {
      return KILN_ERROR(kInvalidModel, "subgraphs are nested more than {} deep", opt_.max_subgraph_depth);
    }
    // A graph calling model-local functions is rewritten into a copy (and tensors are then copied
    // out of it, not viewed: see import()); otherwise it is read where it was parsed.
    onnx::GraphProto inlined;
    if (!functions_.empty()) KILN_RETURN_IF_ERROR(inline_functions(gp_in, &inlined, depth));
    const onnx::GraphProto& gp = functions_.empty() ? gp_in : inlined;
    auto g = std::make_unique<Graph>();
    g->name = gp.name();
    g->parent = parent;
    g->parent_node = parent_node;
    std::string gname = parent ? fmt::format("subgraph '{}'", gp.name()) : "graph";

    if (gp.sparse_initializer_size() > 0) {
      return KILN_ERROR(kUnsupported, "{}: sparse initializers are not supported", gname);
    }
    std::set<std::string> defined;
    auto define = [&](const std::string& name, const std::string& by) -> Status {
      if (name.empty()) return Status::ok();
      if (!defined.insert(name).second) {
        return KILN_ERROR(kInvalidModel, "{}: value '{}' is defined twice (again by {})", gname, name, by);
      }
      return Status::ok();
    };
    for (const auto& t : gp.initializer()) {
      KILN_RETURN_IF_ERROR(define(t.name(), "an initializer"));
      KILN_ASSIGN_OR_RETURN(Tensor x, onnx_io::tensor_from_proto(t, topt_, "initializer '" + t.name() + "'"));
      g->add_constant(t.name(), std::move(x));
    }
    for (const auto& in : gp.input()) {
      std::string what = fmt::format("{} input '{}'", gname, in.name());
      KILN_ASSIGN_OR_RETURN(Type t, convert_type(in.type(), what));
      if (Value* v = g->lookup(in.name()); v && v->owner == g.get() && v->constant) {
        // An initializer listed as an input (IR < 4 style): kiln treats it as a constant.
        continue;
      }
      if (in.name().empty()) return KILN_ERROR(kInvalidModel, "{} has an input with no name", gname);
      KILN_RETURN_IF_ERROR(define(in.name(), "a graph input"));
      g->add_input(in.name(), std::move(t));
    }
    // Pass 1: every node and its outputs, so inputs can be resolved in any order.
    std::vector<std::pair<const onnx::NodeProto*, Node*>> made;
    for (int i = 0; i < gp.node_size(); ++i) {
      const auto& np = gp.node(i);
      std::string desc = describe_proto_node(np, i);
      std::string domain = np.domain() == "ai.onnx" ? "" : np.domain();
      auto ov = model_.opsets.find(domain);
      if (ov == model_.opsets.end()) {
        return KILN_ERROR(kInvalidModel, "{}: domain '{}' is not in the model's opset_import", desc, np.domain());
      }
      std::string op_type = canonical_op_type(domain, np.op_type());
      auto op = op_from_name(domain, op_type);
      if (!op) {
        if (domain.empty() || domain == "ai.onnx.ml") {
          return KILN_ERROR(kUnsupported, "{}: unknown op '{}' in domain '{}'", desc, np.op_type(),
                            domain.empty() ? "ai.onnx" : domain);
        }
        return KILN_ERROR(kUnsupported, "{}: unknown op domain '{}' (kiln supports ai.onnx and ai.onnx.ml)", desc,
                          np.domain());
      }
      auto n = std::make_unique<Node>();
      n->op = *op;
      n->name = np.name();
      n->index = i;
      n->owner = g.get();
      for (int k = 0; k < np.output_size(); ++k) {
        const std::string& on = np.output(k);
        if (on.empty()) { n->outputs.push_back(nullptr); continue; }
        KILN_RETURN_IF_ERROR(define(on, desc));
        Value* v = g->add_value(on);
        v->producer = n.get();
        v->producer_output = k;
        n->outputs.push_back(v);
      }
      made.emplace_back(&np, n.get());
      g->nodes.push_back(std::move(n));
    }
    for (const auto& vi : gp.value_info()) {
      Value* v = g->lookup(vi.name());
      if (!v || v->owner != g.get() || v->constant) continue;
      KILN_ASSIGN_OR_RETURN(Type t, convert_type(vi.type(), fmt::format("value_info '{}'", vi.name())));
      v->type = std::move(t);
    }
    // Pass 2: inputs, attributes (subgraphs see every value of this graph), opset rewrites.
    for (auto [np, n] : made) {
      std::string desc = describe_proto_node(*np, n->index);
      for (const auto& in : np->input()) {
        if (in.empty()) { n->inputs.push_back(nullptr); continue; }
        Value* v = g->lookup(in);
        if (!v) return KILN_ERROR(kInvalidModel, "{}: input '{}' is not defined", desc, in);
        n->inputs.push_back(v);
      }
      for (const auto& a : np->attribute()) {
        if (a.name().empty()) return KILN_ERROR(kInvalidModel, "{}: an attribute has no name", desc);
        if (!a.ref_attr_name().empty()) {
          return KILN_ERROR(kInvalidModel, "{}: attribute '{}' refers to '{}' outside a function", desc, a.name(),
                            a.ref_attr_name());
        }
        KILN_ASSIGN_OR_RETURN(Attribute attr, convert_attr(a, g.get(), n, depth, desc));
        if (!n->attrs.emplace(a.name(), std::move(attr)).second) {
          return KILN_ERROR(kInvalidModel, "{}: attribute '{}' is given twice", desc, a.name());
        }
      }
      std::string domain = np->domain() == "ai.onnx" ? "" : np->domain();
      KILN_RETURN_IF_ERROR(normalize_node(*g, *n, np->op_type(), model_.opsets[domain]));
    }
    for (const auto& out : gp.output()) {
      Value* v = g->lookup(out.name());
      if (!v) return KILN_ERROR(kInvalidModel, "{} output '{}' is not produced by any node", gname, out.name());
      KILN_ASSIGN_OR_RETURN(Type t, convert_type(out.type(), fmt::format("{} output '{}'", gname, out.name())));
      if (!v->type.is_known() && !v->constant) v->type = std::move(t);
      g->outputs.push_back(v);
    }
    KILN_RETURN_IF_ERROR(g->topo_sort());
    for (size_t i = 0; i < g->nodes.size(); ++i) {
      (void)i;  // indices keep the ONNX position for messages
    }
    return g;
  }

  Model& model_;
  const ImportOptions& opt_;
  onnx_io::TensorReadOptions topt_;
  std::map<std::pair<std::string, std::string>, const onnx::FunctionProto*> functions_;
  int inline_counter_ = 0;
};

}  // namespace

Expected<Value*> find_tensor_input(Graph& g, const std::string& name, std::string_view who) {
  auto it = std::find_if(g.inputs.begin(), g.inputs.end(), [&](const Value* v) { return v->name == name; });
  if (it == g.inputs.end()) {
    std::string names;
    for (const Value* v : g.inputs) if (!v->constant) names += (names.empty() ? "'" : ", '") + v->name + "'";
    return KILN_ERROR(kInvalidArgument, "{} names input '{}', but the model's inputs are {}", who, name, names);
  }
  if (!(*it)->type.is_tensor()) {
    return KILN_ERROR(kInvalidArgument, "{}: input '{}' is {}, not a tensor", who, name, (*it)->type.to_string());
  }
  return *it;
}

Status bind_input_shapes(Graph& g, const std::map<std::string, std::vector<int64_t>>& shapes) {
  std::map<std::string, int64_t> symbols;  // dim_param -> the value a given shape binds it to
  for (const auto& entry : shapes) {
    // Named copies, not structured bindings: lambdas below capture them (clang 14 cannot).
    const std::string& name = entry.first;
    const std::vector<int64_t>& dims = entry.second;
    KILN_ASSIGN_OR_RETURN(Value * input, find_tensor_input(g, name, "--shapes"));
    Value& v = *input;
    KILN_RETURN_IF_ERROR(checked_numel(dims).status().with_context(fmt::format("--shapes for input '{}'", name)));
    if (v.type.shape) {
      const Shape& s = *v.type.shape;
      auto mismatch = [&] {
        return KILN_ERROR(kInvalidArgument, "--shapes gives input '{}' shape {}, but the model declares {}", name,
                          dims_to_string(dims), s.to_string());
      };
      if (s.rank() != dims.size()) return mismatch();
      for (size_t i = 0; i < dims.size(); ++i) {
        if (s[i].is_static() && s[i].value() != dims[i]) return mismatch();
        if (s[i].is_symbolic()) {
          std::string sym = s[i].to_string();
          auto [b, fresh] = symbols.emplace(sym, dims[i]);
          if (!fresh && b->second != dims[i]) {
            return KILN_ERROR(kInvalidArgument, "--shapes binds dim '{}' to both {} and {} (input '{}')", sym, b->second,
                              dims[i], name);
          }
        }
      }
    }
    std::vector<Dim> d(dims.begin(), dims.end());
    v.type.shape = Shape(std::move(d));
  }
  // Bind the same symbols in inputs that were not named.
  for (Value* v : g.inputs) {
    if (!v->type.has_rank() || shapes.count(v->name)) continue;
    for (Dim& d : v->type.shape->dims) {
      if (!d.is_symbolic()) continue;
      auto b = symbols.find(d.to_string());
      if (b != symbols.end()) d = Dim(b->second);
    }
  }
  return Status::ok();
}

Expected<Model> import_onnx_bytes(const void* data, size_t size, const std::string& base_dir, const ImportOptions& opt) {
  if (size > size_t(INT_MAX)) {
    return KILN_ERROR(kUnsupported, "the model file is {} bytes; protobuf files over 2 GB must keep weights as external data", size);
  }
  // Shared: the initializers' large raw data is viewed in place, so the protobuf lives as long as
  // any of them does.
  auto p = std::make_shared<onnx::ModelProto>();
  google::protobuf::io::CodedInputStream cis(static_cast<const uint8_t*>(data), int(size));
  cis.SetRecursionLimit(4 * opt.max_subgraph_depth + 64);
  if (!p->ParseFromCodedStream(&cis) || !cis.ConsumedEntireMessage()) {
    return KILN_ERROR(kInvalidModel, "not a valid ONNX protobuf (truncated or corrupt file, or nested too deeply)");
  }
  Model m;
  Importer imp(m, opt, base_dir, p);
  KILN_RETURN_IF_ERROR(imp.import(*p));
  KILN_RETURN_IF_ERROR(bind_input_shapes(*m.graph, opt.input_shapes));
  if (opt.infer) KILN_RETURN_IF_ERROR(infer_types(*m.graph));
  return m;
}

Expected<Model> import_onnx_file(const std::string& path, const ImportOptions& opt) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return KILN_ERROR(kIo, "'{}' is a directory, not an ONNX file", path);
  auto mapped = map_file(path);
  if (!mapped) return KILN_ERROR(kIo, "cannot open '{}': {}", path, std::strerror(errno));
  fs::path dir = fs::path(path).parent_path();
  auto m = import_onnx_bytes((*mapped)->p, (*mapped)->size, dir.empty() ? "." : dir.string(), opt);
  if (!m) return m.status().with_context(path);
  m->source_path = path;
  return m;
}

}  // namespace kiln
