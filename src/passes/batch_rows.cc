// check_rows_independent (batch_rows.h): the batch axis followed through the graph, node by node in
// order. A value either carries the batch (on one axis, whose indices group by batch row: the axis's
// size is a multiple of B and each index belongs to one row) or is the same for every row.
#include "passes/batch_rows.h"

#include <cstring>
#include <map>

#include "passes/rewrite.h"

namespace kiln {

namespace {

std::vector<int64_t> dims_of(const Value* v) {
  auto d = v ? static_dims(v) : std::nullopt;
  return d ? *d : std::vector<int64_t>{};
}

int64_t norm_axis(int64_t a, size_t rank) { return a < 0 ? a + int64_t(rank) : a; }

int64_t product(const std::vector<int64_t>& d, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to && i < d.size(); ++i) p *= d[i];
  return p;
}

// Whether every slice of a constant along `axis` holds the same bytes (a value broadcast along the
// batch axis that is the same for each row).
bool rows_equal(const Tensor& t, size_t axis) {
  if (t.dtype() == DType::kString || axis >= t.rank()) return false;
  const int64_t n = t.dim(axis);
  const size_t outer = size_t(product(t.dims(), 0, axis));
  const size_t row = size_t(product(t.dims(), axis + 1, t.rank())) * dtype_size(t.dtype());
  const auto* p = static_cast<const char*>(t.raw());
  for (size_t o = 0; o < outer; ++o) {
    const char* block = p + o * size_t(n) * row;
    for (int64_t i = 1; i < n; ++i) {
      if (std::memcmp(block, block + size_t(i) * row, row) != 0) return false;
    }
  }
  return true;
}

class Rows {
 public:
  Rows(const Graph& g, int64_t b) : g_(g), b_(b) {}

  void carry(const Value* v, int64_t axis) { axis_[v] = axis; }
  int64_t axis(const Value* v) const {
    auto it = v ? axis_.find(v) : axis_.end();
    return it == axis_.end() ? -1 : it->second;
  }

