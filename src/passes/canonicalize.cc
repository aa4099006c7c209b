// canonicalize: local rewrites that remove no-op and self-cancelling nodes, so that later passes
// see producers and consumers directly connected (Conv -> BatchNormalization without an Identity
// between) and backends run fewer nodes. A table of rules (DESIGN.md rule 4), applied in sweeps
// over the graph until none fires.
//
//   Before:  %t = Transpose(%x) {perm = [0, 2, 1]} : f32[2,4,3]
//            %u = Transpose(%t) {perm = [0, 2, 1]} : f32[2,3,4]
//            %c = Cast(%u) {to = 1} : f32[2,3,4]
//            %y = Relu(%c) : f32[2,3,4]
//   After:   %y = Relu(%x) : f32[2,3,4]
//
// A rule that replaces a node's output by another value goes through UseMap::forward: when the
// output is a graph output, the replacement takes over its name, or, when it cannot (it is a
// graph input, already another output, or of another type), the node stays. Graph outputs keep
// their names and types. Surviving nodes keep their names. Rules needing shapes (Reshape and
// Expand to the same shape) rely on inferred types, and the Reshape pair rule on a constant
// target: run after fold-constants to catch the shapes exporters compute at run time.
#include <algorithm>
#include <numeric>
#include <set>

#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln {

namespace {

// ---- predicates and helpers used by the rules ------------------------------------------------

Node* producer_if(const Value* v, OpKind op) {
  return v && v->producer && v->producer->op == op ? v->producer : nullptr;
}

bool forwardable(const UseMap& u, const Node& n, const Value* to) {
  return n.has_output(0) && u.can_forward(n.outputs[0], to);
}

void bypass(UseMap& u, Node& n, Value* to) { u.forward(n.outputs[0], to); }

std::optional<std::vector<int64_t>> constant_ints(const UseMap& u, const Value* v) {
  const Tensor* t = constant_of(u.graph(), v);
  if (!t || !dtype_is_int(t->dtype()) || t->rank() > 1) return std::nullopt;
  return t->to_int_vector();
}

std::optional<size_t> rank_of(const Value* v) {
  if (!v || !v->type.has_rank()) return std::nullopt;
  return v->type.shape->dims.size();
}

// Transpose's perm attribute, or reversed axes by default (needs the input rank).
std::optional<std::vector<int64_t>> perm_of(const Node& n) {
  if (const Attribute* a = n.attr("perm")) return a->ints;
  auto r = rank_of(n.inputs[0]);
  if (!r) return std::nullopt;
  std::vector<int64_t> p(*r);
  std::iota(p.rbegin(), p.rend(), 0);
  return p;
}

bool is_identity_perm(const std::vector<int64_t>& p) {
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] != int64_t(i)) return false;
  }
  return true;
}

// Axes normalized to [0, rank) and sorted, or nullopt when one is out of range.
std::optional<std::vector<int64_t>> normalized_axes(std::vector<int64_t> axes, size_t rank) {
  for (int64_t& a : axes) {
    if (a < 0) a += int64_t(rank);
    if (a < 0 || a >= int64_t(rank)) return std::nullopt;
  }
  std::sort(axes.begin(), axes.end());
  return axes;
}

// How a dtype's values are represented, for deciding whether a round trip through another dtype
// is exact. kind 'b' bool, 'i' signed int, 'u' unsigned int, 'f' float (bits: significand bits
// including the implicit one; exp: exponent bits). Others (strings, float8, packed) are 0.
struct NumRepr {
  char kind = 0;
  int bits = 0;
  int exp = 0;
};

NumRepr repr_of(DType t) {
  if (t == DType::kBool) return {'b', 1, 0};
  if (t == DType::kUInt8) return {'u', 8, 0};
  if (t == DType::kUInt16) return {'u', 16, 0};
  if (t == DType::kUInt32) return {'u', 32, 0};
  if (t == DType::kUInt64) return {'u', 64, 0};
  if (t == DType::kInt8) return {'i', 8, 0};
  if (t == DType::kInt16) return {'i', 16, 0};
  if (t == DType::kInt32) return {'i', 32, 0};
  if (t == DType::kInt64) return {'i', 64, 0};
  if (t == DType::kFloat16) return {'f', 11, 5};
  if (t == DType::kBFloat16) return {'f', 8, 8};
  if (t == DType::kFloat32) return {'f', 24, 8};
  if (t == DType::kFloat64) return {'f', 53, 11};
  return {};
}

