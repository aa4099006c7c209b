// Multi-node patterns the lowering runs as one kernel, found before lowering starts (so the inner
// nodes are skipped as they come up in topological order): Attention nodes with the views that
// feed them (lower_attention.cc), an activation read by a depthwise convolution (lower_conv_depthwise.cc) and a
// broadcast Add read by a GroupNorm (lower_norm.cc), a squeeze-and-excitation gate
// (lower_squeeze_excite.cc). Which nodes fuse is mostly the graph passes' decision (fuse-gelu,
// fuse-attention...) and these choose how a fused node is run; the squeeze-excite gate is a chain of
// plain nodes that the CUDA lowering runs as one kernel.
#include "backends/cuda/lower.h"

namespace kiln::cuda {

namespace {

bool same_dims(const Value* a, const Value* b) {
  return a->type.shape && b->type.shape && a->type.shape->static_dims() &&
         a->type.shape->static_dims() == b->type.shape->static_dims();
}

}  // namespace

std::optional<ActMatch> match_act(const Lowering& L, const Value* v) {
  const std::vector<const Node*>& rd = L.readers(v);
  if (L.is_graph_output(v)) return std::nullopt;
  ActMatch m;
  if (rd.size() == 2) {  // SiLU as exporters write it: Mul(v, Sigmoid(v))
    const Node* sig = rd[0]->op == OpKind::kSigmoid ? rd[0] : rd[1];
    const Node* mul = sig == rd[0] ? rd[1] : rd[0];
    if (sig->op != OpKind::kSigmoid || mul->op != OpKind::kMul || mul->inputs.size() != 2 ||
        L.only_consumer(sig->outputs[0]) != mul) {
      return std::nullopt;
    }
    const Value *a = mul->inputs[0], *b = mul->inputs[1], *s = sig->outputs[0];
    if (!((a == v && b == s) || (a == s && b == v)) || !same_dims(v, mul->outputs[0])) return std::nullopt;
    m.op = k::Unary::kSilu;
    m.nodes = {sig, mul};
    m.out = mul->outputs[0];
    return m;
  }
  if (rd.size() != 1) return std::nullopt;
  const Node& n = *rd[0];
  if (n.inputs.empty() || n.inputs[0] != v || n.outputs.size() != 1 || !same_dims(v, n.outputs[0])) return std::nullopt;
  switch (n.op) {
    case OpKind::kRelu: m.op = k::Unary::kRelu; break;
    case OpKind::kSigmoid: m.op = k::Unary::kSigmoid; break;
    case OpKind::kTanh: m.op = k::Unary::kTanh; break;
    case OpKind::kHardSwish: m.op = k::Unary::kHardSwish; break;
    case OpKind::kHardSigmoid:
      m.op = k::Unary::kHardSigmoid;
      m.p.a = n.attr_float("alpha", 0.2f);
      m.p.b = n.attr_float("beta", 0.5f);
      break;
    case OpKind::kLeakyRelu:
      m.op = k::Unary::kLeakyRelu;
      m.p.a = n.attr_float("alpha", 0.01f);
      break;
    case OpKind::kGelu:
      m.op = n.attr_string("approximate", "none") == "tanh" ? k::Unary::kGeluTanh : k::Unary::kGeluErf;
      break;
    case OpKind::kClip: {
      m.op = k::Unary::kClip;
      m.p.a = -INFINITY;
      m.p.b = INFINITY;
      for (size_t i = 1; i < 3; ++i) {
        if (!n.has_input(i)) continue;
        const Tensor* c = L.constant(n.inputs[i]);
        if (!c || c->numel() != 1) return std::nullopt;
        (i == 1 ? m.p.a : m.p.b) = float(c->as_double(0));
      }
      break;
    }
    case OpKind::kFusedElementwise:
      if (!is_silu(n)) return std::nullopt;
      m.op = k::Unary::kSilu;
      break;
    default: return std::nullopt;
  }
  m.nodes = {&n};
  m.out = n.outputs[0];
  return m;
}

void find_patterns(Lowering& L) {
  find_attention(L);
  find_conv_input_acts(L);
  find_norm_input_bias(L);
  find_squeeze_excite(L);
}

Status lower_replacement(Lowering& L, const Node& n, const Replacement& r) {
  return r.squeeze_excite ? lower_squeeze_excite(L, n, *r.squeeze_excite) : lower_attention(L, n, *r.attention);
}

}  // namespace kiln::cuda
