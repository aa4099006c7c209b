// Op family: control. If, Loop and Scan run their body graphs through the executor (bodies read
// values of enclosing graphs directly); the sequence and optional ops are in control_sequence.cc.
// Semantics follow the ONNX spec; onnx/reference/ops/op_{if,loop,scan}.py are precise readings.
#include <algorithm>
#include <limits>

#include "ops/control_util.h"

namespace kiln {

namespace {

constexpr auto kGraphAttr = Attribute::Kind::kGraph;
constexpr auto kIntAttr = Attribute::Kind::kInt;
constexpr auto kIntsAttr = Attribute::Kind::kInts;

// A scalar (one-element) bool-like tensor as a bool.
Expected<bool> scalar_bool(const KernelCtx& c, const Data& d, const char* what) {
  if (!d.is_tensor() || d.tensor.numel() != 1) return c.error("{} must be a one-element tensor, got {}", what, d.summary());
  return d.tensor.as_double(0) != 0;
}

// Requires an optional input (M, cond) to be a one-element tensor of dtype `dt` when present.
Status check_scalar_input(const InferCtx& c, size_t i, DType dt, const char* what) {
  if (!c.has_input(i) || !c.input_type(i).is_known()) return Status::ok();
  const Type& t = c.input_type(i);
  if (!t.is_tensor() || t.dtype != dt || (t.shape && t.shape->numel().is_static() && t.shape->numel().value() != 1)) {
    return c.error("{} must be a one-element {} tensor, got {}", what, dtype_name(dt), t.to_string());
  }
  return Status::ok();
}

// ---- If ------------------------------------------------------------------------------------

Status infer_if(InferCtx& c) {
  KILN_RETURN_IF_ERROR(check_scalar_input(c, 0, DType::kBool, "cond"));
  const Graph* then_g = c.node().attr_graph("then_branch");
  const Graph* else_g = c.node().attr_graph("else_branch");
  KILN_ASSIGN_OR_RETURN(std::vector<Type> then_t, c.infer_graph(*then_g, {}));
  KILN_ASSIGN_OR_RETURN(std::vector<Type> else_t, c.infer_graph(*else_g, {}));
  if (then_t.size() != c.num_outputs() || else_t.size() != c.num_outputs()) {
    return c.error("then_branch has {} outputs and else_branch {}, but the node has {}", then_t.size(), else_t.size(),
                   c.num_outputs());
  }
  // Either branch may run, so an output's type is what both branches agree on.
  for (size_t i = 0; i < c.num_outputs(); ++i) {
    Type j = join_types(then_t[i], else_t[i]);
    if (!j.is_known() && then_t[i].is_known() && else_t[i].is_known()) {
      return c.error("output {} is {} in then_branch but {} in else_branch", i, then_t[i].to_string(),
                     else_t[i].to_string());
    }
    c.set_output(i, std::move(j));
  }
  return Status::ok();
}

Status if_cpu(KernelCtx& c) {
  KILN_ASSIGN_OR_RETURN(bool cond, scalar_bool(c, c.input(0), "cond"));
  const Graph* branch = c.node().attr_graph(cond ? "then_branch" : "else_branch");
  KILN_ASSIGN_OR_RETURN(std::vector<Data> outs, c.run_graph(*branch, {}));
  if (outs.size() != c.num_outputs()) {
    return c.error("{} returned {} values, the node has {} outputs", cond ? "then_branch" : "else_branch", outs.size(),
                   c.num_outputs());
  }
  for (size_t i = 0; i < outs.size(); ++i) c.set_output(i, std::move(outs[i]));
  return Status::ok();
}

// ---- Loop ----------------------------------------------------------------------------------
// Inputs: M (trip count, optional), cond (optional), N loop-carried values.
// Body: (iteration_num, cond, carried...) -> (cond, carried..., K scan outputs).
// Outputs: N final carried values, then K scan outputs stacked along a new axis 0.

size_t loop_num_carried(size_t num_inputs) { return num_inputs > 2 ? num_inputs - 2 : 0; }

Status infer_loop(InferCtx& c) {
  KILN_RETURN_IF_ERROR(check_scalar_input(c, 0, DType::kInt64, "M (trip count)"));
  KILN_RETURN_IF_ERROR(check_scalar_input(c, 1, DType::kBool, "cond"));
  const Graph& body = *c.node().attr_graph("body");
  size_t n = loop_num_carried(c.num_inputs());
  if (body.inputs.size() != n + 2) {
    return c.error("body has {} inputs, expected {} (iteration_num, cond and {} loop-carried values)",
                   body.inputs.size(), n + 2, n);
  }
  if (c.num_outputs() < n || body.outputs.size() != 1 + c.num_outputs()) {
    return c.error("body has {} outputs and the node {}, expected the body to have 1 + node outputs and the node at "
                   "least {} (loop-carried) outputs", body.outputs.size(), c.num_outputs(), n);
  }
  std::vector<Type> carried;
  for (size_t i = 0; i < n; ++i) carried.push_back(c.input_type(2 + i));
  const std::vector<Type> fixed = {Type::tensor(DType::kInt64, Shape{}), Type::tensor(DType::kBool, Shape{})};
  KILN_ASSIGN_OR_RETURN(std::vector<Type> out, infer_body_fixpoint(c, body, fixed, carried, {}, 1));
  for (size_t i = 0; i < n; ++i) c.set_output(i, carried[i]);
  for (size_t k = n; k < c.num_outputs(); ++k) {
    const Type& t = out[1 + k];
    if (t.is_known() && !t.is_tensor()) return c.error("scan output {} of the body must be a tensor, got {}", k, t.to_string());
    if (t.is_tensor()) c.set_output(k, with_inserted_dim(t, 0, Dim()));  // trip count: unknown until run
  }
  return Status::ok();
}

Status loop_cpu(KernelCtx& c) {
  const Graph& body = *c.node().attr_graph("body");
  size_t n = loop_num_carried(c.num_inputs());
  size_t k_scan = c.num_outputs() - n;
  int64_t max_trips = std::numeric_limits<int64_t>::max();
  if (c.has_input(0)) {
    if (c.tensor(0).numel() != 1) return c.error("M (trip count) must have one element, got {}", c.tensor(0).summary());
    max_trips = c.tensor(0).as_int(0);
  }
  bool cond = true;
  if (c.has_input(1)) {
    KILN_ASSIGN_OR_RETURN(cond, scalar_bool(c, c.input(1), "cond"));
  }
  std::vector<Data> carried;
  for (size_t i = 0; i < n; ++i) carried.push_back(c.input(2 + i));
  std::vector<std::vector<Tensor>> scans(k_scan);
  for (int64_t it = 0; cond && it < max_trips; ++it) {
    std::vector<Data> in = {Data(Tensor::scalar<int64_t>(it)), Data(Tensor::scalar<bool>(cond))};
    in.insert(in.end(), carried.begin(), carried.end());
    KILN_ASSIGN_OR_RETURN(std::vector<Data> out, c.run_graph(body, std::move(in)));
    if (out.size() != 1 + n + k_scan) return c.error("body returned {} values, expected {}", out.size(), 1 + n + k_scan);
    KILN_ASSIGN_OR_RETURN(cond, scalar_bool(c, out[0], "the body's cond output"));
    for (size_t i = 0; i < n; ++i) carried[i] = std::move(out[1 + i]);
    for (size_t k = 0; k < k_scan; ++k) {
      if (!out[1 + n + k].is_tensor()) return c.error("scan output {} must be a tensor, got {}", k, out[1 + n + k].summary());
      scans[k].push_back(std::move(out[1 + n + k].tensor));
    }
  }
  for (size_t i = 0; i < n; ++i) c.set_output(i, std::move(carried[i]));
  for (size_t k = 0; k < k_scan; ++k) {
    if (!c.has_output(n + k)) continue;
    const Type& t = c.node().outputs[n + k]->type;
    KILN_ASSIGN_OR_RETURN(Tensor s, scans[k].empty() ? empty_of_type(c, t) : stack_axis(c, scans[k], 0));
    c.set_output(n + k, Data(std::move(s)));
  }
  return Status::ok();
}

// ---- Scan (opset 9+) -------------------------------------------------------------------------
// Inputs: N initial states, then num_scan_inputs tensors iterated along their scan axis.
// Body: (states..., one slice of each scan input) -> (states..., K per-iteration outputs).
// Outputs: N final states, then K scan outputs stacked along their output axis.

struct ScanLayout {
  size_t n_states = 0, n_scan_in = 0, n_scan_out = 0;
  std::vector<int64_t> in_axes, in_dirs, out_axes, out_dirs;  // raw attributes, padded with 0
};

Expected<ScanLayout> scan_layout(const Node& node, size_t num_inputs, size_t num_outputs) {
  ScanLayout l;
  int64_t m = node.attr_int("num_scan_inputs", 0);
  auto err = [&](const std::string& what) { return KILN_ERROR(kInvalidModel, "{}: {}", node.describe(), what); };
  if (m <= 0 || size_t(m) > num_inputs) {
    return err(fmt::format("num_scan_inputs must be in [1, {}] (the input count), got {}", num_inputs, m));
  }
  l.n_scan_in = size_t(m);
  l.n_states = num_inputs - l.n_scan_in;
  if (num_outputs < l.n_states) return err(fmt::format("has {} outputs, fewer than its {} states", num_outputs, l.n_states));
  l.n_scan_out = num_outputs - l.n_states;
  auto padded = [&](const char* name, size_t count) -> Expected<std::vector<int64_t>> {
    std::vector<int64_t> v = node.attr_ints(name);
    if (v.size() > count) return err(fmt::format("{} has {} entries, expected {}", name, v.size(), count));
    v.resize(count, 0);
    return v;
  };
  KILN_ASSIGN_OR_RETURN(l.in_axes, padded("scan_input_axes", l.n_scan_in));
  KILN_ASSIGN_OR_RETURN(l.in_dirs, padded("scan_input_directions", l.n_scan_in));
  KILN_ASSIGN_OR_RETURN(l.out_axes, padded("scan_output_axes", l.n_scan_out));
  KILN_ASSIGN_OR_RETURN(l.out_dirs, padded("scan_output_directions", l.n_scan_out));
  return l;
}

Status infer_scan(InferCtx& c) {
  const Graph& body = *c.node().attr_graph("body");
  KILN_ASSIGN_OR_RETURN(ScanLayout l, scan_layout(c.node(), c.num_inputs(), c.num_outputs()));
  if (body.inputs.size() != c.num_inputs() || body.outputs.size() != c.num_outputs()) {
    return c.error("body has {} inputs and {} outputs, expected {} and {} (as the node)", body.inputs.size(),
                   body.outputs.size(), c.num_inputs(), c.num_outputs());
  }
  std::vector<Type> states, slices;
  for (size_t i = 0; i < l.n_states; ++i) states.push_back(c.input_type(i));
  Dim seq_len;
  for (size_t j = 0; j < l.n_scan_in; ++j) {
    const Type& t = c.input_type(l.n_states + j);
    if (!t.has_rank()) { slices.push_back(t.is_tensor() ? Type::tensor(t.dtype) : Type()); continue; }
    KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_dim_axis(c, l.in_axes[j], int64_t(t.shape->rank())));
    Shape s = *t.shape;
    const Dim len = s[size_t(axis)];
    if (j == 0) seq_len = len;
    else if (!len.compatible(seq_len)) {
      return c.error("scan input {} has {} iterations along axis {} but scan input 0 has {}", j, len.to_string(), axis,
                     seq_len.to_string());
    }
    s.dims.erase(s.dims.begin() + axis);
    slices.push_back(Type::tensor(t.dtype, std::move(s)));
  }
  KILN_ASSIGN_OR_RETURN(std::vector<Type> out, infer_body_fixpoint(c, body, {}, states, slices, 0));
  for (size_t i = 0; i < l.n_states; ++i) c.set_output(i, states[i]);
  for (size_t k = 0; k < l.n_scan_out; ++k) {
    const Type& t = out[l.n_states + k];
    if (t.is_known() && !t.is_tensor()) return c.error("scan output {} of the body must be a tensor, got {}", k, t.to_string());
    if (!t.has_rank()) { c.set_output(l.n_states + k, t); continue; }
    KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(c, l.out_axes[k], int64_t(t.shape->rank()) + 1));
    c.set_output(l.n_states + k, with_inserted_dim(t, size_t(axis), seq_len));
  }
  return Status::ok();
}