// True when every value of `from` converts to `via` and back unchanged: f16 -> f32 -> f16,
// f32 -> f64 -> f32, i32 -> i64 -> i32, u8 -> f16 -> u8, bool -> anything numeric -> bool;
// not f32 -> f16 -> f32 (rounds) nor i64 -> f64 -> i64 (loses bits above 2^53).
bool holds_exactly(DType from, DType via) {
  NumRepr a = repr_of(from), b = repr_of(via);
  if (!a.kind || !b.kind) return false;
  if (a.kind == 'b') return true;
  if (a.kind == 'f') return b.kind == 'f' && b.bits >= a.bits && b.exp >= a.exp;
  const int magnitude = a.kind == 'i' ? a.bits - 1 : a.bits;  // value bits of the integer
  if (b.kind == 'f') return b.bits >= magnitude;
  if (b.kind == 'i') return b.bits - 1 >= magnitude;
  if (b.kind == 'u') return a.kind == 'u' && b.bits >= a.bits;
  return false;
}

std::optional<DType> cast_to(const Node& n) {
  const Attribute* a = n.attr("to");
  if (!a || a->kind != Attribute::Kind::kInt) return std::nullopt;
  return dtype_from_onnx(int32_t(a->i));
}

std::optional<DType> tensor_dtype(const Value* v) {
  if (!v || !v->type.is_tensor()) return std::nullopt;
  return v->type.dtype;
}

// ---- the rules -------------------------------------------------------------------------------

struct Rule {
  OpKind op;            // the root's op: the most selective check, done by the driver
  const char* what;     // the rewrite, for readers
  bool (*match)(const UseMap&, const Node&);
  void (*apply)(UseMap&, Node&);
};

bool match_input0(const UseMap& u, const Node& n) { return forwardable(u, n, n.inputs[0]); }
void apply_input0(UseMap& u, Node& n) { bypass(u, n, n.inputs[0]); }

bool match_dropout(const UseMap& u, const Node& n) {
  // Inference: training_mode absent or a constant false; the mask (all true) must be unread.
  if (n.has_input(2)) {
    auto mode = constant_ints(u, n.inputs[2]);
    if (!mode || mode->size() != 1 || (*mode)[0] != 0) return false;
  }
  if (n.has_output(1) && !u.unused(n.outputs[1])) return false;
  return match_input0(u, n);
}

bool match_cast_same(const UseMap& u, const Node& n) {
  auto to = cast_to(n);
  return to && tensor_dtype(n.inputs[0]) == to && match_input0(u, n);
}

bool match_cast_pair(const UseMap& u, const Node& n) {
  const Node* inner = producer_if(n.inputs[0], OpKind::kCast);
  if (!inner) return false;
  auto from = tensor_dtype(inner->inputs[0]), via = cast_to(*inner), to = cast_to(n);
  return from && via && to == from && holds_exactly(*from, *via) && forwardable(u, n, inner->inputs[0]);
}
void apply_cast_pair(UseMap& u, Node& n) { bypass(u, n, n.inputs[0]->producer->inputs[0]); }

// Cast(Cast(x: T1, to=T2), to=T3) -> Cast(x, to=T3): the inner Cast changes no value. Not
// int -> float -> int, where the float -> int step of an out-of-range value is undefined but the
// direct int -> int one wraps; T3 a number or bool (string formatting depends on the source dtype).
bool match_cast_chain(const UseMap&, const Node& n) {
  const Node* inner = producer_if(n.inputs[0], OpKind::kCast);
  if (!inner) return false;
  auto from = tensor_dtype(inner->inputs[0]), via = cast_to(*inner), to = cast_to(n);
  if (!from || !via || !to || to == from || !holds_exactly(*from, *via) || !repr_of(*to).kind) return false;
  const char a = repr_of(*from).kind, b = repr_of(*via).kind, c = repr_of(*to).kind;
  return !((a == 'i' || a == 'u') && b == 'f' && (c == 'i' || c == 'u'));
}
void apply_cast_chain(UseMap& u, Node& n) { u.set_input(&n, 0, n.inputs[0]->producer->inputs[0]); }

