#include "passes/value_inputs.h"

#include <algorithm>
#include <set>

#include "passes/rewrite.h"

namespace kiln {

namespace {

// Every subgraph held by n's attributes.
std::vector<const Graph*> bodies(const Node& n) {
  std::vector<const Graph*> b;
  for (const auto& [k, a] : n.attrs) {
    if (a.g) b.push_back(a.g.get());
    for (const auto& sg : a.graphs) b.push_back(sg.get());
  }
  return b;
}

// Seeds the walk with the parameter inputs of g's nodes and of their subgraphs' nodes.
void parameter_reads(const Graph& g, std::vector<const Value*>& out) {
  for (const auto& n : g.nodes) {
    for (size_t i = 0; i < n->inputs.size(); ++i) {
      if (n->inputs[i] && is_parameter_input(*n, i)) out.push_back(n->inputs[i]);
    }
    for (const Graph* b : bodies(*n)) parameter_reads(*b, out);
  }
}

}  // namespace

bool is_parameter_input(const Node& n, size_t slot) {
  if (is_reduce(n.op)) return slot == 1;  // axes
  switch (n.op) {
    case OpKind::kReshape: case OpKind::kExpand: case OpKind::kTile: case OpKind::kSqueeze: case OpKind::kUnsqueeze:
    case OpKind::kTopK: case OpKind::kTrilu: case OpKind::kSplit: case OpKind::kOneHot: case OpKind::kCumSum:
    case OpKind::kCumProd: case OpKind::kCenterCropPad: case OpKind::kAffineGrid: case OpKind::kCompress:
      return slot == 1;  // shape, repeats, axes, k, split sizes, depth, axis, condition (Compress)
    case OpKind::kSlice: return slot >= 1;                        // starts, ends, axes, steps
    case OpKind::kPad: return slot >= 1;                          // pads, constant_value, axes
    case OpKind::kResize: return slot >= 1;                       // roi, scales, sizes
    case OpKind::kConstantOfShape: return slot == 0;              // the shape
    case OpKind::kRange: return true;                             // start, limit, delta: the length
    case OpKind::kIf: return slot == 0;                           // the condition picks a branch
    case OpKind::kDropout: return slot == 2;                      // training_mode
    case OpKind::kMaxUnpool: return slot == 2;                    // output_shape
    case OpKind::kCol2Im: return slot == 1 || slot == 2;          // image_shape, block_shape
    case OpKind::kBlackmanWindow: case OpKind::kHannWindow: case OpKind::kHammingWindow:
      return slot == 0;                                           // the window's length
    case OpKind::kMelWeightMatrix: return true;                   // bins, length, rate, edges
    case OpKind::kDFT: return slot >= 1;                          // dft_length, axis
    case OpKind::kSTFT: return slot == 1 || slot == 3;            // frame_step, frame_length
    default:
      return false;
  }
}

std::vector<size_t> value_inputs(const Graph& g) {
  std::vector<const Value*> work;
  parameter_reads(g, work);
  const std::set<const Value*> direct(work.begin(), work.end());  // read by a parameter input itself
  std::set<const Value*> seen;
  std::set<const Value*> reached;  // graph inputs reached
  while (!work.empty()) {
    const Value* v = work.back();
    work.pop_back();
    if (!seen.insert(v).second || v->constant) continue;
    const Node* p = v->producer;
    if (!p) {
      if (dtype_is_int(v->type.dtype) || v->type.dtype == DType::kBool || direct.count(v)) reached.insert(v);
      continue;
    }
    // Shape and Size read only their input's shape; a subgraph's results are not traced into.
    if (p->op == OpKind::kShape || p->op == OpKind::kSize || !bodies(*p).empty()) continue;
    for (const Value* in : p->inputs) {
      if (in) work.push_back(in);
    }
  }
  std::vector<size_t> out;
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    const Value* v = g.inputs[i];
    if (!reached.count(v) || !v->type.is_tensor() || is_graph_output(g, v)) continue;
    auto dims = static_dims(v);
    if (!dims) continue;
    int64_t n = 1;
    for (int64_t d : *dims) n *= d;
    if (n <= kMaxValueInputElements) out.push_back(i);
  }
  return out;
}

Status bind_value_inputs(Graph& g, const std::vector<std::pair<size_t, Tensor>>& values) {
  UseMap uses(g);
  for (const auto& [i, t] : values) {
    if (i >= g.inputs.size()) return KILN_ERROR(kInvalidArgument, "value input {} of {} inputs", i, g.inputs.size());
    Value* in = g.inputs[i];
    auto dims = static_dims(in);
    if (!in->type.is_tensor() || in->type.dtype != t.dtype() || !dims || *dims != t.dims()) {
      return KILN_ERROR(kInvalidArgument, "input '{}' is {}: a value of {}{} cannot be bound to it", in->name,
                        in->type.to_string(), dtype_name(t.dtype()), dims_to_string(t.dims()));
    }
    Value* c = g.add_constant(g.unique_name(in->name + "_value"), t);
    std::vector<Use> readers = uses.uses(in);
    for (const Use& u : readers) {
      if (u.body) u.body->outputs[u.input] = c;  // a branch returning the input as it is
      else uses.set_input(u.node, u.input, c);
    }
  }
  return Status::ok();
}

}  // namespace kiln