// Checks the scan inputs and returns their normalized axes; `seq_len` gets the iteration count.
Expected<std::vector<size_t>> scan_input_axes(const KernelCtx& c, const ScanLayout& l, int64_t& seq_len) {
  std::vector<size_t> axes;
  for (size_t j = 0; j < l.n_scan_in; ++j) {
    const Tensor& x = c.tensor(l.n_states + j);
    if (x.rank() == 0) return c.error("scan input {} is a scalar; it needs an axis to iterate over", j);
    KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(c, l.in_axes[j], int64_t(x.rank())));
    if (j == 0) seq_len = x.dim(size_t(axis));
    if (x.dim(size_t(axis)) != seq_len) {
      return c.error("scan input {} ({}) has {} iterations along axis {}, scan input 0 has {}", j, x.summary(),
                     x.dim(size_t(axis)), axis, seq_len);
    }
    axes.push_back(size_t(axis));
  }
  return axes;
}

// Slice `index` of `x` along `axis`, with that axis removed.
Expected<Tensor> scan_slice(const Tensor& x, size_t axis, int64_t index) {
  KILN_ASSIGN_OR_RETURN(Tensor s, slice_axis(x, axis, index, 1));
  std::vector<int64_t> dims = x.dims();
  dims.erase(dims.begin() + std::ptrdiff_t(axis));
  return s.reshaped(dims);
}

