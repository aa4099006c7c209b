// tensor-parallel: rank r's share of a model split over n ranks, Megatron style (Shoeybi et al.,
// 2019): a product with a constant weight whose input every rank holds whole splits its weight by
// columns (each rank computes some output features); the split then travels through the ops that
// act on each feature on its own (bias, activation, reshapes into heads, attention per head,
// elementwise products such as SwiGLU's) until a product with a constant weight contracts over it,
// whose weight splits by rows: each rank holds a partial sum, and one AllReduce makes it whole. A
// large embedding table splits by rows (the vocabulary): each rank looks up the ids it holds,
// zeros elsewhere, and an AllReduce sums them. A result that leaves the model split (a language
// model's logits over the vocabulary) is gathered at the output.
//
//   Before (one MLP):                         After, rank r of 2:
//   %h = MatMul(%x, %w1) : f32[B,S,3072]     %h = MatMul(%x, %w1_r) : f32[B,S,1536]   (columns)
//   %a = Gelu(%h)                            %a = Gelu(%h)
//   %y = MatMul(%a, %w2) : f32[B,S,768]      %p = MatMul(%a, %w2_r) : f32[B,S,768]    (rows)
//   %z = Add(%y, %b2)                        %q = Add(%p, %b2 on rank 0, zeros elsewhere)
//                                            %z = ai.kiln.AllReduce(%q) {ranks = 2}
//
// Which products split is decided by following each candidate's split forward (a group of
// candidates whose splits meet, as Q, K and V meet in attention, decides together): a group is
// kept split only when every path ends in a row-split product, or at a model output and the
// group's weights are a large share of the model's (an LM head); anything else (an op that needs
// the whole axis, a reshape that would cut across heads, heads that do not divide by n, a split
// read inside an If/Loop body) keeps the whole group whole on every rank, and the report names the
// node and why. Fused Q/K/V weights (one product followed by a Split, as GPT-2 exports) split
// each of the parts by n, so each rank gets its heads of Q, K and V.
//
// Preconditions: static shapes, folded constants (Reshape/Expand targets and Split sizes are
// constants), before the fusions, which then see an ordinary, smaller graph. Any n works where
// the sizes divide; the vocabulary of a split LM head is padded with zero columns to a multiple
// of n, and of an embedding table split unevenly (the last rank holds fewer rows).
#include "passes/tensor_parallel.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "ops/infer.h"
#include "passes/rewrite.h"

namespace kiln {

namespace {

// A large share of the weights: an LM head or embedding table worth splitting even though its
// result must be gathered (or summed) afterwards. Small heads (a classifier) stay whole.
constexpr double kLargeShare = 0.02;
// A gathered output is moved about this many times (the collective, the copy that puts the ranks'
// parts in place, the copy that cuts padding): split a product whose result is gathered only when
// its weight outweighs that.
constexpr size_t kGatherCost = 4;

// How a value is held across ranks: whole on each, or split along `axis`, whose segments (whole
// sizes, adding up to the axis's size) each split n ways, rank r holding the r-th part of each.
struct Split {
  int64_t axis = -1;
  std::vector<int64_t> segs;
  int comp = -1;      // the group of column-split products it comes from
  int64_t whole = 0;  // the axis's true size; less than segs[0] when padded to a multiple of n
  bool split() const { return axis >= 0; }
  bool padded() const { return split() && segs.size() == 1 && segs[0] != whole; }
  bool same_as(const Split& o) const { return axis == o.axis && segs == o.segs && whole == o.whole; }
};

// What the rewrite does at one node.
struct NodePlan {
  struct Slice {
    size_t input;
    int64_t axis;
    std::vector<int64_t> segs;
  };
  std::vector<Slice> slices;            // constant inputs replaced by this rank's slice
  bool column = false, row = false, vocab = false;
  int64_t local_axis = -1;              // Reshape/Expand: target = output dims, this axis / n
  bool split_sizes = false;             // Split along the split axis: sizes / n
  size_t zero_input = SIZE_MAX;         // a row product's bias (Gemm C): zeros on ranks other than 0
  Node* bias_add = nullptr;             // a row MatMul's bias Add: its constant is zeros off rank 0
  size_t bias_input = 0;
  Node* residual_add = nullptr;         // the residual Add after it: an Identity off rank 0
  size_t residual_input = 0;
  Value* reduce_after = nullptr;        // the AllReduce goes after this value
};

std::vector<int64_t> dims_of(const Value* v) {
  auto d = static_dims(v);
  return d ? *d : std::vector<int64_t>{};
}

int64_t norm_axis(int64_t a, size_t rank) { return a < 0 ? a + int64_t(rank) : a; }

// The entries of an integer constant (axes, sizes, steps); nullopt for a missing one or another dtype.
std::optional<std::vector<int64_t>> ints_of(const Tensor* t) {
  if (!t || (t->dtype() != DType::kInt64 && t->dtype() != DType::kInt32)) return std::nullopt;
  std::vector<int64_t> v;
  for (int64_t i = 0; i < t->numel(); ++i) v.push_back(t->dtype() == DType::kInt32 ? t->data<int32_t>()[i] : t->data<int64_t>()[i]);
  return v;
}

// Bytes of a value with static dims (its whole size: the analysis reads the graph before the split).
size_t value_bytes(const Value* v) {
  size_t e = dtype_size(v->type.dtype);
  for (int64_t x : dims_of(v)) e *= size_t(x);
  return e;
}

size_t float_weight_bytes(const Graph& g) {
  size_t b = 0;
  for (const auto& v : g.values) {
    if (v->constant && !v->producer && is_float(v->constant->dtype()) && !is_graph_input(g, v.get())) b += v->constant->nbytes();
  }
  return b;
}

// One pass of the analysis over the graph, with `excluded` products kept whole.
class Propagator {
 public:
  Propagator(Graph& g, UseMap& uses, int n, const std::set<const Node*>& excluded, size_t total_bytes)
      : g_(g), uses_(uses), n_(n), excluded_(excluded), total_bytes_(total_bytes) {}

