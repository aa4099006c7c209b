// The IR verifier (see verifier.h for the list of invariants). One walk per graph in node order,
// carrying the values visible so far; a subgraph starts from a copy of what is visible at its node.
#include "ir/verifier.h"

#include <fmt/format.h>

#include <map>
#include <set>

namespace kiln {

namespace {

struct Visible {
  std::set<const Value*> values;
  std::map<std::string, const Value*> names;
};

class Verifier {
 public:
  explicit Verifier(const OpRegistry& r) : reg_(r) {}

  Status graph(const Graph& g, Visible vis) {
    std::set<const Value*> own;
    for (const auto& v : g.values) {
      own.insert(v.get());
      if (v->owner != &g) {
        return error("value '{}' is listed in graph '{}' but its owner is another graph", v->name, g.name);
      }
    }
    std::set<const Node*> nodes;
    for (const auto& n : g.nodes) nodes.insert(n.get());
    for (const auto& v : g.values) {
      const Node* p = v->producer;
      if (!p) continue;
      if (!nodes.count(p)) return error("value '{}' names a producer that is not a node of graph '{}'", v->name, g.name);
      if (v->producer_output < 0 || size_t(v->producer_output) >= p->outputs.size() ||
          p->outputs[size_t(v->producer_output)] != v.get()) {
        return error("value '{}' claims to be output {} of {}, which does not list it there", v->name,
                     v->producer_output, p->describe());
      }
    }

    std::set<const Value*> inputs;
    for (size_t i = 0; i < g.inputs.size(); ++i) {
      const Value* v = g.inputs[i];
      if (!v) return error("graph '{}': input {} is null", g.name, i);
      if (v->producer) return error("graph '{}': input '{}' also has a producer, {}", g.name, v->name, v->producer->describe());
      KILN_RETURN_IF_ERROR(define(g, own, vis, v, fmt::format("graph input {}", i)));
      inputs.insert(v);
    }
    for (const auto& v : g.values) {
      if (v->constant && !v->producer && !inputs.count(v.get())) {
        KILN_RETURN_IF_ERROR(define(g, own, vis, v.get(), "constant"));
      }
    }

    for (const auto& np : g.nodes) {
      const Node& n = *np;
      if (n.owner != &g) return error("{}: its owner is not graph '{}', which holds it", n.describe(), g.name);
      if (size_t(n.op) >= size_t(kNumOps)) return error("node '{}': op id {} is out of range", n.name, int(n.op));
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        const Value* v = n.inputs[i];
        if (!v || vis.values.count(v)) continue;
        return error("{}: input {} '{}' {}", n.describe(), i, v->name, undefined(g, v));
      }
      KILN_RETURN_IF_ERROR(schema(n));
      for (const auto& [key, a] : n.attrs) {
        std::vector<const Graph*> subs;
        if (a.kind == Attribute::Kind::kGraph) {
          if (!a.g) return error("{}: graph attribute '{}' is null", n.describe(), key);
          subs.push_back(a.g.get());
        } else if (a.kind == Attribute::Kind::kGraphs) {
          for (const auto& sg : a.graphs) {
            if (!sg) return error("{}: graphs attribute '{}' holds a null graph", n.describe(), key);
            subs.push_back(sg.get());
          }
        } else if (a.kind == Attribute::Kind::kType && a.types.size() != 1) {
          return error("{}: type attribute '{}' holds {} types, expected 1", n.describe(), key, a.types.size());
        }
        for (const Graph* sg : subs) {
          if (sg->parent != &g || sg->parent_node != &n) {
            return error("{}: subgraph '{}' of attribute '{}' has parent/parent_node pointing elsewhere",
                         n.describe(), sg->name, key);
          }
          KILN_RETURN_IF_ERROR(graph(*sg, vis).with_context(fmt::format("in attribute '{}' of {}", key, n.describe())));
        }
      }
      for (size_t i = 0; i < n.outputs.size(); ++i) {
        const Value* v = n.outputs[i];
        if (!v) continue;
        if (v->producer != &n || v->producer_output != int(i)) {
          return error("{}: output {} '{}' records its producer as {} output {}", n.describe(), i, v->name,
                       v->producer ? v->producer->describe() : std::string("none"), v->producer_output);
        }
        KILN_RETURN_IF_ERROR(define(g, own, vis, v, fmt::format("output {} of {}", i, n.describe())));
      }
    }

