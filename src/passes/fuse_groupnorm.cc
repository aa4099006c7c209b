// fuse-groupnorm: GroupNorm as exporters before opset 18 write it (torch.onnx: a Reshape to
// [N, G, -1], InstanceNormalization with unit scale and zero bias, a Reshape back, then the
// per-channel affine as Mul and Add) becomes one GroupNormalization node with per-channel scale
// and bias (opset 21's form): one statistics pass and one normalizing pass instead of a layout
// round trip, a norm and an elementwise pass per GroupNorm (diffusion UNets have dozens).
//
//   Before:  %r = Reshape(%x, %s1) : f32[2,32,2048]                  (%s1 = const [2, 32, -1])
//            %i = InstanceNormalization(%r, %ones, %zeros) {epsilon = 1e-05} : f32[2,32,2048]
//            %b = Reshape(%i, %s2) : f32[2,64,32,32]                   (%x's shape)
//            %m = Mul(%b, %gamma) : f32[2,64,32,32]                    (%gamma: const f32[64,1,1])
//            %y = Add(%m, %beta) : f32[2,64,32,32] @gn                 (%beta: const f32[64,1,1])
//   After:   %y = GroupNormalization(%x, %gamma_c, %beta_c) {epsilon = 1e-05, num_groups = 32} @gn
//
// The Mul and Add are optional (affine=False); either operand order. Preconditions, all checked:
// x is an f32 tensor [N, C, ...] of static shape (what fp32 exports write); the first Reshape gives [N, G, C/G * spatial];
// InstanceNormalization's scale is all ones and its bias all zeros; the second Reshape gives x's
// shape back; gamma and beta are constants with C elements laid out along the channel axis
// ([C,1,...] or [1,C,1,...]); every intermediate has one reader and is not a graph output. The
// last node of the chain becomes the new one, keeping its name and output. Run after
// fold-constants (constant Reshape targets and parameters).
#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln {

namespace {

bool all_equal(const Tensor* t, double v) {
  if (!t) return false;
  for (int64_t i = 0; i < t->numel(); ++i) {
    if (t->as_double(i) != v) return false;
  }
  return true;
}

// The position a constant of dims `d` broadcast against [N, C, spatial...] puts its C at, or -1.
int64_t channel_axis_of(const Tensor& t, size_t x_rank) {
  const size_t r = t.rank();
  if (r > x_rank) return -1;
  int64_t axis = -1;
  for (size_t i = 0; i < r; ++i) {
    if (t.dim(i) != 1) {
      if (axis >= 0) return -1;
      axis = int64_t(x_rank - r + i);
    }
  }
  return axis;
}

}  // namespace

Expected<bool> fuse_groupnorm(Graph& g) {
  UseMap uses(g);
  std::vector<Node*> norms;
  for (const auto& np : g.nodes) {
    if (np->op == OpKind::kInstanceNormalization) norms.push_back(np.get());
  }
  bool changed = false;
  for (Node* in : norms) {
    Node* r1 = sole_producer(uses, in->inputs[0], OpKind::kReshape);
    if (!r1) continue;
    Value* x = r1->inputs[0];
    if (!x->type.is_tensor() || !x->type.has_rank() || !x->type.shape->is_static() || x->type.dtype != DType::kFloat32) continue;
    const std::vector<int64_t> xd = *x->type.shape->static_dims();
    if (xd.size() < 3) continue;
    const Type& rt = in->inputs[0]->type;
    if (!rt.has_rank() || rt.shape->rank() != 3 || !rt.shape->is_static()) continue;
    const std::vector<int64_t> rd = *rt.shape->static_dims();
    const int64_t n = xd[0], c = xd[1], groups = rd[1];
    if (rd[0] != n || groups < 1 || c % groups != 0) continue;
    if (!all_equal(constant_of(g, in->inputs[1]), 1.0) || !all_equal(constant_of(g, in->inputs[2]), 0.0)) continue;
    Node* r2 = sole_reader(uses, in->outputs[0], OpKind::kReshape);
    if (!r2 || !r2->outputs[0]->type.has_rank() || r2->outputs[0]->type.shape->static_dims() != xd) continue;
    const double eps = in->attr_float("epsilon", 1e-5f);
    Node* last = r2;
    std::vector<Node*> absorbed = {r1, in};
    std::vector<double> gamma(size_t(c), 1.0), beta(size_t(c), 0.0);
    auto channel_const = [&](const Value* v) -> std::optional<std::vector<double>> {
      const Tensor* t = constant_of(g, v);
      if (!t || t->numel() != c || !is_float(t->dtype())) return std::nullopt;
      if (c > 1 && channel_axis_of(*t, xd.size()) != 1) return std::nullopt;
      std::vector<double> out;
      for (int64_t i = 0; i < c; ++i) out.push_back(t->as_double(i));
      return out;
    };
    if (Node* mul = sole_reader(uses, last->outputs[0], OpKind::kMul)) {
      const Value* other = mul->inputs[0] == last->outputs[0] ? mul->inputs[1] : mul->inputs[0];
      auto v = channel_const(other);
      if (v && mul->outputs[0]->type == x->type) {
        gamma = *v;
        absorbed.push_back(last);
        last = mul;
      }
    }
    if (Node* add = sole_reader(uses, last->outputs[0], OpKind::kAdd)) {
      const Value* other = add->inputs[0] == last->outputs[0] ? add->inputs[1] : add->inputs[0];
      auto v = channel_const(other);
      if (v && add->outputs[0]->type == x->type) {
        beta = *v;
        absorbed.push_back(last);
        last = add;
      }
    }
    // The last node becomes the GroupNormalization: its output keeps its name, type and readers.
    const std::string base = last->name.empty() ? "groupnorm" : last->name;
    Value* sv = add_f32_constant(g, base + "_scale", {c}, gamma);
    Value* bv = add_f32_constant(g, base + "_bias", {c}, beta);
    uses.remove_node(last);
    last->op = OpKind::kGroupNormalization;
    last->inputs = {x, sv, bv};
    last->attrs.clear();
    last->attrs["num_groups"] = Attribute::of_int(groups);
    last->attrs["epsilon"] = Attribute::of_float(float(eps));
    uses.add_node(last);
    for (Node* a : absorbed) g.note_absorbed(*a, *last);
    changed = true;
  }
  if (changed) KILN_RETURN_IF_ERROR(eliminate_dead_code(g).status());
  return changed;
}

}  // namespace kiln
