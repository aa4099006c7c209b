// The placer (placement.h).
#include "runtime/placement.h"

#include <algorithm>
#include <limits>
#include <map>

#include "backends/backend.h"
#include "passes/fold_constants.h"

namespace kiln {

namespace {

// Outputs over this many elements stay computed at run time (a fold would trade a cheap op for a
// large weight); fold-constants uses the same bound.
constexpr int64_t kMaxFoldElements = int64_t(1) << 24;

// The bound for n: none for a Transpose whose every reader takes its result as a MatMul's or Gemm's
// weight (input B). The dynamo exporter writes a tied LM head as MatMul(x, Transpose(embedding)):
// folded, the backend prepares the weight once at build (its layout, padded columns) instead of
// transposing the vocabulary's table every forward; the weight is held twice, as the TorchScript
// export of the same model holds it.
int64_t fold_limit(const Node& n, const std::map<const Value*, std::vector<const Node*>>& readers,
                   const std::vector<Value*>& outputs) {
  if (n.op != OpKind::kTranspose || !n.has_output(0)) return kMaxFoldElements;
  const Value* v = n.outputs[0];
  auto it = readers.find(v);
  if (it == readers.end() || std::find(outputs.begin(), outputs.end(), v) != outputs.end()) return kMaxFoldElements;
  for (const Node* r : it->second) {
    const bool weight = (r->op == OpKind::kMatMul || r->op == OpKind::kGemm) && r->inputs.size() >= 2 &&
                        r->inputs[1] == v && r->inputs[0] != v && (r->inputs.size() < 3 || r->inputs[2] != v);
    if (!weight) return kMaxFoldElements;
  }
  return std::numeric_limits<int64_t>::max();
}

}  // namespace

std::string placement_name(Placement p, std::string_view device) {
  switch (p) {
    case Placement::kDevice: return std::string(device);
    case Placement::kHost: return "cpu";
    case Placement::kFolded: return "folded";
    case Placement::kAlias: return "alias";
    case Placement::kPass: return "pass";
  }
  return "?";
}

namespace {
// A row of a node fused at lowering: impl kFusedImpl, why kInto + target; add_provenance then
// gives it the target's impl and why kFusedInto + target (fused_into reads both).
const std::string kFusedImpl = "fused", kInto = "into ", kFusedInto = "fused into ";
}  // namespace

Expected<std::vector<NodePlacement>> place_nodes(const Graph& g, StepBackend& device, const Backend& host) {
  std::vector<NodePlacement> rows;
  auto known = [&device](const Value* v) { return device.constant(v); };
  std::map<const Value*, std::vector<const Node*>> readers;
  for (const auto& up : g.nodes) {
    for (const Value* in : up->inputs) {
      if (in) readers[in].push_back(up.get());
    }
  }
  for (const auto& up : g.nodes) {
    const Node& n = *up;
    if (const Node* into = device.fused_into(n)) {
      rows.push_back({n.describe(), Placement::kDevice, kFusedImpl, kInto + into->describe()});
      continue;
    }
    // Known inputs: evaluated now, on the CPU backend's kernels (passes/fold_constants.h).
    std::vector<std::optional<Tensor>> outs;
    KILN_ASSIGN_OR_RETURN(bool folded, fold_node(n, known, fold_limit(n, readers, g.outputs), &outs));
    if (folded) {
      for (size_t i = 0; i < n.outputs.size(); ++i) {
        if (n.outputs[i] && outs[i]) device.set_constant(n.outputs[i], std::move(*outs[i]));
      }
      rows.push_back({n.describe(), Placement::kFolded, "constant at build time", ""});
      continue;
    }
    Expected<StepBackend::Lowered> low = device.lower(n);
    if (low) {
      rows.push_back({n.describe(), low->alias ? Placement::kAlias : Placement::kDevice, low->impl, ""});
      continue;
    }
    if (low.status().code() != ErrorCode::kUnsupported) return low.status().with_context(n.describe());
    std::string why;
    if (!host.supports(n, &why)) {
      return KILN_ERROR(kUnsupported, "{}: no backend can run it ({}: {}; {}: {})", n.describe(), device.name(),
                        low.status().message(), host.name(), why);
    }
    KILN_RETURN_IF_ERROR(device.lower_host(n));
    rows.push_back({n.describe(), Placement::kHost, "cpu kernel", low.status().message()});
  }
  return rows;
}

std::optional<std::string> fused_into(const NodePlacement& p) {
  if (p.placement != Placement::kDevice) return std::nullopt;
  if (p.impl == kFusedImpl && p.why.rfind(kInto, 0) == 0) return p.why.substr(kInto.size());
  if (p.why.rfind(kFusedInto, 0) == 0) return p.why.substr(kFusedInto.size());  // after add_provenance
  return std::nullopt;
}

void add_provenance(const Graph& g, std::vector<NodePlacement>& nodes) {
  std::map<std::string, std::string> impl_of;  // describe() -> implementation
  for (const NodePlacement& p : nodes) {
    if (p.impl != kFusedImpl) impl_of[p.node] = p.impl;
  }
  for (NodePlacement& p : nodes) {  // nodes fused at lowering: their target's kernel
    if (p.impl != kFusedImpl) continue;
    const std::optional<std::string> target = fused_into(p);
    auto it = target ? impl_of.find(*target) : impl_of.end();
    if (it == impl_of.end()) continue;
    p.impl = it->second;
    p.why = kFusedInto + *target;
    impl_of[p.node] = p.impl;  // a graph pass's node may have been fused into this one
  }
  for (const Absorbed& a : g.absorbed) {
    NodePlacement p{a.node, Placement::kPass, "-", ""};
    if (a.into) {
      std::string target = a.into->describe();
      if (auto it = impl_of.find(target); it != impl_of.end()) p.impl = it->second;
      p.why = fmt::format("fused by graph pass {} into {}", a.pass, target);
    } else if (a.pass == "fold-constants") {
      p.why = "evaluated at build time (fold-constants)";
    } else {
      p.why = fmt::format("removed by graph pass {} (no work left)", a.pass);
    }
    nodes.push_back(std::move(p));
  }
}

}  // namespace kiln