  void run() {
    for (auto& np : g_.nodes) visit(*np);
    for (Value* v : g_.outputs) {
      const Split& s = at(v);
      if (!s.split()) continue;
      if (s.segs.size() != 1) {
        bad(s.comp, fmt::format("its result leaves the model as output '{}' in interleaved parts", v->name));
      } else if (double(comp_bytes(s.comp)) < kLargeShare * double(total_bytes_)) {
        bad(s.comp, fmt::format("its result leaves the model whole (output '{}') and its weights are too small to "
                                "be worth gathering", v->name));
      } else if (kGatherCost * value_bytes(v) > comp_bytes(s.comp)) {
        // An LM head over many tokens (a long prefill): the gather (NCCL, then the ranks' parts put in
        // place, then the padding cut) costs more than reading a share of the weight saves; every
        // rank computes the logits whole instead (bench/RESULTS.md, nineteenth session).
        bad(s.comp, fmt::format("gathering output '{}' ({:.1f} MiB per forward) costs more than splitting its "
                                "weights ({:.1f} MiB) saves", v->name, double(value_bytes(v)) / (1 << 20),
                                double(comp_bytes(s.comp)) / (1 << 20)));
      } else {
        gathers_.push_back(v);
      }
    }
  }

  std::map<const Node*, NodePlan> plans;
  std::map<int, std::string> bad_roots;  // group -> why it stays whole
  std::vector<const Node*> seeds;        // column products, by group id
  int root(int c) { return parent_[size_t(c)] == c ? c : parent_[size_t(c)] = root(parent_[size_t(c)]); }
  const Split& at(const Value* v) const {
    static const Split whole;
    auto it = split_.find(v);
    return it == split_.end() ? whole : it->second;
  }
  const std::vector<Value*>& gathers() const { return gathers_; }

 private:
  void set(Value* v, Split s) {
    if (!v) return;
    // A declared type whose rank the rule did not expect (a graph written by hand or another tool)
    // cannot hold the split where the rule put it: every later rule indexes dims by the split axis.
    if (s.axis < 0 || s.axis >= int64_t(dims_of(v).size())) {
      bad(s.comp, fmt::format("'{}' ({}) has no axis {} to hold the split", v->name, v->type.to_string(), s.axis));
      return;
    }
    // A split read inside a subgraph (If/Loop body) would be taken for the whole value there.
    for (const Use& u : uses_.uses(v)) {
      if (u.body || (u.node && u.node->owner != &g_)) {
        bad(s.comp, fmt::format("'{}' is read inside a control-flow body", v->name));
        return;
      }
    }
    split_[v] = std::move(s);
  }
  void bad(int comp, std::string why) {
    const int r = root(comp);
    if (!bad_roots.count(r)) bad_roots[r] = std::move(why);
  }
  // Every group with a split input of n stays whole: n cannot take it split.
  void fail(const Node& n, const std::string& why) {
    for (const Value* v : n.inputs) {
      if (v && at(v).split()) bad(at(v).comp, fmt::format("{} {}", n.describe(), why));
    }
  }
  void unite(int a, int b) {
    a = root(a);
    b = root(b);
    if (a == b) return;
    parent_[size_t(b)] = a;
    bytes_[size_t(a)] += bytes_[size_t(b)];
    if (bad_roots.count(b)) bad_roots.emplace(a, bad_roots[b]);
  }
  size_t comp_bytes(int c) { return bytes_[size_t(root(c))]; }
  int new_comp(const Node* seed, size_t bytes) {
    parent_.push_back(int(parent_.size()));
    bytes_.push_back(bytes);
    seeds.push_back(seed);
    return int(parent_.size()) - 1;
  }

  void visit(Node& n) {
    bool any = false;
    for (const Value* v : n.inputs) any = any || (v && at(v).split());
    if (!any) return seed(n);
    if (has_subgraph(n)) return fail(n, "(a control-flow node) reads it");
    // Every rule below maps axes through static dims: a value whose shape is not known stops a split.
    for (const Value* v : n.inputs) {
      if (v && !static_dims(v)) return fail(n, fmt::format("reads '{}', whose shape is not known at build", v->name));
    }
    for (const Value* v : n.outputs) {
      if (v && !static_dims(v)) return fail(n, fmt::format("writes '{}', whose shape is not known at build", v->name));
    }
    if (is_collective(n.op)) return fail(n, "is already a collective");
    if (is_elementwise(n.op)) return elementwise(n);
    switch (n.op) {
      case OpKind::kMatMul: return matmul(n);
      case OpKind::kGemm: return gemm(n);
      case OpKind::kReshape: case OpKind::kFlatten: case OpKind::kSqueeze: case OpKind::kUnsqueeze:
        return reshape(n);
      case OpKind::kTranspose: return transpose(n);
      case OpKind::kSoftmax: case OpKind::kLogSoftmax: case OpKind::kLayerNormalization:
      case OpKind::kRMSNormalization:
        return normalize(n);
      case OpKind::kSplit: return split(n);
      case OpKind::kSlice: return slice(n);
      case OpKind::kConcat: return concat(n);
      case OpKind::kGather: return gather(n);
      case OpKind::kExpand: return expand(n);
      default:
        if (is_reduce(n.op)) return reduce(n);
        return fail(n, "needs its input whole");
    }
  }

  // ---- seeds ------------------------------------------------------------------------------------