Status scan_cpu(KernelCtx& c) {
  const Graph& body = *c.node().attr_graph("body");
  KILN_ASSIGN_OR_RETURN(ScanLayout l, scan_layout(c.node(), c.num_inputs(), c.num_outputs()));
  int64_t seq_len = 0;
  KILN_ASSIGN_OR_RETURN(std::vector<size_t> axes, scan_input_axes(c, l, seq_len));
  std::vector<Data> states;
  for (size_t i = 0; i < l.n_states; ++i) states.push_back(c.input(i));
  std::vector<std::vector<Tensor>> scans(l.n_scan_out);
  for (int64_t t = 0; t < seq_len; ++t) {
    std::vector<Data> in = states;
    for (size_t j = 0; j < l.n_scan_in; ++j) {
      int64_t index = l.in_dirs[j] != 0 ? seq_len - 1 - t : t;
      KILN_ASSIGN_OR_RETURN(Tensor s, scan_slice(c.tensor(l.n_states + j), axes[j], index));
      in.push_back(Data(std::move(s)));
    }
    KILN_ASSIGN_OR_RETURN(std::vector<Data> out, c.run_graph(body, std::move(in)));
    if (out.size() != c.num_outputs()) return c.error("body returned {} values, expected {}", out.size(), c.num_outputs());
    for (size_t i = 0; i < l.n_states; ++i) states[i] = std::move(out[i]);
    for (size_t k = 0; k < l.n_scan_out; ++k) {
      Data& d = out[l.n_states + k];
      if (!d.is_tensor()) return c.error("scan output {} must be a tensor, got {}", k, d.summary());
      scans[k].push_back(std::move(d.tensor));
    }
  }
  for (size_t i = 0; i < l.n_states; ++i) c.set_output(i, std::move(states[i]));
  for (size_t k = 0; k < l.n_scan_out; ++k) {
    size_t o = l.n_states + k;
    if (!c.has_output(o)) continue;
    if (scans[k].empty()) {
      KILN_ASSIGN_OR_RETURN(Tensor e, empty_of_type(c, c.node().outputs[o]->type));
      c.set_output(o, Data(std::move(e)));
      continue;
    }
    if (l.out_dirs[k] != 0) std::reverse(scans[k].begin(), scans[k].end());
    KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(c, l.out_axes[k], int64_t(scans[k][0].rank()) + 1));
    KILN_ASSIGN_OR_RETURN(Tensor s, stack_axis(c, scans[k], size_t(axis)));
    c.set_output(o, Data(std::move(s)));
  }
  return Status::ok();
}

}  // namespace

void register_control_ops(OpRegistry& r) {
  r.def(OpKind::kIf, {.inputs = {1, 1}, .outputs = {1, kVariadic},
                      .attrs = {{"then_branch", kGraphAttr, true}, {"else_branch", kGraphAttr, true}},
                      .infer = infer_if, .cpu = if_cpu});
  r.def(OpKind::kLoop, {.inputs = {0, kVariadic}, .outputs = {0, kVariadic}, .attrs = {{"body", kGraphAttr, true}},
                        .infer = infer_loop, .cpu = loop_cpu});
  r.def(OpKind::kScan, {.inputs = {1, kVariadic}, .outputs = {1, kVariadic},
                        .attrs = {{"body", kGraphAttr, true}, {"num_scan_inputs", kIntAttr, true},
                                  {"scan_input_axes", kIntsAttr}, {"scan_input_directions", kIntsAttr},
                                  {"scan_output_axes", kIntsAttr}, {"scan_output_directions", kIntsAttr}},
                        .infer = infer_scan, .cpu = scan_cpu});
  register_control_sequence_ops(r);
}

}  // namespace kiln