bool match_reshape_pair(const UseMap& u, const Node& n) {
  const Node* inner = producer_if(n.inputs[0], OpKind::kReshape);
  if (!inner) return false;
  // A 0 in the outer target copies a dim of the inner result, which x may not have.
  auto target = constant_ints(u, n.inputs[1]);
  bool allowzero = n.attr_int("allowzero", 0) != 0;
  return target && (allowzero || std::find(target->begin(), target->end(), 0) == target->end());
}
void apply_reshape_pair(UseMap& u, Node& n) { u.set_input(&n, 0, n.inputs[0]->producer->inputs[0]); }

bool match_same_shape(const UseMap& u, const Node& n) {
  auto in = static_dims(n.inputs[0]);
  return in && n.has_output(0) && in == static_dims(n.outputs[0]) && match_input0(u, n);
}

bool match_transpose_identity(const UseMap& u, const Node& n) {
  auto p = perm_of(n);
  return p && is_identity_perm(*p) && match_input0(u, n);
}

bool match_transpose_pair(const UseMap&, const Node& n) {
  const Node* inner = producer_if(n.inputs[0], OpKind::kTranspose);
  if (!inner) return false;
  auto p1 = perm_of(*inner), p2 = perm_of(n);
  return p1 && p2 && p1->size() == p2->size();
}
void apply_transpose_pair(UseMap& u, Node& n) {
  // out[i] = t[p2[i]] = x[p1[p2[i]]]
  const Node& inner = *n.inputs[0]->producer;
  std::vector<int64_t> p1 = *perm_of(inner), p2 = *perm_of(n), p(p2.size());
  for (size_t i = 0; i < p.size(); ++i) p[i] = p1[size_t(p2[i])];
  n.attrs["perm"] = Attribute::of_ints(p);
  u.set_input(&n, 0, inner.inputs[0]);
}

// Squeeze(Unsqueeze(x, a), a) -> x: both index the unsqueezed rank.
bool match_squeeze_unsqueeze(const UseMap& u, const Node& n) {
  const Node* inner = producer_if(n.inputs[0], OpKind::kUnsqueeze);
  if (!inner || !n.has_input(1)) return false;
  auto r = rank_of(n.inputs[0]);
  auto a = constant_ints(u, n.inputs[1]), b = constant_ints(u, inner->inputs[1]);
  if (!r || !a || !b) return false;
  auto na = normalized_axes(*a, *r), nb = normalized_axes(*b, *r);
  return na && na == nb && forwardable(u, n, inner->inputs[0]);
}

// Unsqueeze(Squeeze(x, a), a) -> x: both index x's rank.
bool match_unsqueeze_squeeze(const UseMap& u, const Node& n) {
  const Node* inner = producer_if(n.inputs[0], OpKind::kSqueeze);
  if (!inner || !inner->has_input(1)) return false;
  auto r = rank_of(inner->inputs[0]);
  auto a = constant_ints(u, n.inputs[1]), b = constant_ints(u, inner->inputs[1]);
  if (!r || !a || !b) return false;
  auto na = normalized_axes(*a, *r), nb = normalized_axes(*b, *r);
  return na && na == nb && forwardable(u, n, inner->inputs[0]);
}
void apply_inner_input0(UseMap& u, Node& n) { bypass(u, n, n.inputs[0]->producer->inputs[0]); }

// Pad with every pad 0 (exporters pad to a multiple of a window size that already divides the
// image: Swin's 56 by 7) copies its input, whatever the mode.
bool match_pad_zero(const UseMap& u, const Node& n) {
  // Opset 11 on: pads is an input; before, an attribute.
  auto pads = n.inputs.size() > 1 ? constant_ints(u, n.inputs[1]) : std::make_optional(n.attr_ints("pads", {1}));
  return pads && std::all_of(pads->begin(), pads->end(), [](int64_t p) { return p == 0; }) && match_input0(u, n);
}