  // The parts a column-split product's output is cut into: the sizes of a Split along its last
  // axis a few view/bias steps later (fused Q/K/V), else one part.
  std::vector<int64_t> parts_of(Value* y, int64_t cols) {
    Value* cur = y;
    for (int step = 0; step < 6; ++step) {
      if (uses_.is_output(cur) || uses_.num_uses(cur) != 1 || !uses_.uses(cur)[0].node) break;
      Node* u = uses_.uses(cur)[0].node;
      const std::vector<int64_t> d = dims_of(cur);
      if (d.empty() || d.back() != cols || u->owner != &g_) break;
      if (u->op == OpKind::kSplit && norm_axis(u->attr_int("axis", 0), d.size()) == int64_t(d.size()) - 1) {
        std::vector<int64_t> sizes;
        for (const Value* o : u->outputs) {
          const std::vector<int64_t> od = dims_of(o);
          if (!o || od.empty()) return {cols};
          sizes.push_back(od.back());
        }
        for (int64_t s : sizes) {
          if (s % n_) return {cols};
        }
        return sizes.size() > 1 ? sizes : std::vector<int64_t>{cols};
      }
      const bool passes = (u->op == OpKind::kAdd && other_operand(u, [&](const Value* v) { return v == cur; }) &&
                           constant_of(g_, other_operand(u, [&](const Value* v) { return v == cur; }))) ||
                          u->op == OpKind::kReshape || u->op == OpKind::kIdentity || u->op == OpKind::kCast;
      if (!passes || !u->has_output(0)) break;
      const std::vector<int64_t> od = dims_of(u->outputs[0]);
      if (od.empty() || od.back() != cols) break;
      cur = u->outputs[0];
    }
    return {cols};
  }

  void seed(Node& n) {
    if (excluded_.count(&n)) return;
    if (n.op == OpKind::kMatMul || n.op == OpKind::kGemm) return seed_product(n);
    if (n.op == OpKind::kGather) return seed_embedding(n);
  }

  void seed_product(Node& n) {
    const bool gemm = n.op == OpKind::kGemm;
    if (n.inputs.size() < 2 || !n.has_output(0) || (gemm && n.attr_int("transA", 0))) return;
    const Tensor* w = constant_of(g_, n.inputs[1]);
    const std::vector<int64_t> a = dims_of(n.inputs[0]), y = dims_of(n.outputs[0]);
    if (!w || w->rank() != 2 || !is_float(w->dtype()) || a.size() < 2 || y.empty() || constant_of(g_, n.inputs[0])) return;
    const int64_t col_axis = gemm && n.attr_int("transB", 0) ? 0 : 1;
    const int64_t cols = w->dim(size_t(col_axis));
    if (cols < n_ || y.back() != cols) return;
    NodePlan p;
    p.column = true;
    std::vector<int64_t> segs = parts_of(n.outputs[0], cols);
    // Columns that do not divide (GPT-2's 50257 words) pad to a multiple of 64 per rank: each rank's
    // product then has an aligned width, which 16-bit GEMMs need for their fast kernels, and only a
    // gathered output (padding is sliced off after the gather) may be padded at all.
    const int64_t pad_to = int64_t(n_) * 64;
    const int64_t padded = cols % n_ ? (cols + pad_to - 1) / pad_to * pad_to : cols;
    if (segs.size() == 1) segs = {padded};
    p.slices.push_back({1, col_axis, segs});
    if (gemm && n.has_input(2)) {
      const std::vector<int64_t> c = dims_of(n.inputs[2]);
      if (!c.empty() && c.back() == cols) {
        if (!constant_of(g_, n.inputs[2]) || (c.size() == 2 && c[0] != 1)) return;
        p.slices.push_back({2, int64_t(c.size()) - 1, segs});
      }
    }
    Split s;
    s.axis = int64_t(y.size()) - 1;
    s.segs = segs;
    s.whole = cols;
    s.comp = new_comp(&n, w->nbytes());
    plans[&n] = std::move(p);
    set(n.outputs[0], std::move(s));
  }

  // Gather(table, ids) of a large constant table along its rows: the vocabulary-split embedding.
  void seed_embedding(Node& n) {
    if (n.inputs.size() < 2 || !n.has_output(0)) return;
    const Tensor* t = constant_of(g_, n.inputs[0]);
    if (!t || t->rank() != 2 || !is_float(t->dtype()) || norm_axis(n.attr_int("axis", 0), 2) != 0) return;
    const DType it = n.inputs[1]->type.dtype;
    if ((it != DType::kInt64 && it != DType::kInt32) || !static_dims(n.inputs[1])) return;
    const int64_t rows = t->dim(0), per = (rows + n_ - 1) / n_;
    if (rows - (n_ - 1) * per < 1 || double(t->nbytes()) < kLargeShare * double(total_bytes_)) return;
    NodePlan p;
    p.vocab = true;
    plans[&n] = std::move(p);
  }

  // ---- rules for a node with a split input --------------------------------------------------------

  // A row-split product: this rank's partial sum, made whole by one AllReduce. The AllReduce moves
  // past what a sum passes through unchanged when rank 0 alone adds it: a bias Add (zeros on the
  // other ranks), views, and then the residual Add (the other ranks pass their partial sum on).
  // Rank 0's product then keeps its bias and residual in its GEMM epilogue, and no rank runs an
  // Add after the AllReduce.
  void reduce_after(Node& n, NodePlan& p, const Value* split_input) {
    Value* y = n.outputs[0];
    p.row = true;
    p.reduce_after = y;
    while (!uses_.is_output(y) && uses_.num_uses(y) == 1 && uses_.uses(y)[0].node) {
      Node* u = uses_.uses(y)[0].node;
      if (u->owner != &g_ || !u->has_output(0) || at(y).split()) return;
      if (u->op == OpKind::kReshape || u->op == OpKind::kIdentity || u->op == OpKind::kSqueeze ||
          u->op == OpKind::kUnsqueeze) {
        if (u->inputs[0] != y || (u->inputs.size() > 1 && u->inputs[1] == y)) return;
        y = u->outputs[0];
        continue;
      }
      if (u->op != OpKind::kAdd || u->inputs.size() != 2 || u->inputs[0] == u->inputs[1]) return;
      const size_t oi = u->inputs[0] == y ? 1 : 0;
      const Value* other = u->inputs[oi];
      if (at(other).split() || dims_of(u->outputs[0]) != dims_of(y)) return;
      if (constant_of(g_, other)) {
        if (p.bias_add || p.residual_add) return;
        p.bias_add = u;
        p.bias_input = oi;
      } else {
        // Only a residual the product itself depends on: then every rank's graph keeps the same
        // dependencies (rank 0 adds it, the others pass their sum on), the ranks' collectives stay
        // in one order, and a sum of two partial products (parallel attention and MLP) is never
        // taken for a residual.
        if (p.residual_add || !is_ancestor(other, split_input)) return;
        p.residual_add = u;
        p.residual_input = oi;
      }
      y = u->outputs[0];
      p.reduce_after = y;
      if (p.residual_add) return;
    }
  }