  Status visit(const Node& n) {
    bool any = false;
    for (const Value* v : n.inputs) any = any || axis(v) >= 0;
    if (!any) return Status::ok();  // the same for every row: so are its results
    if (has_subgraph(n)) return fail(n, "runs a subgraph on batched values");
    if (is_random_op(n.op)) return fail(n, "draws random numbers, the same for each micro-batch");
    if (n.op == OpKind::kDropout && n.has_input(2)) {
      const Tensor* t = constant_of(g_, n.inputs[2]);
      if (!t || t->numel() != 1 || t->as_int(0) != 0) return fail(n, "may run in training mode (a random mask)");
    }
    if (n.op == OpKind::kMaxPool && n.outputs.size() > 1 && n.outputs[1]) {
      return fail(n, "gives indices into the whole batch");
    }
    switch (n.op) {
      case OpKind::kSoftmax: case OpKind::kLogSoftmax: case OpKind::kHardmax:
        return along(n, norm_axis(n.attr_int("axis", -1), rank(n)), false);
      case OpKind::kLayerNormalization: case OpKind::kRMSNormalization:
        return along(n, norm_axis(n.attr_int("axis", -1), rank(n)), true);
      case OpKind::kArgMax: case OpKind::kArgMin: case OpKind::kTopK:
        return reduce(n, {norm_axis(n.attr_int("axis", n.op == OpKind::kTopK ? -1 : 0), rank(n))},
                      n.op == OpKind::kTopK || n.attr_int("keepdims", 1));
      case OpKind::kCumSum: {
        auto ax = ints(n, 1);
        if (!ax || ax->size() != 1) return fail(n, "has an axis that is not a constant");
        return along(n, norm_axis((*ax)[0], rank(n)), false);
      }
      case OpKind::kReduceSum: case OpKind::kReduceMean: case OpKind::kReduceMax: case OpKind::kReduceMin:
      case OpKind::kReduceProd: case OpKind::kReduceL1: case OpKind::kReduceL2: case OpKind::kReduceLogSum:
      case OpKind::kReduceLogSumExp: case OpKind::kReduceSumSquare: {
        auto ax = n.has_input(1) ? ints(n, 1) : std::optional<std::vector<int64_t>>(n.attr_ints("axes"));
        if (!ax || ax->empty()) return fail(n, "reduces every axis");
        std::vector<int64_t> axes;
        for (int64_t x : *ax) axes.push_back(norm_axis(x, rank(n)));
        return reduce(n, axes, n.attr_int("keepdims", 1));
      }
      case OpKind::kConv: case OpKind::kConvTranspose: case OpKind::kMaxPool: case OpKind::kAveragePool:
      case OpKind::kLpPool: case OpKind::kGlobalAveragePool: case OpKind::kGlobalMaxPool: case OpKind::kGlobalLpPool:
      case OpKind::kGroupNormalization: case OpKind::kInstanceNormalization: case OpKind::kLRN:
      case OpKind::kDepthToSpace: case OpKind::kSpaceToDepth: case OpKind::kResize:
        return per_sample(n);
      case OpKind::kBatchNormalization:
        if (n.attr_int("training_mode", 0)) return fail(n, "computes statistics over the batch");
        return per_sample(n);
      case OpKind::kMatMul: return matmul(n);
      case OpKind::kGemm: return gemm(n);
      case OpKind::kReshape: case OpKind::kFlatten: case OpKind::kSqueeze: case OpKind::kUnsqueeze:
        return reshape(n);
      case OpKind::kTranspose: {
        const size_t r = rank(n);
        std::vector<int64_t> perm = n.attr_ints("perm");
        if (perm.empty()) {
          for (size_t i = 0; i < r; ++i) perm.push_back(int64_t(r - 1 - i));
        }
        if (perm.size() != r) return fail(n, "has a malformed permutation");
        const int64_t a = axis(n.inputs[0]);
        return set(n, 0, std::find(perm.begin(), perm.end(), a) - perm.begin());
      }
      case OpKind::kConcat: return concat(n);
      case OpKind::kSplit: return along(n, norm_axis(n.attr_int("axis", 0), rank(n)), false);
      case OpKind::kSlice: return slice(n);
      case OpKind::kGather: return gather(n);
      case OpKind::kExpand: case OpKind::kTile: case OpKind::kPad: return resized(n);
      case OpKind::kTrilu:
        if (axis(n.inputs[0]) >= int64_t(rank(n)) - 2) return fail(n, "takes a triangle across the batch axis");
        return set(n, 0, axis(n.inputs[0]));
      default:
        if (is_elementwise(n.op) || n.op == OpKind::kPRelu || n.op == OpKind::kCastLike) return elementwise(n);
        return fail(n, fmt::format("is a {} of batched values, which micro-batching does not split", op_name(n.op)));
    }
  }

  Status output(const Value* v) const {
    if (axis(v) != 0) {
      return KILN_ERROR(kUnsupported, "output '{}' does not carry the batch on its axis 0", v->name);
    }
    return Status::ok();
  }

 private:
  static Status fail(const Node& n, const std::string& why) {
    return KILN_ERROR(kUnsupported, "{} {}", n.describe(), why);
  }
  static size_t rank(const Node& n) { return dims_of(n.inputs[0]).size(); }

  std::optional<std::vector<int64_t>> ints(const Node& n, size_t i) const {
    const Tensor* t = n.has_input(i) ? constant_of(g_, n.inputs[i]) : nullptr;
    if (!t || (t->dtype() != DType::kInt64 && t->dtype() != DType::kInt32)) return std::nullopt;
    return t->to_int_vector();
  }

  // Every output of the input's rank carries the batch on `a`.
  Status set(const Node& n, size_t ref_input, int64_t a) {
    const size_t r = dims_of(n.inputs[ref_input]).size();
    if (a < 0) return fail(n, "loses the batch axis");
    for (const Value* o : n.outputs) {
      if (o && dims_of(o).size() == r) carry(o, a);
    }
    return Status::ok();
  }

