// Graph -> Graphviz dot (see dot.h).
#include "ir/dot.h"

#include <fmt/format.h>

#include <map>
#include <set>
#include <string>

namespace kiln {

namespace {

// A dot string literal; "\n" inside labels is dot's line break.
std::string dot_quote(std::string_view s) {
  std::string q = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') q += '\\';
    if (c == '\n') { q += "\\n"; continue; }
    q += c;
  }
  return q + "\"";
}

class DotWriter {
 public:
  explicit DotWriter(std::ostream& os) : os_(os) {}

  void top(const Graph& g) {
    os_ << "digraph " << dot_quote(g.name.empty() ? "graph" : g.name) << " {\n"
        << "  compound=true;\n  node [shape=box, fontname=\"Helvetica\"];\n"
        << "  edge [fontname=\"Helvetica\", fontsize=10];\n";
    body(g, "  ");
    os_ << "}\n";
  }

 private:
  std::string fresh(char prefix) { return fmt::format("{}{}", prefix, next_id_++); }

  static std::string edge_label(const Value* v) { return dot_quote(v->name + "\n" + v->type.to_string()); }

  // Writes g's values and nodes; returns the id of its return node (every graph has one).
  std::string body(const Graph& g, const std::string& pad) {
    std::set<const Value*> inputs(g.inputs.begin(), g.inputs.end());
    for (const Value* v : g.inputs) {
      if (!v) continue;
      std::string id = fresh('v');
      src_[v] = id;
      os_ << pad << id << " [label=" << dot_quote(v->name + "\n" + v->type.to_string()) << ", shape=ellipse];\n";
    }
    for (const auto& v : g.values) {
      if (v->producer || !v->constant || inputs.count(v.get())) continue;
      std::string id = fresh('c');
      src_[v.get()] = id;
      os_ << pad << id << " [label=" << dot_quote(v->name + "\n" + v->constant->summary())
          << ", shape=note, fontsize=10];\n";
    }
    for (const auto& np : g.nodes) {
      const Node& n = *np;
      std::string id = fresh('n');
      std::string op(op_name(n.op));
      if (!op_domain(n.op).empty()) op = std::string(op_domain(n.op)) + "." + op;
      os_ << pad << id << " [label=" << dot_quote(n.name.empty() ? op : op + "\n" + n.name) << "];\n";
      for (const Value* v : n.inputs) edge(v, id, pad);
      for (const auto& [key, a] : n.attrs) {
        std::vector<const Graph*> subs;
        if (a.kind == Attribute::Kind::kGraph && a.g) subs.push_back(a.g.get());
        if (a.kind == Attribute::Kind::kGraphs) {
          for (const auto& sg : a.graphs) if (sg) subs.push_back(sg.get());
        }
        for (const Graph* sg : subs) {
          std::string cluster = fmt::format("cluster_{}", next_id_++);
          os_ << pad << "subgraph " << cluster << " {\n"
              << pad << "  label=" << dot_quote(key + ": " + sg->name) << ";\n"
              << pad << "  style=rounded;\n";
          std::string ret = body(*sg, pad + "  ");
          os_ << pad << "}\n";
          os_ << pad << ret << " -> " << id << " [ltail=" << cluster << ", style=dashed, label="
              << dot_quote(key) << "];\n";
        }
      }
      for (const Value* v : n.outputs) {
        if (v) src_[v] = id;
      }
    }
    std::string ret = fresh('r');
    os_ << pad << ret << " [label=" << dot_quote(g.parent ? "return" : "outputs")
        << ", shape=doublecircle, fontsize=9];\n";
    for (const Value* v : g.outputs) edge(v, ret, pad);
    return ret;
  }

  void edge(const Value* v, const std::string& to, const std::string& pad) {
    if (!v) return;
    auto it = src_.find(v);
    if (it == src_.end()) {  // undefined (the verifier would reject it): show it anyway
      std::string id = fresh('u');
      os_ << pad << id << " [label=" << dot_quote("undefined: " + v->name) << ", color=red];\n";
      it = src_.emplace(v, id).first;
    }
    os_ << pad << it->second << " -> " << to << " [label=" << edge_label(v) << "];\n";
  }

  std::ostream& os_;
  std::map<const Value*, std::string> src_;
  int next_id_ = 0;
};

}  // namespace

Status write_dot(const Graph& g, std::ostream& os) {
  DotWriter(os).top(g);
  if (!os) return KILN_ERROR(kIo, "writing the dot graph failed");
  return Status::ok();
}

}  // namespace kiln