  // Whether `a` is `v` or a value v is computed from (within this graph).
  static bool is_ancestor(const Value* a, const Value* v) {
    std::vector<const Value*> stack = {v};
    std::set<const Value*> seen;
    while (!stack.empty()) {
      const Value* x = stack.back();
      stack.pop_back();
      if (x == a) return true;
      if (!x || !seen.insert(x).second || !x->producer) continue;
      for (const Value* in : x->producer->inputs) stack.push_back(in);
    }
    return false;
  }

  // Where a replicated operand meets a split one: fine when it broadcasts along the split axis; a
  // constant holding the whole axis is sliced; anything else cannot.
  bool whole_operand(Node& n, size_t i, int64_t out_axis, size_t out_rank, const Split& s, NodePlan& p) {
    const std::vector<int64_t> d = dims_of(n.inputs[i]);
    if (!static_dims(n.inputs[i]) || d.size() > out_rank) {
      fail(n, fmt::format("reads '{}', whose shape is not known at build", n.inputs[i]->name));
      return false;
    }
    const int64_t j = out_axis - int64_t(out_rank - d.size());
    if (j < 0 || d[size_t(j)] == 1) return true;
    if (constant_of(g_, n.inputs[i]) && !s.padded() && d[size_t(j)] == sum(s.segs)) {
      p.slices.push_back({i, j, s.segs});
      return true;
    }
    fail(n, fmt::format("reads '{}' whole where the other operand is split", n.inputs[i]->name));
    return false;
  }
  static int64_t sum(const std::vector<int64_t>& v) {
    int64_t s = 0;
    for (int64_t x : v) s += x;
    return s;
  }

  void elementwise(Node& n) {
    if (!n.has_output(0)) return fail(n, "has no output");
    const size_t ro = dims_of(n.outputs[0]).size();
    const Split* first = nullptr;
    int64_t oa = -1;
    for (const Value* v : n.inputs) {
      if (!v || !at(v).split()) continue;
      const Split& s = at(v);
      const int64_t a = s.axis + int64_t(ro) - int64_t(dims_of(v).size());
      if (s.padded()) return fail(n, "reads an output padded to a multiple of the ranks");
      if (first && (a != oa || s.segs != first->segs)) return fail(n, "reads operands split differently");
      if (first) unite(first->comp, s.comp);
      first = &s;
      oa = a;
    }
    NodePlan p;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      if (n.inputs[i] && !at(n.inputs[i]).split() && !whole_operand(n, i, oa, ro, *first, p)) return;
    }
    Split out = *first;
    out.axis = oa;
    if (!p.slices.empty()) plans[&n] = std::move(p);
    for (Value* o : n.outputs) {
      if (o && dims_of(o).size() == ro) set(o, out);
    }
  }

  void matmul(Node& n) {
    Value *A = n.inputs[0], *B = n.inputs[1];
    const std::vector<int64_t> da = dims_of(A), db = dims_of(B), dy = dims_of(n.outputs[0]);
    if (da.size() < 2 || db.size() < 2 || dy.empty()) return fail(n, "is a vector product");
    const Split &sa = at(A), &sb = at(B);
    if (sa.padded() || sb.padded()) return fail(n, "reads an output padded to a multiple of the ranks");
    const int64_t ra = int64_t(da.size()), rb = int64_t(db.size()), ro = int64_t(dy.size());
    NodePlan p;
    Split out = sa.split() ? sa : sb;
    if (sa.split() && sb.split()) {
      if (sa.axis == ra - 1 && sb.axis == rb - 2 && sa.segs == sb.segs) {
        unite(sa.comp, sb.comp);
        reduce_after(n, p, A);
        plans[&n] = std::move(p);
        return;
      }
      const int64_t oa = sa.axis + ro - ra, ob = sb.axis + ro - rb;
      if (sa.axis >= ra - 2 || sb.axis >= rb - 2 || oa != ob || sa.segs != sb.segs) {
        return fail(n, "multiplies operands split along different axes");
      }
      unite(sa.comp, sb.comp);
      out.axis = oa;
      set(n.outputs[0], out);
      return;
    }
    if (sa.split()) {
      if (sa.axis == ra - 1) {  // contracts over the split: rows of a constant weight
        if (!constant_of(g_, B)) return fail(n, "contracts over the split axis with a weight that is not a constant");
        p.slices.push_back({1, rb - 2, sa.segs});
        reduce_after(n, p, A);
        plans[&n] = std::move(p);
        return;
      }
      out.axis = sa.axis == ra - 2 ? ro - 2 : sa.axis + ro - ra;
      if (sa.axis < ra - 2 && !whole_operand(n, 1, out.axis, size_t(ro), sa, p)) return;
    } else {
      if (sb.axis == rb - 2) return fail(n, "contracts over the split axis of its second operand");
      out.axis = sb.axis == rb - 1 ? ro - 1 : sb.axis + ro - rb;
      if (sb.axis < rb - 2 && !whole_operand(n, 0, out.axis, size_t(ro), sb, p)) return;
    }
    if (!p.slices.empty()) plans[&n] = std::move(p);
    set(n.outputs[0], out);
  }

  void gemm(Node& n) {
    const Split& s = at(n.inputs[0]);
    if (n.inputs.size() > 1 && at(n.inputs[1]).split()) return fail(n, "reads a split second operand");
    if (n.has_input(2) && at(n.inputs[2]).split()) return fail(n, "reads a split bias");
    if (s.padded()) return fail(n, "reads an output padded to a multiple of the ranks");
    const int64_t k_axis = n.attr_int("transA", 0) ? 0 : 1;
    if (s.axis != k_axis) return fail(n, "is split along its rows");
    if (!constant_of(g_, n.inputs[1])) return fail(n, "contracts over the split axis with a weight that is not a constant");
    if (n.has_input(2) && !constant_of(g_, n.inputs[2])) return fail(n, "adds a C that is not a constant to a partial sum");
    NodePlan p;
    p.slices.push_back({1, n.attr_int("transB", 0) ? 1 : 0, s.segs});
    if (n.has_input(2)) p.zero_input = 2;
    reduce_after(n, p, n.inputs[0]);
    plans[&n] = std::move(p);
  }