  // A value the same for every row, read where the batch is on `out_axis` of an output of rank
  // `out_rank` (numpy broadcasting): fine when its dim there is 1 or absent, or it is a constant
  // whose rows along it are equal.
  Status broadcast(const Node& n, const Value* v, int64_t out_axis, size_t out_rank) const {
    const std::vector<int64_t> d = dims_of(v);
    const int64_t p = out_axis - (int64_t(out_rank) - int64_t(d.size()));
    if (p < 0 || d[size_t(p)] == 1) return Status::ok();
    const Tensor* t = constant_of(g_, v);
    if (t && rows_equal(*t, size_t(p))) return Status::ok();
    return fail(n, fmt::format("reads '{}', which differs along the batch axis without carrying the batch", v->name));
  }

  Status elementwise(const Node& n) {
    const size_t ro = dims_of(n.outputs[0]).size();
    int64_t oa = -1;
    for (const Value* v : n.inputs) {
      if (axis(v) < 0) continue;
      const int64_t m = axis(v) + int64_t(ro) - int64_t(dims_of(v).size());
      if (oa >= 0 && m != oa) return fail(n, "reads operands batched on different axes");
      oa = m;
    }
    for (const Value* v : n.inputs) {
      if (v && axis(v) < 0) KILN_RETURN_IF_ERROR(broadcast(n, v, oa, ro));
    }
    for (const Value* o : n.outputs) {
      if (o && dims_of(o).size() == ro) carry(o, oa);
    }
    return Status::ok();
  }

  // An op over `over` of input 0 (and, `trailing`, every axis after it), its other inputs the same
  // for every row (scales, biases): fine while the batch is elsewhere.
  Status along(const Node& n, int64_t over, bool trailing) {
    const int64_t a = axis(n.inputs[0]);
    for (size_t i = 1; i < n.inputs.size(); ++i) {
      if (axis(n.inputs[i]) >= 0) return fail(n, "reads a batched parameter");
    }
    if (a < 0) return fail(n, "reads a batched parameter");
    if (a == over || (trailing && a > over)) return fail(n, "works across the batch axis");
    return set(n, 0, a);
  }

  Status reduce(const Node& n, const std::vector<int64_t>& axes, bool keep) {
    int64_t a = axis(n.inputs[0]), below = 0;
    for (size_t i = 1; i < n.inputs.size(); ++i) {
      if (axis(n.inputs[i]) >= 0) return fail(n, "reads a batched parameter");
    }
    for (int64_t x : axes) {
      if (x == a) return fail(n, "reduces over the batch axis");
      below += x < a;
    }
    if (!keep) a -= below;
    for (const Value* o : n.outputs) {
      if (o) carry(o, a);
    }
    return Status::ok();
  }

  // Convolutions, pooling, per-sample normalizations: the batch is axis 0 of input 0; weights,
  // scales and sizes the same for every row; the output keeps axis 0's size.
  Status per_sample(const Node& n) {
    if (axis(n.inputs[0]) != 0) return fail(n, "reads the batch on an axis other than 0");
    for (size_t i = 1; i < n.inputs.size(); ++i) {
      if (axis(n.inputs[i]) >= 0) return fail(n, "reads a batched parameter");
    }
    if (dims_of(n.outputs[0]).empty() || dims_of(n.outputs[0])[0] != dims_of(n.inputs[0])[0]) {
      return fail(n, "resizes the batch axis");
    }
    return set(n, 0, 0);
  }

  Status matmul(const Node& n) {
    const Value *A = n.inputs[0], *B = n.inputs[1];
    const std::vector<int64_t> da = dims_of(A), db = dims_of(B);
    const size_t ro = dims_of(n.outputs[0]).size();
    const int64_t ra = int64_t(da.size()), rb = int64_t(db.size());
    const int64_t aa = axis(A), ab = axis(B);
    if (ra < 2 || rb < 2) return fail(n, "is a vector product of batched values");
    if (aa == ra - 1 || ab == rb - 2) return fail(n, "contracts over the batch axis");
    if (aa == ra - 2) {  // the batch is in A's rows
      if (ab >= 0) return fail(n, "multiplies batched rows by a batched matrix");
      carry(n.outputs[0], int64_t(ro) - 2);
      return Status::ok();
    }
    if (ab == rb - 1) {  // in B's columns
      if (aa >= 0) return fail(n, "multiplies a batched matrix by batched columns");
      carry(n.outputs[0], int64_t(ro) - 1);
      return Status::ok();
    }
    // In the stacked (broadcast) dims of one or both.
    const int64_t m = aa >= 0 ? aa + int64_t(ro) - ra : ab + int64_t(ro) - rb;
    if (aa >= 0 && ab >= 0 && ab + int64_t(ro) - rb != m) return fail(n, "reads operands batched on different axes");
    if (aa < 0 && m - (int64_t(ro) - ra) >= ra - 2) return fail(n, "broadcasts the batch into a matrix axis");
    if (ab < 0 && m - (int64_t(ro) - rb) >= rb - 2) return fail(n, "broadcasts the batch into a matrix axis");
    if (aa < 0) KILN_RETURN_IF_ERROR(broadcast(n, A, m, ro));
    if (ab < 0) KILN_RETURN_IF_ERROR(broadcast(n, B, m, ro));
    carry(n.outputs[0], m);
    return Status::ok();
  }