// Slice with unit steps whose result has its input's static shape takes every element in order.
bool match_slice_whole(const UseMap& u, const Node& n) {
  if (n.inputs.size() > 4 && n.inputs[4]) {
    auto steps = constant_ints(u, n.inputs[4]);
    if (!steps || !std::all_of(steps->begin(), steps->end(), [](int64_t s) { return s == 1; })) return false;
  }
  return n.inputs.size() >= 3 && match_same_shape(u, n);
}

// Concat's empty inputs (a KV cache that starts empty: transformers' DynamicCache exported with its
// first step) add nothing: they are dropped, and a Concat left with one input is that input.
bool is_empty_static(const Value* v) {
  auto d = v ? static_dims(v) : std::nullopt;
  return d && std::find(d->begin(), d->end(), 0) != d->end();
}
bool match_concat_empty(const UseMap&, const Node& n) {
  const size_t empty = size_t(std::count_if(n.inputs.begin(), n.inputs.end(), is_empty_static));
  return n.inputs.size() >= 2 && empty > 0 && empty < n.inputs.size();
}
void apply_concat_empty(UseMap& u, Node& n) {
  std::vector<Value*> keep, dropped;
  for (Value* v : n.inputs) (is_empty_static(v) ? dropped : keep).push_back(v);
  for (size_t i = 0; i < n.inputs.size(); ++i) u.set_input(&n, i, nullptr);
  n.inputs.assign(keep.size(), nullptr);
  for (size_t i = 0; i < keep.size(); ++i) u.set_input(&n, i, keep[i]);
  erase_unused_constants(u, dropped);
}
bool match_concat1(const UseMap& u, const Node& n) { return n.inputs.size() == 1 && n.inputs[0] && match_input0(u, n); }

// Concat of adjacent pieces of one value along its own axis (YOLO's C2f concatenates both halves of
// a Split or of two Slices with the blocks that follow): the run is that value, or one Slice of
// it. A piece: a Slice with unit steps that cuts only that axis of a static-shaped input (the other
// dims whole), or an output of a Split along it.
struct Piece {
  Value* src = nullptr;
  int64_t axis = 0, begin = 0, end = 0;
};

std::optional<Piece> piece_of(const UseMap& u, Value* v) {
  Node* p = v ? v->producer : nullptr;
  if (!p || !p->has_input(0)) return std::nullopt;
  const auto in = static_dims(p->inputs[0]), out = static_dims(v);
  if (!in || !out || in->size() != out->size()) return std::nullopt;
  Piece r{p->inputs[0]};
  if (p->op == OpKind::kSplit) {
    r.axis = p->attr_int("axis", 0);
    if (r.axis < 0) r.axis += int64_t(in->size());
    if (r.axis < 0 || r.axis >= int64_t(in->size())) return std::nullopt;
    for (Value* o : p->outputs) {
      const auto od = o ? static_dims(o) : std::nullopt;
      if (!od || od->size() != in->size()) return std::nullopt;
      if (o == v) {
        r.end = r.begin + (*od)[size_t(r.axis)];
        return r;
      }
      r.begin += (*od)[size_t(r.axis)];
    }
    return std::nullopt;
  }
  if (p->op != OpKind::kSlice || p->inputs.size() < 3) return std::nullopt;
  auto starts = constant_ints(u, p->inputs[1]), ends = constant_ints(u, p->inputs[2]);
  std::optional<std::vector<int64_t>> axes;
  if (p->has_input(3)) {
    axes = constant_ints(u, p->inputs[3]);
  } else if (starts) {
    axes = std::vector<int64_t>(starts->size());
    std::iota(axes->begin(), axes->end(), 0);
  }
  if (!starts || !ends || !axes || starts->size() != axes->size() || ends->size() != axes->size()) return std::nullopt;
  if (p->has_input(4)) {
    auto steps = constant_ints(u, p->inputs[4]);
    if (!steps || !std::all_of(steps->begin(), steps->end(), [](int64_t s) { return s == 1; })) return std::nullopt;
  }
  // With unit steps a cut axis is the one whose length changed; every other listed axis is whole.
  int cut = -1;
  for (size_t d = 0; d < in->size(); ++d) {
    if ((*in)[d] == (*out)[d]) continue;
    if (cut >= 0) return std::nullopt;
    cut = int(d);
  }
  if (cut < 0) return std::nullopt;  // the whole input: match_slice_whole's case
  for (size_t i = 0; i < axes->size(); ++i) {
    int64_t a = (*axes)[i] < 0 ? (*axes)[i] + int64_t(in->size()) : (*axes)[i];
    if (a != cut) continue;
    const int64_t dim = (*in)[size_t(cut)];
    int64_t b = (*starts)[i] < 0 ? (*starts)[i] + dim : (*starts)[i];
    b = std::clamp<int64_t>(b, 0, dim);
    r.axis = cut;
    r.begin = b;
    r.end = b + (*out)[size_t(cut)];
    return r.end <= dim ? std::optional<Piece>(r) : std::nullopt;
  }
  return std::nullopt;
}