  // Reshape-like ops: where the split axis's rows land in the output. The rank's rows are one
  // contiguous block of the axis times everything inside it; that is a block of output axis o when
  // the dims outside match (the same product before a and before o) and o divides by n.
  void reshape(Node& n) {
    const Value* x = n.inputs[0];
    const Split& s = at(x);
    const std::vector<int64_t> id = dims_of(x), od = dims_of(n.outputs[0]);
    if (id.empty() || od.empty()) return fail(n, "has a dynamic shape");
    int64_t before = 1;
    for (int64_t i = 0; i < s.axis; ++i) before *= id[size_t(i)];
    int64_t prod = 1;
    size_t o = 0;
    while (o < od.size() && (prod < before || od[o] == 1)) prod *= od[o++];
    if (o == od.size() || prod != before) return fail(n, "mixes the split axis with the axes outside it");
    const bool kept = od[o] == id[size_t(s.axis)];
    if (s.padded()) return fail(n, "reshapes an output padded to a multiple of the ranks");
    if (!kept && (s.segs.size() != 1 || od[o] % n_)) {
      return fail(n, fmt::format("cuts the split axis of {} into {} parts of {}: {} does not divide by {} ranks",
                                 id[size_t(s.axis)], od[o], id[size_t(s.axis)] / std::max<int64_t>(1, od[o]), od[o], n_));
    }
    if (kept) {  // the axis passes through whole: its segments too (inner dims must match)
      int64_t in_inner = 1, out_inner = 1;
      for (size_t i = size_t(s.axis) + 1; i < id.size(); ++i) in_inner *= id[i];
      for (size_t i = o + 1; i < od.size(); ++i) out_inner *= od[i];
      if (in_inner != out_inner) return fail(n, "mixes the split axis with the axes inside it");
    }
    if (n.op == OpKind::kSqueeze && !n.has_input(1)) return fail(n, "squeezes every axis of size 1");
    Split out = s;
    out.axis = int64_t(o);
    if (!kept) {
      out.segs = {od[o]};
      out.whole = od[o];
    }
    if (n.op == OpKind::kReshape) {
      if (!constant_of(g_, n.inputs[1])) return fail(n, "has a target that is not a constant");
      NodePlan p;
      p.local_axis = int64_t(o);
      plans[&n] = std::move(p);
    }
    set(n.outputs[0], out);
  }

  void transpose(Node& n) {
    const Split& s = at(n.inputs[0]);
    const size_t r = dims_of(n.inputs[0]).size();
    std::vector<int64_t> perm = n.attr_ints("perm");
    if (perm.empty()) {
      for (size_t i = 0; i < r; ++i) perm.push_back(int64_t(r - 1 - i));
    }
    Split out = s;
    out.axis = std::find(perm.begin(), perm.end(), s.axis) - perm.begin();
    set(n.outputs[0], out);
  }

  // Softmax over the last axis, LayerNorm over the trailing axes: fine while the split is outside.
  void normalize(Node& n) {
    const Split& s = at(n.inputs[0]);
    for (size_t i = 1; i < n.inputs.size(); ++i) {
      if (n.inputs[i] && at(n.inputs[i]).split()) return fail(n, "reads a split scale or bias");
    }
    const size_t r = dims_of(n.inputs[0]).size();
    const int64_t axis = norm_axis(n.attr_int("axis", -1), r);
    const bool trailing = n.op == OpKind::kLayerNormalization || n.op == OpKind::kRMSNormalization;
    if (s.axis == axis || (trailing && s.axis > axis)) return fail(n, "normalizes over the split axis");
    set(n.outputs[0], s);
    for (size_t i = 1; i < n.outputs.size(); ++i) {
      if (n.outputs[i] && dims_of(n.outputs[i]).size() == r) set(n.outputs[i], s);
    }
  }

  void reduce(Node& n) {
    const Split& s = at(n.inputs[0]);
    const size_t r = dims_of(n.inputs[0]).size();
    const auto axes = ints_of(n.has_input(1) ? constant_of(g_, n.inputs[1]) : nullptr);
    if (!axes || axes->empty()) return fail(n, "reduces every axis, or axes that are not constants");
    int64_t below = 0;
    for (int64_t x : *axes) {
      const int64_t a = norm_axis(x, r);
      if (a == s.axis) return fail(n, "reduces over the split axis");
      below += a < s.axis;
    }
    Split out = s;
    if (!n.attr_int("keepdims", 1)) out.axis -= below;
    set(n.outputs[0], out);
  }

  void split(Node& n) {
    const Split& s = at(n.inputs[0]);
    const size_t r = dims_of(n.inputs[0]).size();
    if (norm_axis(n.attr_int("axis", 0), r) != s.axis) {
      for (Value* o : n.outputs) set(o, s);
      return;
    }
    std::vector<int64_t> sizes;
    for (const Value* o : n.outputs) sizes.push_back(o && dims_of(o).size() == r ? dims_of(o)[size_t(s.axis)] : -1);
    if (sizes != s.segs) return fail(n, "splits the split axis into other parts than its producer's");
    if (n.has_input(1) && !ints_of(constant_of(g_, n.inputs[1]))) return fail(n, "has split sizes that are not integer constants");
    NodePlan p;
    p.split_sizes = n.has_input(1);
    plans[&n] = std::move(p);
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      Split out = s;
      out.segs = {sizes[i]};
      out.whole = sizes[i];
      set(n.outputs[i], out);
    }
  }

