// The CPU reference backend: runs nodes one at a time in topological order with each op's CPU
// kernel. It is the oracle other backends are checked against, so it favours obvious
// correctness: every output is checked against its inferred type.
#include <unordered_map>

#include "backends/backend.h"
#include "ops/op_registry.h"

namespace kiln {

namespace {

// Values live in an environment; a subgraph's environment chains to its parent's so bodies can
// read enclosing values.
struct Env {
  const Env* parent = nullptr;
  const ValueLookup* outer = nullptr;  // at the root: values the caller holds (a plan's slots)
  std::unordered_map<const Value*, Data> values;

  const Data* find(const Value* v) const {
    for (const Env* e = this; e; e = e->parent) {
      auto it = e->values.find(v);
      if (it != e->values.end()) return &it->second;
      if (!e->parent && e->outer) return (*e->outer)(v);
    }
    return nullptr;
  }
};

Status check_output(const Node& n, size_t i, const Data& d) {
  const Value* v = n.outputs[i];
  const Type& t = v->type;
  auto bad = [&](const std::string& got) {
    return KILN_ERROR(kInternal, "{}: output {} ('{}') is {} but inference said {}", n.describe(), i, v->name, got,
                      t.to_string());
  };
  if (t.kind == Type::Kind::kTensor) {
    if (!d.is_tensor()) return bad(d.summary());
    if (d.tensor.dtype() != t.dtype) return bad(d.tensor.summary());
    if (t.shape) {
      if (t.shape->rank() != d.tensor.rank()) return bad(d.tensor.summary());
      for (size_t k = 0; k < d.tensor.rank(); ++k) {
        const Dim& x = t.shape->dims[k];
        if (x.is_static() && x.value() != d.tensor.dim(k)) return bad(d.tensor.summary());
      }
    }
  } else if (t.kind == Type::Kind::kSequence && !d.is_sequence()) {
    return bad(d.summary());
  }
  return Status::ok();
}

// Records, for every value of `g` that node `at` or any subgraph nested in it reads, that it is
// read at `at`. Subgraph bodies read enclosing values by reference (ONNX outer-scope names), so
// such a value must live until the node that owns the subgraph has run.
void note_uses(const Graph& g, const Node& n, size_t at, std::unordered_map<const Value*, size_t>& last_use) {
  for (const Value* in : n.inputs) {
    if (in && in->owner == &g) last_use[in] = at;
  }
  auto body = [&](const Graph& sg) {
    for (const auto& sn : sg.nodes) note_uses(g, *sn, at, last_use);
    for (const Value* o : sg.outputs) {
      if (o && o->owner == &g) last_use[o] = at;
    }
  };
  for (const auto& [key, attr] : n.attrs) {
    if (attr.g) body(*attr.g);
    for (const auto& sg : attr.graphs) body(*sg);
  }
}

Expected<std::vector<Data>> run_graph(const Graph& g, std::vector<Data> inputs, const Env* parent);

// Runs n with its CPU kernel on `ins` (null: an omitted input); its subgraph bodies resolve values
// of enclosing scopes through `outer`.
Expected<std::vector<Data>> run_node(const Node& n, std::vector<const Data*> ins, const Env* outer) {
  const OpDef& d = op_def(n.op);
  if (!d.cpu) return KILN_ERROR(kUnsupported, "{}: op {} has no CPU kernel", n.describe(), op_name(n.op));
  for (size_t i = 0; i < n.inputs.size() && i < ins.size(); ++i) {
    const Value* v = n.inputs[i];
    if (v && ins[i] && ins[i]->is_none() && v->type.kind != Type::Kind::kOptional && d.inputs.min > int(i)) {
      return KILN_ERROR(kInvalidArgument, "{}: input '{}' has no value", n.describe(), v->name);
    }
  }
  GraphRunFn sub = [outer](const Graph& sg, std::vector<Data> in) { return run_graph(sg, std::move(in), outer); };
  KernelCtx ctx(n, std::move(ins), sub);
  KILN_RETURN_IF_ERROR(d.cpu(ctx));
  for (size_t i = 0; i < n.outputs.size(); ++i) {
    if (n.outputs[i]) KILN_RETURN_IF_ERROR(check_output(n, i, ctx.outputs()[i]));
  }
  return std::move(ctx.outputs());
}

Expected<std::vector<Data>> run_graph(const Graph& g, std::vector<Data> inputs, const Env* parent) {
  Env env;
  env.parent = parent;
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    env.values[g.inputs[i]] = i < inputs.size() ? std::move(inputs[i]) : Data();
  }
  // Free each value after its last reader (within this graph) to bound memory.
  std::unordered_map<const Value*, size_t> last_use;
  for (size_t i = 0; i < g.nodes.size(); ++i) note_uses(g, *g.nodes[i], i, last_use);
  for (const Value* o : g.outputs) last_use[o] = g.nodes.size();
  for (size_t idx = 0; idx < g.nodes.size(); ++idx) {
    const Node& n = *g.nodes[idx];
    std::vector<const Data*> ins;
    for (const Value* v : n.inputs) {
      if (!v) { ins.push_back(nullptr); continue; }
      const Data* x = env.find(v);
      if (!x && v->constant) {
        env.values[v] = Data(*v->constant);
        x = &env.values[v];
      }
      if (!x) return KILN_ERROR(kInternal, "{}: input '{}' has no value", n.describe(), v->name);
      ins.push_back(x);
    }
    KILN_ASSIGN_OR_RETURN(std::vector<Data> outs, run_node(n, std::move(ins), &env));
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      if (n.outputs[i]) env.values[n.outputs[i]] = std::move(outs[i]);
    }
    for (auto it = env.values.begin(); it != env.values.end();) {
      auto lu = last_use.find(it->first);
      bool dead = lu != last_use.end() && lu->second == idx && !it->first->constant;
      it = dead ? env.values.erase(it) : std::next(it);
    }
  }
  std::vector<Data> outs;
  for (const Value* o : g.outputs) {
    const Data* x = env.find(o);
    if (x) outs.push_back(*x);
    else if (o->constant) outs.push_back(Data(*o->constant));
    else return KILN_ERROR(kInternal, "graph output '{}' has no value", o->name);
  }
  return outs;
}

class CpuExecutable : public Executable {
 public:
  explicit CpuExecutable(const Graph& g) : g_(g) {}
  Expected<std::vector<Data>> run(const std::vector<Data>& inputs) override {
    KILN_RETURN_IF_ERROR(check_inputs(g_, inputs));
    return run_graph(g_, inputs, nullptr);
  }

 private:
  const Graph& g_;
};

class CpuBackend : public Backend {
 public:
  std::string_view name() const override { return "cpu"; }
  bool supports(const Node& n, std::string* reason) const override {
    if (op_def(n.op).cpu) return true;
    if (reason) *reason = fmt::format("op {} has no CPU kernel", op_name(n.op));
    return false;
  }
  Expected<std::unique_ptr<Executable>> compile(const Graph& g) override {
    std::string why;
    for (const auto& n : g.nodes) {
      if (!supports(*n, &why)) return KILN_ERROR(kUnsupported, "{}: {}", n->describe(), why);
    }
    return std::unique_ptr<Executable>(new CpuExecutable(g));
  }
};

}  // namespace

Expected<std::vector<Data>> run_node_on_cpu(const Node& n, std::vector<const Data*> ins, const ValueLookup& outer) {
  Env root;
  root.outer = &outer;
  return run_node(n, std::move(ins), &root);
}

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace kiln