  Status gemm(const Node& n) {
    const int64_t a = axis(n.inputs[0]);
    if (axis(n.inputs[1]) >= 0 || (n.has_input(2) && axis(n.inputs[2]) >= 0)) return fail(n, "reads a batched B or C");
    if (a != (n.attr_int("transA", 0) ? 1 : 0)) return fail(n, "contracts over the batch axis");
    if (n.has_input(2)) KILN_RETURN_IF_ERROR(broadcast(n, n.inputs[2], 0, 2));
    carry(n.outputs[0], 0);
    return Status::ok();
  }

  // The batch axis's indices stay grouped by row when the output axis starting at the same element
  // (the same product of dims before it) has a size that is a multiple of B.
  Status reshape(const Node& n) {
    const std::vector<int64_t> id = dims_of(n.inputs[0]), od = dims_of(n.outputs[0]);
    const int64_t a = axis(n.inputs[0]);
    if (a < 0) return fail(n, "reshapes by a batched shape");
    if (id.empty() || od.empty()) return fail(n, "has a dynamic shape");
    const int64_t before = product(id, 0, size_t(a));
    int64_t prod = 1;
    size_t o = 0;
    while (o < od.size() && prod < before) prod *= od[o++];
    while (o < od.size() && od[o] == 1) ++o;
    if (prod != before || o == od.size() || od[o] % b_ != 0) {
      return fail(n, "splits the batch axis or merges it with an outer one");
    }
    carry(n.outputs[0], int64_t(o));
    return Status::ok();
  }

  Status concat(const Node& n) {
    const size_t r = dims_of(n.outputs[0]).size();
    const int64_t over = norm_axis(n.attr_int("axis", 0), r);
    int64_t a = -1;
    for (const Value* v : n.inputs) {
      if (axis(v) < 0) continue;
      if (a >= 0 && axis(v) != a) return fail(n, "reads operands batched on different axes");
      a = axis(v);
    }
    if (a == over) return fail(n, "concatenates along the batch axis");
    for (const Value* v : n.inputs) {
      if (v && axis(v) < 0) KILN_RETURN_IF_ERROR(broadcast(n, v, a, r));
    }
    carry(n.outputs[0], a);
    return Status::ok();
  }

  Status slice(const Node& n) {
    const int64_t a = axis(n.inputs[0]);
    for (size_t i = 1; i < n.inputs.size(); ++i) {
      if (axis(n.inputs[i]) >= 0) return fail(n, "slices by batched bounds");
    }
    const size_t r = rank(n);
    auto axes = n.has_input(3) ? ints(n, 3) : std::optional<std::vector<int64_t>>(std::vector<int64_t>{});
    auto steps = n.has_input(4) ? ints(n, 4) : std::optional<std::vector<int64_t>>(std::vector<int64_t>{});
    auto starts = ints(n, 1);
    if (!axes || !steps || !starts) return fail(n, "has bounds that are not constants");
    if (axes->empty()) {
      for (size_t i = 0; i < starts->size(); ++i) axes->push_back(int64_t(i));
    }
    for (size_t i = 0; i < axes->size(); ++i) {
      if (norm_axis((*axes)[i], r) != a) continue;
      const bool whole = dims_of(n.outputs[0])[size_t(a)] == dims_of(n.inputs[0])[size_t(a)] &&
                         (i >= steps->size() || (*steps)[i] == 1);
      if (!whole) return fail(n, "slices the batch axis");
    }
    return set(n, 0, a);
  }