  void slice(Node& n) {
    const Split& s = at(n.inputs[0]);
    for (size_t i = 1; i < n.inputs.size(); ++i) {
      if (n.inputs[i] && at(n.inputs[i]).split()) return fail(n, "reads split bounds");
    }
    const size_t r = dims_of(n.inputs[0]).size();
    const auto axes = ints_of(n.has_input(3) ? constant_of(g_, n.inputs[3]) : nullptr);
    const auto steps = ints_of(n.has_input(4) ? constant_of(g_, n.inputs[4]) : nullptr);
    const auto starts = ints_of(n.has_input(1) ? constant_of(g_, n.inputs[1]) : nullptr);
    if ((n.has_input(3) && !axes) || (n.has_input(4) && !steps) || !starts) {
      return fail(n, "has starts, axes or steps that are not integer constants");
    }
    // Without axes, starts[i] applies to axis i: as many entries as starts has.
    const int64_t count = axes ? int64_t(axes->size()) : std::min<int64_t>(int64_t(starts->size()), int64_t(r));
    if (steps && int64_t(steps->size()) < count) return fail(n, "has fewer steps than axes");
    if (dims_of(n.outputs[0]).size() != r) return fail(n, "has an output of another rank");
    for (int64_t i = 0; i < count; ++i) {
      const int64_t a = axes ? norm_axis((*axes)[size_t(i)], r) : i;
      // Only a slice that keeps the whole split axis in order reads the same on every rank.
      if (a == s.axis && (dims_of(n.inputs[0])[size_t(a)] != dims_of(n.outputs[0])[size_t(a)] ||
                          (steps && (*steps)[size_t(i)] != 1))) {
        return fail(n, "slices the split axis");
      }
    }
    set(n.outputs[0], s);
  }

  void concat(Node& n) {
    const int64_t axis = norm_axis(n.attr_int("axis", 0), dims_of(n.outputs[0]).size());
    const Split* first = nullptr;
    for (const Value* v : n.inputs) {
      if (!v || !at(v).split()) continue;
      if (at(v).axis == axis) return fail(n, "concatenates along the split axis");
      if (first && !at(v).same_as(*first)) return fail(n, "concatenates operands split differently");
      if (first) unite(first->comp, at(v).comp);
      first = &at(v);
    }
    NodePlan p;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      if (n.inputs[i] && !at(n.inputs[i]).split() && !whole_operand(n, i, first->axis, dims_of(n.inputs[i]).size(), *first, p)) return;
    }
    if (!p.slices.empty()) plans[&n] = std::move(p);
    set(n.outputs[0], *first);
  }

  void gather(Node& n) {
    const Split& s = at(n.inputs[0]);
    if (!s.split() || at(n.inputs[1]).split()) return fail(n, "gathers with split indices");
    const size_t r = dims_of(n.inputs[0]).size();
    const int64_t axis = norm_axis(n.attr_int("axis", 0), r);
    if (axis == s.axis) return fail(n, "gathers along the split axis");
    Split out = s;
    const int64_t ri = int64_t(dims_of(n.inputs[1]).size());
    if (s.axis > axis) out.axis += ri - 1;
    set(n.outputs[0], out);
  }

  void expand(Node& n) {
    const Split& s = at(n.inputs[0]);
    if (s.padded()) return fail(n, "expands an output padded to a multiple of the ranks");
    if (!constant_of(g_, n.inputs[1])) return fail(n, "has a target that is not a constant");
    const size_t ro = dims_of(n.outputs[0]).size();
    Split out = s;
    out.axis = s.axis + int64_t(ro) - int64_t(dims_of(n.inputs[0]).size());
    NodePlan p;
    p.local_axis = out.axis;
    plans[&n] = std::move(p);
    set(n.outputs[0], out);
  }

  Graph& g_;
  UseMap& uses_;
  const int n_;
  const std::set<const Node*>& excluded_;
  const size_t total_bytes_;
  std::map<const Value*, Split> split_;
  std::vector<int> parent_;
  std::vector<size_t> bytes_;
  std::vector<Value*> gathers_;
};

// ---- the rewrite ------------------------------------------------------------------------------------

// Rank r's slice of `t` along `axis`: the r-th n-th of each segment. Segments past the tensor's
// size (an axis padded to a multiple of n) read as zeros.
Tensor shard_constant(const Tensor& t, int64_t axis, const std::vector<int64_t>& segs, int n, int r) {
  std::vector<int64_t> dims = t.dims();
  int64_t local = 0;
  for (int64_t s : segs) local += s / n;
  dims[size_t(axis)] = local;
  Tensor out = Tensor::create(t.dtype(), dims).value();
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= t.dim(size_t(i));
  for (size_t i = size_t(axis) + 1; i < t.rank(); ++i) inner *= t.dim(i);
  const size_t row = size_t(inner) * dtype_size(t.dtype());
  const int64_t have = t.dim(size_t(axis));
  auto* o = static_cast<char*>(out.raw());
  const auto* src = static_cast<const char*>(t.raw());
  for (int64_t i = 0; i < outer; ++i) {
    int64_t at = 0;
    for (int64_t s : segs) {
      for (int64_t k = at + r * (s / n); k < at + (r + 1) * (s / n); ++k) {
        if (k < have) std::memcpy(o, src + (size_t(i * have + k)) * row, row);
        o += row;
      }
      at += s;
    }
  }
  return out;
}

Tensor zeros_like(const Tensor& t) { return Tensor::create(t.dtype(), t.dims()).value(); }

Tensor scalar_of_dtype(DType dt, int64_t v) {
  Tensor t = Tensor::create(dt, {}).value();
  if (dt == DType::kInt32) *t.data<int32_t>() = int32_t(v);
  else *t.data<int64_t>() = v;
  return t;
}

class Rewriter {
 public:
  Rewriter(Graph& g, int n, int r) : g_(g), n_(n), r_(r) {}

  // Every reader of v (graph outputs included, which keep their names) now reads `out`, the end of a
  // chain that starts by reading v.
  void redirect(Value* v, Value* out, const std::vector<Use>& readers) {
    for (const Use& u : readers) {
      if (u.body) u.body->outputs[u.input] = out;
      else u.node->inputs[u.input] = out;
    }
    for (Value*& o : g_.outputs) {
      if (o != v) continue;
      const std::string name = v->name;
      g_.rename_value(v, g_.unique_name(name + "_rank"));
      g_.rename_value(out, name);
      o = out;
    }
  }
  std::vector<Use> readers(Value* v) {
    UseMap uses(g_);
    return uses.uses(v);
  }
  Value* constant(const std::string& base, Tensor t) { return g_.add_constant(g_.unique_name(base), std::move(t)); }
  Node* node(OpKind op, std::vector<Value*> in, const std::string& name) {
    return g_.add_node(op, std::move(in), 1, g_.unique_name(name));
  }