// Runs [first, last) of Concat inputs that are adjacent pieces of one value along the Concat's axis.
std::vector<std::pair<size_t, size_t>> piece_runs(const UseMap& u, const Node& n) {
  std::vector<std::pair<size_t, size_t>> runs;
  auto r = rank_of(n.has_output(0) ? n.outputs[0] : nullptr);
  if (!r || n.inputs.size() < 2) return runs;
  int64_t axis = n.attr_int("axis", 0);
  if (axis < 0) axis += int64_t(*r);
  std::vector<std::optional<Piece>> ps;
  for (Value* v : n.inputs) {
    auto p = piece_of(u, v);
    ps.push_back(p && p->axis == axis ? p : std::nullopt);
  }
  for (size_t i = 0; i < ps.size();) {
    size_t j = i + 1;
    while (ps[i] && j < ps.size() && ps[j] && ps[j]->src == ps[i]->src && ps[j]->begin == ps[j - 1]->end) ++j;
    if (j - i >= 2) runs.emplace_back(i, j);
    i = j;
  }
  return runs;
}

// A run becomes its source when it covers the source's axis; else the run's first Slice, when only
// this Concat reads it, is widened to the run (no new node: the driver is walking the node list).
bool run_mergeable(const UseMap& u, const Node& n, std::pair<size_t, size_t> run) {
  Value* first = n.inputs[run.first];
  const Piece a = *piece_of(u, first), b = *piece_of(u, n.inputs[run.second - 1]);
  if (a.begin == 0 && b.end == (*static_dims(a.src))[size_t(a.axis)]) return true;
  return first->producer->op == OpKind::kSlice && u.num_uses(first) == 1 && !u.is_output(first);
}

bool match_concat_pieces(const UseMap& u, const Node& n) {
  for (auto run : piece_runs(u, n)) {
    if (run_mergeable(u, n, run)) return true;
  }
  return false;
}

void apply_concat_pieces(UseMap& u, Node& n) {
  std::vector<Value*> keep, dropped;
  size_t at = 0;
  for (auto run : piece_runs(u, n)) {
    if (!run_mergeable(u, n, run)) continue;
    keep.insert(keep.end(), n.inputs.begin() + long(at), n.inputs.begin() + long(run.first));
    Value* first = n.inputs[run.first];
    const Piece a = *piece_of(u, first), b = *piece_of(u, n.inputs[run.second - 1]);
    if (a.begin == 0 && b.end == (*static_dims(a.src))[size_t(a.axis)]) {
      keep.push_back(a.src);
    } else {
      Node* s = first->producer;
      Graph& g = u.graph();
      for (size_t i = 1; i < s->inputs.size(); ++i) {
        if (s->inputs[i]) dropped.push_back(s->inputs[i]);
        u.set_input(s, i, nullptr);
      }
      s->inputs.resize(4);
      u.set_input(s, 1, add_i64_constant(g, first->name + "_starts", {a.begin}));
      u.set_input(s, 2, add_i64_constant(g, first->name + "_ends", {b.end}));
      u.set_input(s, 3, add_i64_constant(g, first->name + "_axes", {a.axis}));
      first->type.shape->dims[size_t(a.axis)] = Dim(b.end - a.begin);
      keep.push_back(first);
    }
    at = run.second;
  }
  keep.insert(keep.end(), n.inputs.begin() + long(at), n.inputs.end());
  for (size_t i = 0; i < n.inputs.size(); ++i) u.set_input(&n, i, nullptr);
  n.inputs.assign(keep.size(), nullptr);
  for (size_t i = 0; i < keep.size(); ++i) u.set_input(&n, i, keep[i]);
  erase_unused_constants(u, dropped);
}

