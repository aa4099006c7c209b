#include "runtime/node_cost.h"

#include <algorithm>
#include <set>

namespace kiln {

namespace {

std::optional<std::vector<int64_t>> dims_of(const Value* v) {
  if (!v || !v->type.shape) return std::nullopt;
  return v->type.shape->static_dims();
}

double numel_of(const Value* v) {
  auto d = dims_of(v);
  if (!d) return 0;
  double n = 1;
  for (int64_t x : *d) n *= double(x);
  return n;
}

}  // namespace

double value_bytes(const Value* v, size_t float_bytes) {
  const DType t = v->type.dtype;
  const bool is_float = t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kBFloat16;
  return numel_of(v) * (is_float ? double(float_bytes) : double(dtype_bits(t)) / 8.0);
}

double read_bytes(const Node& n, size_t i, size_t float_bytes) {
  const Value* v = n.inputs[i];
  // A gather or slice reads as many elements of its data as it writes, not the whole tensor (an
  // embedding table).
  const bool gathers = n.op == OpKind::kGather || n.op == OpKind::kGatherElements || n.op == OpKind::kGatherND ||
                       n.op == OpKind::kSlice;
  if (gathers && i == 0 && !n.outputs.empty() && n.outputs[0]) {
    return std::min(value_bytes(v, float_bytes), value_bytes(n.outputs[0], float_bytes));
  }
  return value_bytes(v, float_bytes);
}

namespace {

const Value* input(const Node& n, size_t i) { return i < n.inputs.size() ? n.inputs[i] : nullptr; }

// The product of v's dims from `from` on (a weight's per-output-channel size), 0 when unknown.
double prod_from(const Value* v, size_t from) {
  auto d = dims_of(v);
  if (!d) return 0;
  double p = 1;
  for (size_t i = from; i < d->size(); ++i) p *= double((*d)[i]);
  return p;
}

// A dim of v counted from the end (1: the last), 0 when unknown.
double dim_from_end(const Value* v, size_t k) {
  auto d = dims_of(v);
  return d && d->size() >= k ? double((*d)[d->size() - k]) : 0;
}

bool is_one_of(OpKind op, std::initializer_list<OpKind> ops) {
  for (OpKind o : ops) {
    if (o == op) return true;
  }
  return false;
}

}  // namespace

NodeCost node_cost(const Node& n, size_t float_bytes) {
  NodeCost c;
  std::set<const Value*> seen;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    if (n.inputs[i] && seen.insert(n.inputs[i]).second) c.bytes += read_bytes(n, i, float_bytes);
  }
  for (const Value* v : n.outputs) {
    if (v) c.bytes += value_bytes(v, float_bytes);
  }
  const double out = n.outputs.empty() ? 0 : numel_of(n.outputs[0]);
  const double in = numel_of(input(n, 0));
  const OpKind op = n.op;
  if (is_one_of(op, {OpKind::kMatMul, OpKind::kMatMulInteger, OpKind::kQuantizedMatMul})) {
    c.flops = 2 * out * dim_from_end(input(n, 0), 1);
  } else if (op == OpKind::kQLinearMatMul) {
    c.flops = 2 * out * dim_from_end(input(n, 0), 1);
  } else if (op == OpKind::kGemm) {
    c.flops = 2 * out * dim_from_end(input(n, 0), n.attr_int("transA", 0) != 0 ? 2 : 1) + (input(n, 2) ? out : 0);
  } else if (is_one_of(op, {OpKind::kConv, OpKind::kConvInteger})) {
    c.flops = 2 * out * prod_from(input(n, 1), 1);  // W [M, C/group, kernel...]
  } else if (op == OpKind::kQLinearConv) {
    c.flops = 2 * out * prod_from(input(n, 3), 1);
  } else if (op == OpKind::kConvTranspose) {
    c.flops = 2 * in * prod_from(input(n, 1), 1);  // each input element meets C_out/group * kernel weights
  } else if (op == OpKind::kAttention) {
    // Q K^T and P V: 2 * Sq * Skv * D each per head; Skv the new keys plus the past ones (input 4).
    c.flops = 2 * (in + out) * (dim_from_end(input(n, 1), 2) + dim_from_end(input(n, 4), 2));
  } else if (is_one_of(op, {OpKind::kLSTM, OpKind::kGRU, OpKind::kRNN})) {
    // Every step multiplies its input and its hidden state by W and R (all gates and directions).
    const double features = dim_from_end(input(n, 0), 1);
    c.flops = features > 0 ? 2 * (in / features) * (numel_of(input(n, 1)) + numel_of(input(n, 2))) : 0;
  } else if (op == OpKind::kFusedElementwise) {
    const Graph* body = n.attr_graph("body");
    c.flops = out * double(body && !body->nodes.empty() ? body->nodes.size() : 1);
  } else if (is_one_of(op, {OpKind::kSoftmax, OpKind::kLogSoftmax, OpKind::kLayerNormalization,
                            OpKind::kRMSNormalization, OpKind::kGroupNormalization, OpKind::kInstanceNormalization,
                            OpKind::kBatchNormalization, OpKind::kMeanVarianceNormalization})) {
    c.flops = 5 * in;  // statistics, then scale and shift
  } else if (is_one_of(op, {OpKind::kReduceSum, OpKind::kReduceMean, OpKind::kReduceMax, OpKind::kReduceMin,
                            OpKind::kReduceProd, OpKind::kReduceL1, OpKind::kReduceL2, OpKind::kReduceSumSquare,
                            OpKind::kReduceLogSum, OpKind::kReduceLogSumExp, OpKind::kGlobalAveragePool,
                            OpKind::kGlobalMaxPool, OpKind::kArgMax, OpKind::kArgMin})) {
    c.flops = in;
  } else if (is_one_of(op, {OpKind::kMaxPool, OpKind::kAveragePool, OpKind::kLpPool})) {
    double k = 1;
    for (int64_t x : n.attr_ints("kernel_shape")) k *= double(x);
    c.flops = out * k;
  } else {
    c.flops = out;
  }
  return c;
}

ValueReaders value_readers(const Graph& g) {
  ValueReaders r;
  for (const auto& n : g.nodes) {
    for (const Value* v : n->inputs) {
      if (v) r[v].push_back(n.get());
    }
  }
  for (const Value* v : g.outputs) r[v].push_back(nullptr);
  return r;
}

NodeCost group_cost(const std::vector<const Node*>& group, const ValueReaders& readers, size_t float_bytes) {
  NodeCost c;
  std::set<const Node*> members(group.begin(), group.end());
  std::set<const Value*> produced, read;
  for (const Node* n : group) {
    c.flops += node_cost(*n, float_bytes).flops;
    for (const Value* v : n->outputs) {
      if (v) produced.insert(v);
    }
  }
  for (const Node* n : group) {
    for (size_t i = 0; i < n->inputs.size(); ++i) {
      const Value* v = n->inputs[i];
      if (v && !produced.count(v) && read.insert(v).second) c.bytes += read_bytes(*n, i, float_bytes);
    }
  }
  // A produced value is written when the graph returns it (a null reader) or a node outside the
  // group reads it.
  for (const Value* v : produced) {
    auto it = readers.find(v);
    if (it == readers.end()) continue;
    const bool written = std::any_of(it->second.begin(), it->second.end(), [&](const Node* r) { return !r || !members.count(r); });
    if (written) c.bytes += value_bytes(v, float_bytes);
  }
  return c;
}

}  // namespace kiln
