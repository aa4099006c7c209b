// merge-sibling-matmuls: MatMuls that read the same input with constant weights of the same K
// (a transformer's Q, K and V projections) become one MatMul over the concatenated weights, its
// bias Adds one Add, and a Split hands each former output its columns. One GEMM of N = 3E fills
// the GPU better than three of N = E (at batch 1 they are three launches of a few microseconds),
// and backends that read Q/K/V through views of the Split (the CUDA attention kernel) copy nothing.
//
//   Before:  %q = MatMul(%x, %wq) : f32[B,S,64]     %qb = Add(%q, %bq) : f32[B,S,64]
//            %k = MatMul(%x, %wk) : f32[B,S,64]     %kb = Add(%k, %bk) : f32[B,S,64]
//   After:   %m = MatMul(%x, %wqk) : f32[B,S,128]   (%wqk = [%wq | %wk], columns side by side)
//            %mb = Add(%m, %bqk) : f32[B,S,128]
//            %qb, %kb = Split(%mb, [64, 64]) {axis = -1}
//
// Preconditions, all checked: every member reads the same A; its weight is a 2-D constant [K, Ni]
// with one K and one dtype across the group; either every member's output feeds exactly one Add
// of a per-column constant bias (merged too) or none has a bias. A member's output that is a graph
// output keeps its name (the Split output takes it over). Run before fuse-matmul-add (which would turn 2-D members into Gemms first) and after
// fold-constants and cse (weights must be constants, and a shared A must be one value). With a
// DerivedConstants memo (a dynamic engine's shape plans), the concatenated weights are made once.
#include <algorithm>
#include <cstring>
#include <map>

#include "passes/derived_constants.h"
#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln {

namespace {

struct Member {
  Node* mm;
  const Tensor* w;
  Node* add = nullptr;       // the bias Add, when the group has biases
  const Tensor* b = nullptr;
  Value* out = nullptr;      // what the rest of the graph reads: the Add's output, else the MatMul's
};

// The bias of the Add reading m alone, when it is a per-column constant of n elements.
const Tensor* sole_bias(const Graph& g, const UseMap& uses, const Value* m, int64_t n, Node** add_out) {
  if (uses.num_uses(m) != 1 || uses.is_output(m) || !uses.uses(m)[0].node) return nullptr;
  Node* add = uses.uses(m)[0].node;
  if (add->op != OpKind::kAdd || add->owner != &g || add->inputs.size() != 2 || !add->has_output(0)) return nullptr;
  const Value* b = add->inputs[0] == m ? add->inputs[1] : add->inputs[0];
  const Tensor* t = b != m ? constant_of(g, b) : nullptr;
  if (!t || t->dtype() != m->type.dtype || t->numel() != n || t->rank() < 1 || t->dims().back() != n) return nullptr;
  if (!(add->outputs[0]->type == m->type)) return nullptr;
  *add_out = add;
  return t;
}

// Concatenates [K, Ni] matrices (or [Ni] vectors when k == 1) along the columns.
Expected<Tensor> concat_columns(const std::vector<const Tensor*>& parts, int64_t k, std::vector<int64_t> dims) {
  KILN_ASSIGN_OR_RETURN(Tensor out, Tensor::create(parts[0]->dtype(), std::move(dims)));
  size_t eb = dtype_size(parts[0]->dtype()), row = size_t(out.numel() / k) * eb, at = 0;
  for (const Tensor* p : parts) {
    size_t cols = size_t(p->numel() / k) * eb;
    for (int64_t r = 0; r < k; ++r) {
      std::memcpy(static_cast<char*>(out.raw()) + size_t(r) * row + at,
                  static_cast<const char*>(p->raw()) + size_t(r) * cols, cols);
    }
    at += cols;
  }
  return out;
}

// concat_columns, made once per memo when there is one.
Expected<Tensor> concat_columns(DerivedConstants* memo, const std::vector<const Tensor*>& parts, int64_t k,
                                std::vector<int64_t> dims) {
  auto make = [&]() { return concat_columns(parts, k, dims); };
  if (!memo) return make();
  return memo->get(fmt::format("concat-columns k={}", k), parts, make);
}

// Replaces the group by one MatMul (+ Add) and a Split; returns the nodes left unread.
Status merge(Graph& g, UseMap& uses, const std::vector<Member>& grp, std::vector<Node*>& dead, DerivedConstants* memo) {
  const Member& first = grp[0];
  int64_t k = first.w->dim(0), total = 0;
  std::vector<int64_t> sizes;
  std::vector<const Tensor*> ws, bs;
  for (const Member& m : grp) {
    sizes.push_back(m.w->dim(1));
    total += m.w->dim(1);
    ws.push_back(m.w);
    bs.push_back(m.b);
  }
  KILN_ASSIGN_OR_RETURN(Tensor wcat, concat_columns(memo, ws, k, {k, total}));
  Value* w = g.add_constant(g.unique_name(first.mm->inputs[1]->name + "_merged"), std::move(wcat));
  Type wide = first.mm->outputs[0]->type;
  wide.shape->dims.back() = Dim(total);
  Node* mm = g.add_node(OpKind::kMatMul, {first.mm->inputs[0], w}, 1, g.unique_name(first.mm->name + "_merged"));
  mm->outputs[0]->type = wide;
  Value* y = mm->outputs[0];
  uses.add_node(mm);
  if (first.add) {
    KILN_ASSIGN_OR_RETURN(Tensor bcat, concat_columns(memo, bs, 1, {total}));
    Value* b = g.add_constant(g.unique_name(first.mm->inputs[1]->name + "_bias_merged"), std::move(bcat));
    Node* add = g.add_node(OpKind::kAdd, {y, b}, 1, g.unique_name(first.add->name + "_merged"));
    add->outputs[0]->type = wide;
    y = add->outputs[0];
    uses.add_node(add);
  }
  KILN_ASSIGN_OR_RETURN(Tensor split_t, Tensor::create(DType::kInt64, {int64_t(sizes.size())}));
  std::copy(sizes.begin(), sizes.end(), split_t.data<int64_t>());
  Value* split_v = g.add_constant(g.unique_name(first.mm->name + "_split"), std::move(split_t));
  Node* split = g.add_node(OpKind::kSplit, {y, split_v}, int(grp.size()), g.unique_name(first.mm->name + "_split"));
  split->attrs["axis"] = Attribute::of_int(-1);
  for (size_t i = 0; i < grp.size(); ++i) split->outputs[i]->type = grp[i].out->type;
  uses.add_node(split);
  for (size_t i = 0; i < grp.size(); ++i) {
    uses.forward(grp[i].out, split->outputs[i]);
    g.note_absorbed(*grp[i].mm, *mm);
    dead.push_back(grp[i].mm);
    if (grp[i].add) {
      g.note_absorbed(*grp[i].add, *y->producer);
      dead.push_back(grp[i].add);
    }
  }
  return Status::ok();
}

}  // namespace