  // `like`: a typed value of v's type and shape, when v is new (its type is inferred later).
  Node* all_reduce(Value* v, TensorParallelReport& rep, const Value* like = nullptr) {
    std::vector<Use> rd = readers(v);
    Node* ar = node(OpKind::kAllReduce, {v}, v->name + "_allreduce");
    ar->attrs["ranks"] = Attribute::of_int(n_);
    redirect(v, ar->outputs[0], rd);
    ++rep.all_reduces;
    const size_t bytes = value_bytes(like ? like : v);
    rep.all_reduce_bytes += bytes;
    rep.max_all_reduce_bytes = std::max(rep.max_all_reduce_bytes, bytes);
    return ar;
  }

  void gather_output(Value* v, int64_t axis, int64_t whole, int64_t padded, TensorParallelReport& rep) {
    Node* ag = node(OpKind::kAllGather, {v}, v->name + "_allgather");
    ag->attrs["axis"] = Attribute::of_int(axis);
    ag->attrs["ranks"] = Attribute::of_int(n_);
    Value* out = ag->outputs[0];
    if (padded != whole) {  // drop the zero columns the padding added
      Node* sl = node(OpKind::kSlice, {out, constant(v->name + "_start", Tensor::from_vector<int64_t>({0}, {1})),
                                       constant(v->name + "_end", Tensor::from_vector<int64_t>({whole}, {1})),
                                       constant(v->name + "_axis", Tensor::from_vector<int64_t>({axis}, {1}))},
                      v->name + "_unpad");
      out = sl->outputs[0];
    }
    // Only the model's output is gathered: nodes that read v go on reading this rank's part.
    redirect(v, out, {});
    ++rep.all_gathers;
    rep.all_gather_bytes += value_bytes(v);
  }

  // Gather(table, ids) -> this rank's rows: ids it holds look up, others read zeros; an AllReduce
  // sums the ranks. Ids out of the table's range still fail as they would unsplit: rank 0 turns a
  // negative id into an index past its rows, the last rank keeps ids past the end.
  void embedding(Node& n, TensorParallelReport& rep) {
    const Tensor& t = *constant_of(g_, n.inputs[0]);
    Value* ids = n.inputs[1];
    const DType it = ids->type.dtype;
    const int64_t rows = t.dim(0), per = (rows + n_ - 1) / n_, lo = r_ * per;
    const int64_t mine = std::min(per, rows - lo);
    const std::string b = n.outputs[0]->name;
    std::vector<Use> rd = readers(n.outputs[0]);
    Value* zero = constant(b + "_zero", scalar_of_dtype(it, 0));
    Value* count = constant(b + "_rows", scalar_of_dtype(it, mine));
    Value* neg = node(OpKind::kLess, {ids, zero}, b + "_neg")->outputs[0];
    Value* wrapped = node(OpKind::kAdd, {ids, constant(b + "_vocab", scalar_of_dtype(it, rows))}, b + "_wrap")->outputs[0];
    Value* pos = node(OpKind::kWhere, {neg, wrapped, ids}, b + "_pos")->outputs[0];
    Value* local = node(OpKind::kSub, {pos, constant(b + "_first", scalar_of_dtype(it, lo))}, b + "_local")->outputs[0];
    Value* above = node(OpKind::kGreaterOrEqual, {local, zero}, b + "_above")->outputs[0];
    Value* below = node(OpKind::kLess, {local, count}, b + "_below")->outputs[0];
    Value* mine_mask = node(OpKind::kAnd, {above, below}, b + "_mine")->outputs[0];
    // Every rank gets the same nodes (only constants differ), so later passes treat the ranks alike
    // and their collectives stay in one order: the low cut is 0 on rank 0 (a negative local id
    // becomes `count`, past the rows) and the lowest id elsewhere; the high cut is `count` on the
    // last rank (an id past the table stays itself) and the highest id elsewhere.
    const int64_t lowest = it == DType::kInt32 ? INT32_MIN : INT64_MIN, highest = it == DType::kInt32 ? INT32_MAX : INT64_MAX;
    Value* low = constant(b + "_low_cut", scalar_of_dtype(it, r_ == 0 ? 0 : lowest));
    Value* high = constant(b + "_high_cut", scalar_of_dtype(it, r_ == n_ - 1 ? mine : highest));
    Value* other = node(OpKind::kWhere, {node(OpKind::kLess, {local, low}, b + "_under")->outputs[0], count, zero},
                        b + "_bad_low")->outputs[0];
    other = node(OpKind::kWhere, {node(OpKind::kGreaterOrEqual, {local, high}, b + "_over")->outputs[0], local, other},
                 b + "_bad_high")->outputs[0];
    Value* idx = node(OpKind::kWhere, {mine_mask, local, other}, b + "_index")->outputs[0];
    Tensor rows_mine = Tensor::create(t.dtype(), {mine, t.dim(1)}).value();
    std::memcpy(rows_mine.raw(), static_cast<const char*>(t.raw()) + size_t(lo) * size_t(t.dim(1)) * dtype_size(t.dtype()),
                rows_mine.nbytes());
    n.inputs[0] = constant(n.inputs[0]->name + "_rank", std::move(rows_mine));
    n.inputs[1] = idx;
    const int64_t ri = int64_t(dims_of(ids).size());
    Value* m = node(OpKind::kUnsqueeze, {mine_mask, constant(b + "_axes", Tensor::from_vector<int64_t>({ri}, {1}))},
                    b + "_mask")->outputs[0];
    Tensor z = Tensor::create(t.dtype(), {}).value();
    Value* picked = node(OpKind::kWhere, {m, n.outputs[0], constant(b + "_fill", std::move(z))}, b + "_picked")->outputs[0];
    redirect(n.outputs[0], picked, rd);
    all_reduce(picked, rep, n.outputs[0]);
  }