    for (size_t i = 0; i < g.outputs.size(); ++i) {
      const Value* v = g.outputs[i];
      if (!v) return error("graph '{}': output {} is null", g.name, i);
      if (!vis.values.count(v)) return error("graph '{}': output {} '{}' {}", g.name, i, v->name, undefined(g, v));
    }
    return Status::ok();
  }

 private:
  template <typename... Args>
  static Status error(fmt::format_string<Args...> f, Args&&... args) {
    return Status(ErrorCode::kInvalidModel, fmt::format(f, std::forward<Args>(args)...));
  }

  // Why a value is not visible in g: it belongs to g or an enclosing graph, but later; or elsewhere.
  static std::string undefined(const Graph& g, const Value* v) {
    for (const Graph* p = &g; p; p = p->parent) {
      if (v->owner == p) return "is used before it is defined (nodes out of order?)";
    }
    return "is not defined in this graph or an enclosing one";
  }

  // A value gets its one definition: listed in the graph, named, the name free in every scope.
  static Status define(const Graph& g, const std::set<const Value*>& own, Visible& vis, const Value* v,
                       const std::string& what) {
    if (!own.count(v)) return error("{} '{}' is not in graph '{}''s value list", what, v->name, g.name);
    if (vis.values.count(v)) return error("value '{}' is defined twice (again as {})", v->name, what);
    if (v->name.empty()) return error("{} has an empty name", what);
    auto it = vis.names.find(v->name);
    if (it != vis.names.end()) {
      const char* where = it->second->owner == &g ? "" : " in an enclosing graph";
      return error("{} reuses the name '{}' of another value{}", what, v->name, where);
    }
    vis.values.insert(v);
    vis.names[v->name] = v;
    return Status::ok();
  }

  Status schema(const Node& n) const {
    const OpDef& d = reg_.get(n.op);
    if (!d.infer) return Status::ok();  // not declared yet: nothing to check against
    auto count = [](size_t n, Arity a) { return int64_t(n) >= a.min && (a.max == kVariadic || int64_t(n) <= a.max); };
    auto range = [](Arity a) {
      if (a.max == kVariadic) return fmt::format("at least {}", a.min);
      return a.min == a.max ? fmt::format("{}", a.min) : fmt::format("{} to {}", a.min, a.max);
    };
    if (!count(n.inputs.size(), d.inputs)) {
      return error("{}: has {} inputs, expected {}", n.describe(), n.inputs.size(), range(d.inputs));
    }
    if (!count(n.outputs.size(), d.outputs)) {
      return error("{}: has {} outputs, expected {}", n.describe(), n.outputs.size(), range(d.outputs));
    }
    for (int i = 0; i < d.inputs.min; ++i) {
      if (!n.inputs[size_t(i)]) return error("{}: required input {} is omitted", n.describe(), i);
    }
    for (int i = 0; i < d.outputs.min; ++i) {
      if (!n.outputs[size_t(i)]) return error("{}: required output {} is omitted", n.describe(), i);
    }
    for (const AttrSpec& s : d.attrs) {
      const Attribute* a = n.attr(s.name);
      if (!a) {
        if (s.required) return error("{}: missing required attribute '{}' ({})", n.describe(), s.name, attr_kind_name(s.kind));
        continue;
      }
      // An int where a float is declared reads as that float (Node::attr_float does the same).
      bool ok = a->kind == s.kind || (s.kind == Attribute::Kind::kFloat && a->kind == Attribute::Kind::kInt);
      if (!ok) {
        return error("{}: attribute '{}' is {}, expected {}", n.describe(), s.name, attr_kind_name(a->kind),
                     attr_kind_name(s.kind));
      }
    }
    return Status::ok();
  }

  const OpRegistry& reg_;
};

}  // namespace

Status verify_graph(const Graph& g, const OpRegistry& registry) {
  Visible outer;
  // A subgraph verified on its own may read values of its enclosing graphs; take them as given.
  for (const Graph* p = g.parent; p; p = p->parent) {
    for (const auto& v : p->values) {
      outer.values.insert(v.get());
      outer.names.emplace(v->name, v.get());
    }
  }
  return Verifier(registry).graph(g, std::move(outer));
}

Status verify_graph(const Graph& g) { return verify_graph(g, op_registry()); }

}  // namespace kiln
