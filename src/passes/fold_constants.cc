#include "passes/fold_constants.h"

#include "backends/backend.h"
#include "ops/infer.h"
#include "ops/op_registry.h"
#include "passes/rewrite.h"

namespace kiln {

namespace {

// A lookup that repeats one row of a small table over the batch and sequence (BERT's token-type
// embeddings of constant all-zero ids: [B, S, H] from a [2, H] table) stays a node: folded, it is a
// weight as large as the activations holding one row, made again for every input shape of a dynamic
// engine. A lookup by varied indices (T5's relative position buckets) folds as any node does.
bool repeats_one_row(const Node& n, const std::vector<Data>& held, int64_t out_elements, int64_t in_elements) {
  if (n.op != OpKind::kGather || out_elements <= (int64_t(1) << 16) || out_elements <= 4 * in_elements) return false;
  if (held.size() < 2 || !held[1].is_tensor() || held[1].tensor.numel() == 0 || !held[1].tensor.raw()) return false;
  const Tensor& idx = held[1].tensor;
  const int64_t first = idx.as_int(0);
  for (int64_t i = 1; i < idx.numel(); ++i) {
    if (idx.as_int(i) != first) return false;
  }
  return true;
}

}  // namespace

Expected<bool> fold_node(const Node& n, const std::function<const Tensor*(const Value*)>& constant_of,
                         int64_t max_elements, std::vector<std::optional<Tensor>>* outs) {
  // A fused elementwise body reads only the node's inputs: it folds like the ops it holds (a graph
  // optimized with ranged dims fuses shape arithmetic that binding the dims later makes constant).
  if (is_random_op(n.op) || is_collective(n.op) || (has_subgraph(n) && n.op != OpKind::kFusedElementwise) || !op_def(n.op).cpu) return false;
  // Shape, Size and EyeLike read only their input's dims (and dtype).
  bool shape_only = n.op == OpKind::kShape || n.op == OpKind::kSize || n.op == OpKind::kEyeLike;
  // CastLike reads only the dtype of its second input: a constant cast to the dtype of a run-time
  // value folds (ONNX's expanded function bodies write their constants so: CastLike(0.5, X)).
  bool dtype_only = n.op == OpKind::kCastLike;
  std::vector<Data> held;
  held.reserve(n.inputs.size());
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const Value* v = n.inputs[i];
    if (!v) continue;
    if (const Tensor* c = constant_of(v)) {
      held.emplace_back(*c);
      continue;
    }
    if (dtype_only && i == 1 && v->type.is_tensor()) {
      held.emplace_back(Tensor::view(v->type.dtype, {0}, nullptr, nullptr));
      continue;
    }
    auto dims = shape_only && i == 0 ? static_dims(v) : std::nullopt;
    if (!dims || v->type.dtype == DType::kString) return false;
    // A zero-element view of the dims is enough.
    held.emplace_back(Tensor::view(v->type.dtype, *dims, nullptr, nullptr));
  }
  int64_t in_elements = 0;
  for (const Data& d : held) in_elements += d.tensor.numel();
  for (const Value* o : n.outputs) {
    if (!o) continue;
    auto dims = static_dims(o);
    if (!dims) continue;  // the kernel computes it; checked below
    // Checked: a hostile model's dims can overflow the product (the sanitizer lane found it).
    Expected<int64_t> numel = checked_numel(*dims);
    if (!numel || *numel > max_elements) return false;
    if (repeats_one_row(n, held, *numel, in_elements)) return false;
  }
  std::vector<const Data*> ins;
  size_t h = 0;
  for (const Value* v : n.inputs) ins.push_back(v ? &held[h++] : nullptr);
  // The CPU backend's node runner: it also runs a fused node's body (which reads nothing outside it).
  const ValueLookup no_outer = [](const Value*) -> const Data* { return nullptr; };
  Expected<std::vector<Data>> ran = run_node_on_cpu(n, std::move(ins), no_outer);
  if (!ran) {  // named once: the kernel's own error usually names the node already
    const std::string who = n.describe();
    return ran.status().message().rfind(who, 0) == 0 ? ran.status() : ran.status().with_context(who);
  }
  std::vector<Data>& res = *ran;
  std::vector<std::optional<Tensor>> r(n.outputs.size());
  for (size_t i = 0; i < n.outputs.size() && i < res.size(); ++i) {
    if (!n.outputs[i]) continue;
    if (!res[i].is_tensor() || res[i].tensor.numel() > max_elements) return false;
    if (repeats_one_row(n, held, res[i].tensor.numel(), in_elements)) return false;
    r[i] = std::move(res[i].tensor);
  }
  *outs = std::move(r);
  return true;
}

Expected<bool> fold_constants(Graph& g, int64_t max_elements) {
  auto constant_of = [](const Value* v) -> const Tensor* { return v->constant ? &*v->constant : nullptr; };
  bool changed_any = false;
  for (int round = 0; round < 16; ++round) {
    bool changed = false;
    std::vector<std::unique_ptr<Node>> kept;
    for (auto& up : g.nodes) {
      std::vector<std::optional<Tensor>> outs;
      KILN_ASSIGN_OR_RETURN(bool folded, fold_node(*up, constant_of, max_elements, &outs));
      if (!folded) {
        kept.push_back(std::move(up));
        continue;
      }
      for (size_t i = 0; i < up->outputs.size(); ++i) {
        Value* o = up->outputs[i];
        if (!o) continue;
        o->constant = std::move(*outs[i]);
        o->producer = nullptr;
        o->producer_output = 0;
        o->type = Type::tensor(o->constant->dtype(), Shape::of(o->constant->dims()));
      }
      changed = true;
    }
    g.nodes = std::move(kept);
    if (!changed) break;
    changed_any = true;
    KILN_RETURN_IF_ERROR(infer_types(g));
  }
  return changed_any;
}

}  // namespace kiln