// Sum of one input is that input; of two, an Add (same broadcasting): ONNX's expanded function
// bodies write Sum, and the fusions (fuse-gelu) and backends match Add.
bool match_sum1(const UseMap& u, const Node& n) {
  return n.inputs.size() == 1 && n.inputs[0] && forwardable(u, n, n.inputs[0]) &&
         n.outputs[0]->type == n.inputs[0]->type;
}
bool match_sum2(const UseMap&, const Node& n) { return n.inputs.size() == 2 && n.inputs[0] && n.inputs[1]; }
void apply_sum2(UseMap&, Node& n) { n.op = OpKind::kAdd; }

// Gather along an axis of size n with constant indices 0, 1, .., n-1 in order (any index shape)
// reads every element once, in memory order: the result is data reshaped. transformers 5 gathers
// BERT's padding mask this way (indices b * S + j over the flattened [B*S, 1] mask); as a Reshape
// it is free on the GPU and lets the mask's Cast join the elementwise kernel after it.
bool match_gather_arange(const UseMap& u, const Node& n) {
  if (n.inputs.size() != 2 || !n.inputs[0] || !n.has_output(0)) return false;
  const auto out = static_dims(n.outputs[0]);
  // A 0 in a Reshape target copies the input's dim (allowzero = 0): empty results are left alone.
  if (!out || std::find(out->begin(), out->end(), 0) != out->end()) return false;
  const auto r = rank_of(n.inputs[0]);
  const auto data = static_dims(n.inputs[0]);
  const Tensor* idx = constant_of(u.graph(), n.inputs[1]);
  if (!r || !data || !idx || !dtype_is_int(idx->dtype())) return false;
  int64_t axis = n.attr_int("axis", 0);
  if (axis < 0) axis += int64_t(*r);
  if (axis < 0 || axis >= int64_t(*r)) return false;
  const int64_t len = (*data)[size_t(axis)];
  if (idx->numel() != len) return false;
  const std::vector<int64_t> v = idx->to_int_vector();
  for (int64_t i = 0; i < len; ++i) {
    if (v[size_t(i)] != i && v[size_t(i)] != i - len) return false;
  }
  return true;
}
void apply_gather_arange(UseMap& u, Node& n) {
  const std::vector<int64_t> dims = *static_dims(n.outputs[0]);
  Graph& g = u.graph();
  Value* shape = g.add_constant(g.unique_name(n.outputs[0]->name + "_shape"),
                                Tensor::from_vector<int64_t>(dims, {int64_t(dims.size())}));
  Value* idx = n.inputs[1];
  u.set_input(&n, 1, shape);
  n.op = OpKind::kReshape;
  n.attrs.clear();
  erase_unused_constants(u, {idx});
}

// Compress along an axis with a constant condition (a value input bound as one, or a folded mask)
// selects fixed positions: a Gather with those indices, which every backend runs. Entries past
// the condition's length select nothing, as ONNX says.
bool match_compress_constant(const UseMap& u, const Node& n) {
  if (!n.has_attr("axis") || n.inputs.size() != 2 || !n.inputs[0] || !rank_of(n.inputs[0])) return false;
  const Tensor* c = constant_of(u.graph(), n.inputs[1]);
  return c && c->rank() == 1;
}
void apply_compress_constant(UseMap& u, Node& n) {
  const Tensor& c = *constant_of(u.graph(), n.inputs[1]);
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < c.numel(); ++i) {
    if (c.as_double(i) != 0) idx.push_back(i);
  }
  Graph& g = u.graph();
  Value* iv = g.add_constant(g.unique_name(n.outputs[0]->name + "_indices"),
                             Tensor::from_vector<int64_t>(idx, {int64_t(idx.size())}));
  Value* cond = n.inputs[1];
  u.set_input(&n, 1, iv);
  n.op = OpKind::kGather;
  erase_unused_constants(u, {cond});
}