 private:
  Graph& g_;
  const int n_, r_;
};

}  // namespace

std::string TensorParallelReport::to_text() const {
  std::string s = fmt::format("tensor parallel: {} ranks; weights {:.2f} MiB whole, {:.2f} MiB per rank; {} AllReduce "
                              "({:.3f} MiB per forward), {} AllGather ({:.3f} MiB)\n",
                              ranks, double(weight_bytes_whole) / (1 << 20), double(weight_bytes_rank) / (1 << 20),
                              all_reduces, double(all_reduce_bytes) / (1 << 20), all_gathers,
                              double(all_gather_bytes) / (1 << 20));
  s += fmt::format("  split by columns: {}; by rows: {}; embeddings split by vocabulary: {}\n", column.size(), row.size(),
                   vocab.size());
  for (const std::string& k : kept_whole) s += "  kept whole: " + k + "\n";
  if (column.empty() && vocab.empty()) s += "  nothing was split: every rank computes the whole model\n";
  return s;
}

Expected<bool> shard_tensor_parallel(Graph& g, int ranks, int rank, TensorParallelReport* report) {
  if (ranks < 1 || rank < 0 || rank >= ranks) return KILN_ERROR(kInvalidArgument, "rank {} of {} ranks", rank, ranks);
  TensorParallelReport local;
  TensorParallelReport& rep = report ? *report : local;
  rep = TensorParallelReport();
  rep.ranks = ranks;
  rep.weight_bytes_whole = rep.weight_bytes_rank = float_weight_bytes(g);
  if (ranks == 1) return false;
  for (const Value* v : g.inputs) {
    if (!v->constant && (!v->type.shape || !v->type.shape->is_static())) {
      return KILN_ERROR(kInvalidArgument, "tensor parallelism needs fixed input shapes: input '{}' is {} (give --shapes "
                        "or --batch)", v->name, v->type.to_string());
    }
  }
  // The analysis, repeated with the groups that cannot stay split kept whole, until none is left.
  std::set<const Node*> excluded;
  std::map<const Node*, NodePlan> plans;
  std::vector<std::pair<Value*, Split>> gathers;
  {
    UseMap uses(g);
    for (int iter = 0;; ++iter) {
      Propagator p(g, uses, ranks, excluded, rep.weight_bytes_whole);
      p.run();
      if (p.bad_roots.empty()) {
        plans = std::move(p.plans);
        for (Value* v : p.gathers()) gathers.emplace_back(v, p.at(v));
        break;
      }
      for (size_t c = 0; c < p.seeds.size(); ++c) {
        auto it = p.bad_roots.find(p.root(int(c)));
        if (it == p.bad_roots.end()) continue;
        excluded.insert(p.seeds[c]);
        rep.kept_whole.push_back(p.seeds[c]->describe() + ": " + it->second);
      }
      if (iter > int(g.nodes.size())) return KILN_ERROR(kInternal, "tensor-parallel: the analysis did not settle");
    }
  }
  if (plans.empty()) return false;
  // In graph order: every rank's copy makes the same nodes and collectives in the same order.
  std::vector<std::pair<Node*, NodePlan*>> order;
  for (auto& np : g.nodes) {
    if (auto it = plans.find(np.get()); it != plans.end()) order.emplace_back(np.get(), &it->second);
  }
  Rewriter rw(g, ranks, rank);
  for (auto& [node, pp] : order) {
    Node& n = *node;
    NodePlan& p = *pp;
    if (p.column) rep.column.push_back(n.describe());
    if (p.row && p.reduce_after != nullptr && !p.slices.empty()) rep.row.push_back(n.describe());
    for (const NodePlan::Slice& s : p.slices) {
      const Tensor& t = *constant_of(g, n.inputs[s.input]);
      n.inputs[s.input] = rw.constant(n.inputs[s.input]->name + "_rank", shard_constant(t, s.axis, s.segs, ranks, rank));
    }
    if (p.local_axis >= 0) {
      std::vector<int64_t> d = dims_of(n.outputs[0]);
      d[size_t(p.local_axis)] /= ranks;
      n.inputs[1] = add_i64_constant(g, n.inputs[1]->name + "_rank", d);
    }
    if (p.split_sizes) {
      std::vector<int64_t> sizes = *ints_of(constant_of(g, n.inputs[1]));
      for (int64_t& x : sizes) x /= ranks;
      n.inputs[1] = add_i64_constant(g, n.inputs[1]->name + "_rank", sizes);
    }
    if (p.zero_input != SIZE_MAX && rank != 0) {
      n.inputs[p.zero_input] = rw.constant(n.inputs[p.zero_input]->name + "_zero", zeros_like(*constant_of(g, n.inputs[p.zero_input])));
    }
    if (p.bias_add && rank != 0) {
      Value*& b = p.bias_add->inputs[p.bias_input];
      b = rw.constant(b->name + "_zero", zeros_like(*constant_of(g, b)));
    }
    if (p.residual_add && rank != 0) {  // the partial sum passes on; rank 0 adds the residual once
      Node& a = *p.residual_add;
      a.op = OpKind::kIdentity;
      a.inputs = {a.inputs[1 - p.residual_input]};
    }
  }
  // Collectives last: they add nodes and redirect readers, which the plans above no longer need.
  for (auto& [node, p] : order) {
    if (p->row) rw.all_reduce(p->reduce_after, rep);
    if (p->vocab) {
      rep.vocab.push_back(node->describe());
      rw.embedding(*node, rep);
    }
  }
  for (auto& [v, s] : gathers) rw.gather_output(v, s.axis, s.whole, s.segs[0], rep);
  KILN_RETURN_IF_ERROR(g.topo_sort());
  for (auto& np : g.nodes) {
    for (Value* o : np->outputs) {
      if (o) {
        o->type = Type();
        o->dims_value.reset();
      }
    }
  }
  KILN_RETURN_IF_ERROR(infer_types(g));
  UseMap uses(g);
  erase_unused_constants(uses);
  rep.weight_bytes_rank = float_weight_bytes(g);
  return !plans.empty();
}

}  // namespace kiln
