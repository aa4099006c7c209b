// Plans of host steps: planning (slot assignment and liveness, once at build), verification (once
// at load) and execution (per run).
#include "runtime/plan.h"

#include <map>
#include <unordered_map>

#include "backends/backend.h"
#include "ops/op_registry.h"

namespace kiln {

std::string_view step_kind_name(StepKind k) {
  switch (k) {
    case StepKind::kHostOp: return "host-op";
  }
  return "?";
}

void values_read(const Graph& g, const Node& n, std::vector<const Value*>& out) {
  for (const Value* in : n.inputs) {
    if (in && in->owner == &g) out.push_back(in);
  }
  auto body = [&](const Graph& sg) {
    for (const auto& sn : sg.nodes) values_read(g, *sn, out);
    for (const Value* o : sg.outputs) {
      if (o && o->owner == &g) out.push_back(o);
    }
  };
  for (const auto& [key, attr] : n.attrs) {
    if (attr.g) body(*attr.g);
    for (const auto& sg : attr.graphs) body(*sg);
  }
}

Status verify_cpu_kernels(const Plan& p) {
  for (const PlanStep& s : p.steps) {
    const Node& n = *p.graph->nodes[s.node];
    if (!op_def(n.op).cpu) return KILN_ERROR(kUnsupported, "{}: op {} has no CPU kernel", n.describe(), op_name(n.op));
  }
  return Status::ok();
}

std::string plan_report(const Plan& p) {
  size_t weight_bytes = 0;
  for (const Value* c : p.constants) weight_bytes += c->constant->nbytes();
  std::map<std::string, int> ops;
  for (const PlanStep& s : p.steps) ops[std::string(op_name(p.graph->nodes[s.node]->op))]++;
  std::string r = fmt::format("device: cpu (reference kernels)\nsteps: {} host steps, {} value slots\nweights: {:.1f} MiB\n",
                              p.steps.size(), p.slots, double(weight_bytes) / (1 << 20));
  r += "placement: every node on the CPU; ops:";
  for (const auto& [op, count] : ops) r += fmt::format(" {} x{}", op, count);
  return r + "\n";
}

Expected<Plan> plan_host(std::unique_ptr<Graph> g, bool require_cpu_kernels) {
  Plan p;
  std::unordered_map<const Value*, ValueRef> ref;
  auto constant = [&](const Value* v) {
    auto it = ref.find(v);
    if (it != ref.end()) return it->second;
    ValueRef r{ValueRef::Kind::kConstant, uint32_t(p.constants.size())};
    p.constants.push_back(v);
    ref[v] = r;
    return r;
  };
  auto new_slot = [&](const Value* v) {
    ValueRef r{ValueRef::Kind::kSlot, p.slots++};
    ref[v] = r;
    return r;
  };
  for (const Value* v : g->inputs) p.inputs.push_back(v ? new_slot(v) : ValueRef{});
  for (size_t i = 0; i < g->nodes.size(); ++i) {
    const Node* n = g->nodes[i].get();
    if (require_cpu_kernels && !op_def(n->op).cpu) {
      return KILN_ERROR(kUnsupported, "{}: op {} has no CPU kernel", n->describe(), op_name(n->op));
    }
    PlanStep s;
    s.node = uint32_t(i);
    for (const Value* v : n->inputs) {
      if (!v) { s.inputs.push_back({}); continue; }
      auto it = ref.find(v);
      if (it != ref.end()) s.inputs.push_back(it->second);
      else if (v->constant) s.inputs.push_back(constant(v));
      else return KILN_ERROR(kInternal, "{}: input '{}' is read before it is defined", n->describe(), v->name);
    }
    for (const Value* v : n->outputs) s.outputs.push_back(v ? new_slot(v) : ValueRef{});
    p.steps.push_back(std::move(s));
  }
  for (const Value* v : g->outputs) {
    auto it = ref.find(v);
    if (it != ref.end()) p.outputs.push_back(it->second);
    else if (v && v->constant) p.outputs.push_back(constant(v));
    else return KILN_ERROR(kInternal, "graph output '{}' has no value", v ? v->name : "_");
  }
  // Liveness: a slot is released after its last reader (including reads from subgraph bodies);
  // graph outputs are never released.
  std::vector<int64_t> last(p.slots, -1);
  for (size_t i = 0; i < g->nodes.size(); ++i) {
    std::vector<const Value*> read;
    values_read(*g, *g->nodes[i], read);
    for (const Value* v : read) {
      auto it = ref.find(v);
      if (it != ref.end() && it->second.kind == ValueRef::Kind::kSlot) last[it->second.index] = int64_t(i);
    }
  }
  for (const ValueRef& o : p.outputs) {
    if (o.kind == ValueRef::Kind::kSlot) last[o.index] = int64_t(p.steps.size());
  }
  // A slot no step reads (an unused output) is released right after the step that wrote it.
  for (size_t i = 0; i < p.steps.size(); ++i) {
    for (const ValueRef& o : p.steps[i].outputs) {
      if (o.kind == ValueRef::Kind::kSlot && last[o.index] < 0) last[o.index] = int64_t(i);
    }
  }
  for (uint32_t s = 0; s < p.slots; ++s) {
    if (last[s] >= 0 && size_t(last[s]) < p.steps.size()) p.steps[size_t(last[s])].frees.push_back(s);
  }
  p.graph = std::move(g);
  KILN_RETURN_IF_ERROR(verify_plan(p));
  return p;
}

Status verify_plan(const Plan& p) {
  if (!p.graph) return KILN_ERROR(kInvalidModel, "plan has no graph");
  const Graph& g = *p.graph;
  auto bad = [](const std::string& what) { return KILN_ERROR(kInvalidModel, "inconsistent plan: {}", what); };
  if (p.inputs.size() != g.inputs.size() || p.outputs.size() != g.outputs.size()) {
    return bad("input/output count differs from the graph's");
  }
  for (const Value* c : p.constants) {
    if (!c || !c->constant || c->owner != &g) return bad("a constant that is not a constant of the graph");
  }
  std::vector<char> written(p.slots, 0);
  for (const ValueRef& r : p.inputs) {
    if (r.kind == ValueRef::Kind::kConstant) return bad("an input bound to a constant");
    if (r.kind == ValueRef::Kind::kSlot) {
      if (r.index >= p.slots || written[r.index]) return bad("input slot out of range or bound twice");
      written[r.index] = 1;
    }
  }
  auto check_read = [&](const ValueRef& r, const std::string& where) -> Status {
    if (r.kind == ValueRef::Kind::kSlot && (r.index >= p.slots || !written[r.index])) {
      return bad(where + " reads a slot that holds no value");
    }
    if (r.kind == ValueRef::Kind::kConstant && r.index >= p.constants.size()) return bad(where + ": constant out of range");
    return Status::ok();
  };
  for (size_t i = 0; i < p.steps.size(); ++i) {
    const PlanStep& s = p.steps[i];
    std::string where = fmt::format("step {}", i);
    if (s.node >= g.nodes.size()) return bad(where + ": node out of range");
    const Node& n = *g.nodes[s.node];
    if (s.inputs.size() != n.inputs.size() || s.outputs.size() != n.outputs.size()) {
      return bad(fmt::format("{} ({}): arity differs from the node's", where, n.describe()));
    }
    for (size_t k = 0; k < s.inputs.size(); ++k) {
      if ((s.inputs[k].kind == ValueRef::Kind::kNone) != (n.inputs[k] == nullptr)) return bad(where + ": input presence differs");
      KILN_RETURN_IF_ERROR(check_read(s.inputs[k], where));
    }
    for (size_t k = 0; k < s.outputs.size(); ++k) {
      const ValueRef& r = s.outputs[k];
      if ((r.kind == ValueRef::Kind::kNone) != (n.outputs[k] == nullptr)) return bad(where + ": output presence differs");
      if (r.kind == ValueRef::Kind::kConstant) return bad(where + ": writes a constant");
      if (r.kind == ValueRef::Kind::kSlot) {
        if (r.index >= p.slots || written[r.index]) return bad(where + ": output slot out of range or written twice");
        written[r.index] = 1;
      }
    }
    for (uint32_t f : s.frees) {
      if (f >= p.slots || !written[f]) return bad(where + ": frees a slot that holds no value");
    }
  }
  for (const ValueRef& r : p.outputs) {
    if (r.kind == ValueRef::Kind::kNone) return bad("a graph output with no value");
    KILN_RETURN_IF_ERROR(check_read(r, "graph output"));
  }
  return Status::ok();
}

Expected<std::vector<Data>> run_plan(const Plan& p, std::vector<Data> inputs) {
  const Graph& g = *p.graph;
  KILN_RETURN_IF_ERROR(verify_cpu_kernels(p));
  KILN_RETURN_IF_ERROR(check_inputs(g, inputs));
  std::vector<Data> slots(p.slots);
  std::vector<Data> constants;
  constants.reserve(p.constants.size());
  for (const Value* c : p.constants) constants.emplace_back(*c->constant);  // shares the buffer
  auto at = [&](const ValueRef& r) -> const Data* {
    switch (r.kind) {
      case ValueRef::Kind::kNone: return nullptr;
      case ValueRef::Kind::kSlot: return &slots[r.index];
      case ValueRef::Kind::kConstant: return &constants[r.index];
    }
    return nullptr;
  };
  for (size_t i = 0; i < p.inputs.size(); ++i) {
    if (p.inputs[i].kind == ValueRef::Kind::kSlot && i < inputs.size()) slots[p.inputs[i].index] = std::move(inputs[i]);
  }
  // Subgraph bodies read top-level values by pointer: resolve them to where the plan holds them.
  std::unordered_map<const Value*, ValueRef> by_value;
  for (size_t i = 0; i < g.inputs.size(); ++i) by_value[g.inputs[i]] = p.inputs[i];
  for (const PlanStep& s : p.steps) {
    const Node& n = *g.nodes[s.node];
    for (size_t k = 0; k < n.outputs.size(); ++k) by_value[n.outputs[k]] = s.outputs[k];
  }
  ValueLookup outer = [&](const Value* v) -> const Data* {
    auto it = by_value.find(v);
    if (it != by_value.end()) return at(it->second);
    return nullptr;
  };
  for (const PlanStep& s : p.steps) {
    const Node& n = *g.nodes[s.node];
    std::vector<const Data*> ins;
    ins.reserve(s.inputs.size());
    for (const ValueRef& r : s.inputs) ins.push_back(at(r));
    KILN_ASSIGN_OR_RETURN(std::vector<Data> outs, run_node_on_cpu(n, std::move(ins), outer));
    for (size_t k = 0; k < s.outputs.size(); ++k) {
      if (s.outputs[k].kind == ValueRef::Kind::kSlot) slots[s.outputs[k].index] = std::move(outs[k]);
    }
    for (uint32_t f : s.frees) slots[f] = Data();
  }
  std::vector<Data> outs;
  for (const ValueRef& r : p.outputs) outs.push_back(*at(r));
  return outs;
}

}  // namespace kiln