Expected<bool> merge_sibling_matmuls(Graph& g, DerivedConstants* memo) {
  UseMap uses(g);
  // Groups keyed by (A, K, dtype, has bias), in graph order.
  std::map<std::tuple<const Value*, int64_t, int, bool>, std::vector<Member>> groups;
  std::vector<std::tuple<const Value*, int64_t, int, bool>> order;
  for (const auto& np : g.nodes) {
    Node* mm = np.get();
    if (mm->op != OpKind::kMatMul || !mm->has_output(0) || !mm->has_input(0) || !mm->has_input(1)) continue;
    const Value* m = mm->outputs[0];
    const Tensor* w = constant_of(g, mm->inputs[1]);
    if (!w || w->rank() != 2 || !m->type.has_rank() || m->type.shape->dims.size() < 2 || !is_float(m->type.dtype) ||
        w->dtype() != m->type.dtype) {
      continue;
    }
    Member mem{mm, w};
    mem.b = sole_bias(g, uses, m, w->dim(1), &mem.add);
    mem.out = mem.add ? mem.add->outputs[0] : mm->outputs[0];
    auto key = std::make_tuple(mm->inputs[0], w->dim(0), int(w->dtype()), mem.add != nullptr);
    if (!groups.count(key)) order.push_back(key);
    groups[key].push_back(mem);
  }
  std::vector<Node*> dead;
  for (const auto& key : order) {
    const std::vector<Member>& grp = groups[key];
    if (grp.size() < 2) continue;
    KILN_RETURN_IF_ERROR(merge(g, uses, grp, dead, memo));
  }
  if (dead.empty()) return false;
  erase_unused(uses, dead);
  KILN_RETURN_IF_ERROR(g.topo_sort());
  return true;
}

}  // namespace kiln