  Status gather(const Node& n) {
    const size_t r = rank(n);
    const int64_t over = norm_axis(n.attr_int("axis", 0), r);
    const int64_t a = axis(n.inputs[0]), ia = axis(n.inputs[1]);
    const int64_t ri = int64_t(dims_of(n.inputs[1]).size());
    if (a >= 0 && ia >= 0) return fail(n, "gathers batched values by batched indices");
    if (a == over) return fail(n, "gathers along the batch axis");
    carry(n.outputs[0], a >= 0 ? (a < over ? a : a + ri - 1) : over + ia);
    return Status::ok();
  }

  // Expand, Tile, Pad: the batched input keeps the batch axis at its size.
  Status resized(const Node& n) {
    const int64_t a = axis(n.inputs[0]);
    for (size_t i = 1; i < n.inputs.size(); ++i) {
      if (axis(n.inputs[i]) >= 0) return fail(n, "is shaped by batched values");
    }
    const std::vector<int64_t> id = dims_of(n.inputs[0]), od = dims_of(n.outputs[0]);
    const int64_t oa = a + int64_t(od.size()) - int64_t(id.size());
    if (a < 0 || oa < 0 || od[size_t(oa)] != id[size_t(a)]) return fail(n, "resizes the batch axis");
    if (n.op == OpKind::kPad) {  // a pad before the batch axis's start and a cut after it keep its size
      auto pads = ints(n, 1);
      if (!pads || n.has_input(3) || pads->size() != 2 * id.size() || (*pads)[size_t(a)] != 0) {
        return fail(n, "pads the batch axis");
      }
    }
    carry(n.outputs[0], oa);
    return Status::ok();
  }

  const Graph& g_;
  int64_t b_;
  std::map<const Value*, int64_t> axis_;
};

}  // namespace

Status check_rows_independent(const Graph& g, const std::vector<bool>& batched, std::map<std::string, int64_t>* axes) {
  if (batched.size() != g.inputs.size()) return KILN_ERROR(kInternal, "{} batch flags for {} inputs", batched.size(), g.inputs.size());
  int64_t b = 0;
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    if (!batched[i]) continue;
    const std::vector<int64_t> d = dims_of(g.inputs[i]);
    if (d.empty() || d[0] < 2 || (b && d[0] != b)) {
      return KILN_ERROR(kUnsupported, "input '{}' has no batch axis of the others' size (2 or more rows)", g.inputs[i]->name);
    }
    b = d[0];
  }
  if (!b) return KILN_ERROR(kUnsupported, "no input carries a batch");
  Rows rows(g, b);
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    if (batched[i]) rows.carry(g.inputs[i], 0);
  }
  for (const auto& n : g.nodes) KILN_RETURN_IF_ERROR(rows.visit(*n));
  for (const Value* v : g.outputs) KILN_RETURN_IF_ERROR(rows.output(v));
  if (axes) {
    for (const auto& v : g.values) axes->emplace(v->name, rows.axis(v.get()));
  }
  return Status::ok();
}

Status check_micro_shapes(const Graph& whole, const Graph& micro, const std::map<std::string, int64_t>& axes, int64_t m) {
  for (const auto& v : micro.values) {
    auto it = axes.find(v->name);
    const Value* w = it == axes.end() ? nullptr : whole.lookup(v->name);
    // Constants the analysis read as the same for every row (a folded mask) may be sized by the batch.
    if (!w || w->constant || v->constant) continue;
    const std::vector<int64_t> dw = dims_of(w), dm = dims_of(v.get());
    if (dw.empty() && dm.empty()) continue;
    bool ok = dw.size() == dm.size();
    for (size_t i = 0; ok && i < dw.size(); ++i) {
      ok = int64_t(i) == it->second ? dw[i] == dm[i] * m : dw[i] == dm[i];
    }
    if (!ok) {
      return KILN_ERROR(kUnsupported, "'{}' is {} in a micro-batch but {} in the whole batch: a shape in the model does "
                        "not follow the batch", v->name, dims_to_string(dm), dims_to_string(dw));
    }
  }
  return Status::ok();
}

}  // namespace kiln
