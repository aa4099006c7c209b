// Opset normalization: a rule table. Each rule names the ONNX op, the opsets it applies to
// (those below `before`), and a rewrite to the canonical form of ops.def.
#include "frontend/onnx/normalize.h"

#include <functional>

namespace kiln {

namespace {

struct Rule {
  const char* op;
  int64_t before;  // applies when the model's opset < before
  Status (*apply)(Graph& g, Node& n);
};

Value* int64_const(Graph& g, Node& n, const std::string& tag, const std::vector<int64_t>& v, bool scalar = false) {
  Tensor t = Tensor::from_vector<int64_t>(v, scalar ? std::vector<int64_t>{} : std::vector<int64_t>{int64_t(v.size())});
  return g.add_constant(g.unique_name(n.name + "_" + tag), std::move(t));
}

// Moves an ints attribute to input slot `slot` (creating omitted slots before it).
void ints_attr_to_input(Graph& g, Node& n, const std::string& attr, size_t slot) {
  const Attribute* a = n.attr(attr);
  if (!a) return;
  std::vector<int64_t> v = a->kind == Attribute::Kind::kInts ? a->ints : std::vector<int64_t>{a->i};
  n.attrs.erase(attr);
  if (n.inputs.size() <= slot) n.inputs.resize(slot + 1, nullptr);
  n.inputs[slot] = int64_const(g, n, attr, v);
}

void drop_attrs(Node& n, std::initializer_list<const char*> names) {
  for (const char* a : names) n.attrs.erase(a);
}

// A float attribute becomes a constant input cast to the data input's type: CastLike(c, x).
void float_attr_to_input_like(Graph& g, Node& n, const std::string& attr, size_t slot) {
  const Attribute* a = n.attr(attr);
  // Without its data input there is no type to cast to: the attribute stays, and the node's schema
  // check names what is missing.
  if (!a || n.inputs.empty() || !n.inputs[0]) return;
  float v = a->f;
  n.attrs.erase(attr);
  Value* c = g.add_constant(g.unique_name(n.name + "_" + attr), Tensor::scalar<float>(v));
  Node* cast = g.add_node(OpKind::kCastLike, {c, n.inputs[0]}, 1, g.unique_name(n.name + "_" + attr + "_cast"));
  cast->index = n.index;
  if (n.inputs.size() <= slot) n.inputs.resize(slot + 1, nullptr);
  n.inputs[slot] = cast->outputs[0];
}

Status reduce_axes(Graph& g, Node& n) { ints_attr_to_input(g, n, "axes", 1); return Status::ok(); }

Status split_attr(Graph& g, Node& n) {
  ints_attr_to_input(g, n, "split", 1);
  if (!n.has_input(1)) n.attrs["num_outputs"] = Attribute::of_int(int64_t(n.outputs.size()));
  return Status::ok();
}

Status split_num_outputs(Graph& g, Node& n) {
  if (!n.has_input(1) && !n.has_attr("num_outputs")) n.attrs["num_outputs"] = Attribute::of_int(int64_t(n.outputs.size()));
  return Status::ok();
}

Status slice_attrs(Graph& g, Node& n) {
  ints_attr_to_input(g, n, "starts", 1);
  ints_attr_to_input(g, n, "ends", 2);
  ints_attr_to_input(g, n, "axes", 3);
  return Status::ok();
}

Status pad_attrs(Graph& g, Node& n) {
  if (n.has_attr("paddings")) {  // Pad-1 name
    n.attrs["pads"] = *n.attr("paddings");
    n.attrs.erase("paddings");
  }
  ints_attr_to_input(g, n, "pads", 1);
  if (n.has_attr("value")) float_attr_to_input_like(g, n, "value", 2);
  return Status::ok();
}

Status clip_attrs(Graph& g, Node& n) {
  if (n.has_attr("min")) float_attr_to_input_like(g, n, "min", 1);
  if (n.has_attr("max")) float_attr_to_input_like(g, n, "max", 2);
  return Status::ok();
}

Status dropout_attrs(Graph& g, Node& n) {
  if (n.has_attr("ratio")) float_attr_to_input_like(g, n, "ratio", 1);
  drop_attrs(n, {"is_test"});
  return Status::ok();
}

Status topk_attr(Graph& g, Node& n) { ints_attr_to_input(g, n, "k", 1); return Status::ok(); }

Status reshape_attr(Graph& g, Node& n) { ints_attr_to_input(g, n, "shape", 1); return Status::ok(); }

// Upsample-7 (scales attribute) and Upsample-9 / Resize-10 (scales input): nearest rounds down
// and coordinates are asymmetric in those versions.
Status upsample(Graph& g, Node& n) {
  if (const Attribute* a = n.attr("scales")) {
    std::vector<float> s = a->floats;
    n.attrs.erase("scales");
    Value* c = g.add_constant(g.unique_name(n.name + "_scales"),
                              Tensor::from_vector<float>(s, {int64_t(s.size())}));
    n.inputs.resize(1);
    n.inputs.push_back(c);
  }
  // Resize takes (X, roi, scales).
  if (n.inputs.size() == 2) n.inputs.insert(n.inputs.begin() + 1, nullptr);
  std::string mode = n.attr_string("mode", "nearest");
  if (mode == "bilinear") mode = "linear";
  n.attrs["mode"] = Attribute::of_string(mode);
  n.attrs["coordinate_transformation_mode"] = Attribute::of_string("asymmetric");
  if (mode == "nearest") n.attrs["nearest_mode"] = Attribute::of_string("floor");
  drop_attrs(n, {"height_scale", "width_scale"});
  return Status::ok();
}

Status drop_legacy(Graph& g, Node& n) {
  drop_attrs(n, {"consumed_inputs", "is_test", "spatial"});
  return Status::ok();
}

// Opset < 7 binary ops: explicit broadcast=1 with axis aligns B's dims to A starting at axis.
// Numpy broadcasting already covers the default (suffix) alignment; other axes need B reshaped.
Status legacy_broadcast(Graph& g, Node& n) {
  drop_attrs(n, {"consumed_inputs"});
  const Attribute* axis = n.attr("axis");
  if (n.attr_int("broadcast", 0) && axis && n.inputs.size() == 2) {
    const Type& ta = n.inputs[0]->type;
    const Type& tb = n.inputs[1]->type;
    if (ta.has_rank() && tb.has_rank()) {
      int64_t ra = int64_t(ta.shape->rank()), rb = int64_t(tb.shape->rank());
      int64_t ax = axis->i < 0 ? axis->i + ra : axis->i;
      int64_t trailing = ra - ax - rb;
      if (trailing > 0) {
        std::vector<int64_t> axes;
        for (int64_t k = 0; k < trailing; ++k) axes.push_back(rb + k);
        Node* u = g.add_node(OpKind::kUnsqueeze, {n.inputs[1], int64_const(g, n, "bcast_axes", axes)}, 1,
                             g.unique_name(n.name + "_bcast"));
        u->index = n.index;
        n.inputs[1] = u->outputs[0];
      }
    }
  }
  drop_attrs(n, {"broadcast", "axis"});
  return Status::ok();
}

// PRelu before 7 had no broadcasting rule beyond "slope of size 1 or the shape of X"; exporters
// (PyTorch at opset 6) wrote a per-channel slope of shape [C] for X of shape [N, C, D1, ...].
// Canonical PRelu broadcasts numpy-style, so give the slope trailing unit dims: [C, 1, ...].
Status prelu_channel_slope(Graph& g, Node& n) {
  KILN_RETURN_IF_ERROR(legacy_broadcast(g, n));
  if (n.inputs.size() != 2 || !n.inputs[0] || !n.inputs[1]) return Status::ok();
  const Type& tx = n.inputs[0]->type;
  const Type& ts = n.inputs[1]->type;
  if (!tx.has_rank() || !ts.has_rank() || ts.shape->rank() != 1 || tx.shape->rank() < 3) return Status::ok();
  const Dim& c = ts.shape->dims[0];
  const Dim& xc = tx.shape->dims[1];
  if (c.is_static() && (c.value() == 1 || (xc.is_static() && xc.value() != c.value()))) return Status::ok();
  std::vector<int64_t> axes;
  for (size_t k = 1; k + 1 < tx.shape->rank(); ++k) axes.push_back(int64_t(k));
  Node* u = g.add_node(OpKind::kUnsqueeze, {n.inputs[1], int64_const(g, n, "slope_axes", axes)}, 1,
                       g.unique_name(n.name + "_slope"));
  u->index = n.index;
  n.inputs[1] = u->outputs[0];
  return Status::ok();
}

// Softmax/LogSoftmax/Hardmax before 13 flatten the input to 2-D at `axis` (default 1):
//   y = Reshape(Softmax(Flatten(x, axis), axis=-1), Shape(x))
Status softmax_coerce_2d(Graph& g, Node& n) {
  // Runs before the op's arity is checked: a malformed node must not be dereferenced here.
  if (n.inputs.size() != 1 || !n.inputs[0] || n.outputs.empty() || !n.outputs[0]) {
    return KILN_ERROR(kInvalidModel, "{}: {} takes one input and gives one output", n.describe(), op_name(n.op));
  }
  int64_t axis = n.attr_int("axis", 1);
  const Type& t = n.inputs[0]->type;
  if (t.has_rank()) {
    int64_t r = int64_t(t.shape->rank());
    if (axis == -1 || axis == r - 1) {  // same as the new semantics
      n.attrs["axis"] = Attribute::of_int(-1);
      return Status::ok();
    }
  }
  Value* x = n.inputs[0];
  Value* y = n.outputs[0];
  Node* shape = g.add_node(OpKind::kShape, {x}, 1, g.unique_name(n.name + "_shape"));
  Node* flat = g.add_node(OpKind::kFlatten, {x}, 1, g.unique_name(n.name + "_flatten"));
  flat->attrs["axis"] = Attribute::of_int(axis);
  // n becomes the 2-D softmax; its old output moves to the Reshape.
  Value* mid = g.add_value(g.unique_name(n.name + "_2d"));
  mid->producer = &n;
  n.inputs[0] = flat->outputs[0];
  n.outputs[0] = mid;
  n.attrs["axis"] = Attribute::of_int(-1);
  Node* back = g.add_node(OpKind::kReshape, {mid, shape->outputs[0]}, 0, g.unique_name(n.name + "_reshape"));
  back->outputs.push_back(y);
  y->producer = back;
  y->producer_output = 0;
  for (Node* m : {shape, flat, back}) m->index = n.index;
  return Status::ok();
}

Status cast_string_to(Graph& g, Node& n) {
  const Attribute* a = n.attr("to");
  if (a && a->kind == Attribute::Kind::kString) {
    static const std::map<std::string, int64_t> codes = {
        {"FLOAT", 1}, {"UINT8", 2}, {"INT8", 3}, {"UINT16", 4}, {"INT16", 5}, {"INT32", 6}, {"INT64", 7},
        {"STRING", 8}, {"BOOL", 9}, {"FLOAT16", 10}, {"DOUBLE", 11}, {"UINT32", 12}, {"UINT64", 13}};
    auto it = codes.find(a->s);
    if (it == codes.end()) return KILN_ERROR(kInvalidModel, "{}: unknown Cast target '{}'", n.describe(), a->s);
    n.attrs["to"] = Attribute::of_int(it->second);
  }
  return Status::ok();
}

Status concat_default_axis(Graph& g, Node& n) {
  if (!n.has_attr("axis")) n.attrs["axis"] = Attribute::of_int(1);
  return Status::ok();
}

Status dft_axis(Graph& g, Node& n) {
  int64_t axis = n.attr_int("axis", 1);
  n.attrs.erase("axis");
  if (n.inputs.size() < 3) n.inputs.resize(3, nullptr);
  n.inputs[2] = int64_const(g, n, "axis", {axis}, true);
  return Status::ok();
}

const Rule kRules[] = {
    // axes attribute -> input
    {"ReduceSum", 13, reduce_axes},       {"ReduceMean", 18, reduce_axes},
    {"ReduceMax", 18, reduce_axes},       {"ReduceMin", 18, reduce_axes},
    {"ReduceProd", 18, reduce_axes},      {"ReduceL1", 18, reduce_axes},
    {"ReduceL2", 18, reduce_axes},        {"ReduceLogSum", 18, reduce_axes},
    {"ReduceLogSumExp", 18, reduce_axes}, {"ReduceSumSquare", 18, reduce_axes},
    {"Squeeze", 13, reduce_axes},         {"Unsqueeze", 13, reduce_axes},
    {"Split", 13, split_attr},            {"Split", 18, split_num_outputs},
    {"Slice", 10, slice_attrs},           {"Pad", 11, pad_attrs},
    {"Clip", 11, clip_attrs},             {"Dropout", 12, dropout_attrs},
    {"TopK", 10, topk_attr},              {"Reshape", 5, reshape_attr},
    {"Upsample", 1000, upsample},         {"Resize", 11, upsample},
    {"Softmax", 13, softmax_coerce_2d},   {"LogSoftmax", 13, softmax_coerce_2d},
    {"Hardmax", 13, softmax_coerce_2d},   {"Cast", 6, cast_string_to},
    {"Concat", 4, concat_default_axis},   {"DFT", 20, dft_axis},
    {"BatchNormalization", 9, drop_legacy},
    // opset < 7: legacy broadcast attributes, consumed_inputs
    {"Add", 7, legacy_broadcast},  {"Sub", 7, legacy_broadcast}, {"Mul", 7, legacy_broadcast},
    {"Div", 7, legacy_broadcast},  {"Pow", 7, legacy_broadcast}, {"And", 7, legacy_broadcast},
    {"Or", 7, legacy_broadcast},   {"Xor", 7, legacy_broadcast}, {"Equal", 7, legacy_broadcast},
    {"Less", 7, legacy_broadcast}, {"Greater", 7, legacy_broadcast}, {"Gemm", 7, legacy_broadcast},
    {"PRelu", 7, prelu_channel_slope},
};

}  // namespace

std::string canonical_op_type(const std::string& domain, const std::string& op_type) {
  if (domain.empty()) {
    if (op_type == "Upsample") return "Resize";
    if (op_type == "Scatter") return "ScatterElements";
  }
  return op_type;
}

Status normalize_node(Graph& g, Node& n, const std::string& original_op, int64_t opset) {
  if (op_domain(n.op) != "") return Status::ok();
  for (const Rule& r : kRules) {
    if (original_op == r.op && opset < r.before) KILN_RETURN_IF_ERROR(r.apply(g, n));
  }
  // consumed_inputs was a no-op hint in opset-1 ops (Relu, Add, BatchNormalization, ...).
  if (opset < 7) drop_attrs(n, {"consumed_inputs"});
  return Status::ok();
}

}  // namespace kiln