const Rule kRules[] = {
    {OpKind::kIdentity, "Identity(x) -> x", match_input0, apply_input0},
    {OpKind::kDropout, "Dropout(x) -> x in inference, mask unread", match_dropout, apply_input0},
    {OpKind::kCast, "Cast(x: T, to=T) -> x", match_cast_same, apply_input0},
    {OpKind::kCast, "Cast(Cast(x: T1, to=T2), to=T1) -> x when T2 holds every T1 exactly", match_cast_pair,
     apply_cast_pair},
    {OpKind::kCast, "Cast(Cast(x: T1, to=T2), to=T3) -> Cast(x, to=T3) when T2 holds every T1 exactly",
     match_cast_chain, apply_cast_chain},
    {OpKind::kReshape, "Reshape(x: S, S) -> x (static)", match_same_shape, apply_input0},
    {OpKind::kReshape, "Reshape(Reshape(x, s1), s2) -> Reshape(x, s2), s2 constant without 0", match_reshape_pair,
     apply_reshape_pair},
    {OpKind::kExpand, "Expand(x: S, ...) -> x when the result is S (static)", match_same_shape, apply_input0},
    {OpKind::kTranspose, "Transpose(x, [0, 1, ..]) -> x", match_transpose_identity, apply_input0},
    {OpKind::kTranspose, "Transpose(Transpose(x, p1), p2) -> Transpose(x, p1[p2])", match_transpose_pair,
     apply_transpose_pair},
    {OpKind::kSqueeze, "Squeeze(Unsqueeze(x, a), a) -> x", match_squeeze_unsqueeze, apply_inner_input0},
    {OpKind::kUnsqueeze, "Unsqueeze(Squeeze(x, a), a) -> x", match_unsqueeze_squeeze, apply_inner_input0},
    {OpKind::kPad, "Pad(x, all pads 0) -> x", match_pad_zero, apply_input0},
    {OpKind::kSlice, "Slice(x) -> x when unit steps keep its static shape", match_slice_whole, apply_input0},
    {OpKind::kConcat, "Concat(.., empty, ..) -> Concat without the empty inputs", match_concat_empty, apply_concat_empty},
    {OpKind::kConcat, "Concat(x) -> x", match_concat1, apply_input0},
    {OpKind::kConcat, "Concat(.., x[a:b], x[b:c], ..) -> Concat(.., x[a:c], ..) along the Concat's axis",
     match_concat_pieces, apply_concat_pieces},
    {OpKind::kSum, "Sum(x) -> x", match_sum1, apply_input0},
    {OpKind::kSum, "Sum(a, b) -> Add(a, b)", match_sum2, apply_sum2},
    {OpKind::kGather, "Gather(x, [0, 1, .., n-1] along an axis of n) -> Reshape(x, result shape)", match_gather_arange,
     apply_gather_arange},
    {OpKind::kCompress, "Compress(x, constant condition, axis) -> Gather(x, the selected positions, axis)",
     match_compress_constant, apply_compress_constant},
};

}  // namespace

Expected<bool> canonicalize(Graph& g) {
  bool changed_any = false;
  // A rewrite can expose another (a Transpose pair composing to the identity): sweep again.
  for (int sweep = 0; sweep < 16; ++sweep) {
    UseMap uses(g);
    std::vector<Node*> touched;  // rewritten nodes and their former producers: maybe unread now
    for (const auto& np : g.nodes) {
      Node& n = *np;
      for (const Rule& r : kRules) {
        if (r.op != n.op || !r.match(uses, n)) continue;
        for (const Value* v : n.inputs) {
          if (v && v->producer) touched.push_back(v->producer);
        }
        r.apply(uses, n);
        touched.push_back(&n);
        break;
      }
    }
    if (touched.empty()) break;
    changed_any = true;
    // erase_unused wants later nodes last; producers were pushed before their readers.
    std::vector<Node*> order;
    std::set<const Node*> want(touched.begin(), touched.end());
    for (const auto& np : g.nodes) {
      if (want.count(np.get())) order.push_back(np.get());
    }
    erase_unused(uses, order);
  }
  return changed_any;
}

}  // namespace kiln
