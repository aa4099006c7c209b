// Graph -> text. The grammar is in docs/ir.md; parser.cc reads exactly what this writes, and the
// output is canonical (attributes sorted, dims through Dim::to_string), so print(parse(s)) == s.
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <set>
#include <type_traits>

#include "ir/text.h"

namespace kiln {

namespace {

bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'; }

// Names after '%' and '@' may start with a digit ("%0"); graph names and attribute keys are
// identifiers and may not (a leading digit would lex as a number).
bool is_bare_ref(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!is_name_char(c)) return false;
  }
  return true;
}
bool is_bare_ident(std::string_view s) {
  return is_bare_ref(s) && !std::isdigit(static_cast<unsigned char>(s[0])) && s[0] != '.';
}

std::string ref_name(std::string_view s) { return is_bare_ref(s) ? std::string(s) : quote_string(s); }
std::string ident_name(std::string_view s) { return is_bare_ident(s) ? std::string(s) : quote_string(s); }

std::string value_ref(const Value* v) { return v ? "%" + ref_name(v->name) : "_"; }

// Shortest text that reads back to the same float (fmt's default), always with a '.', an exponent
// or a word in it so that an attribute `1.0` stays a float and `1` an int.
std::string float_text(double v, bool single) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  std::string s = single ? fmt::format("{}", float(v)) : fmt::format("{}", v);
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

std::string element_text(const Tensor& t, int64_t i) {
  return visit_dtype(t.dtype(), [&]<typename T>() -> std::string {
    const T& x = t.data<T>()[i];
    if constexpr (std::is_same_v<T, std::string>) {
      return quote_string(x);
    } else if constexpr (std::is_same_v<T, bool>) {
      return x ? "true" : "false";
    } else if constexpr (std::is_same_v<T, double>) {
      return float_text(x, false);
    } else if constexpr (is_float_v<T>) {
      return float_text(float(x), true);
    } else {
      return std::to_string(x);
    }
  });
}

std::string join_dims(const std::vector<int64_t>& dims) {
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s;
}

class Printer {
 public:
  explicit Printer(const PrintOptions& o) : opt_(o) {}

  void graph(const Graph& g, int indent) {
    out_ += "graph " + ident_name(g.name) + "(";
    std::set<const Value*> inputs(g.inputs.begin(), g.inputs.end());
    for (size_t i = 0; i < g.inputs.size(); ++i) {
      const Value* v = g.inputs[i];
      if (i) out_ += ", ";
      if (!v) { out_ += "_"; continue; }
      out_ += value_ref(v) + ": " + print_type(v->type);
      if (v->constant) out_ += " = " + constant(*v);
    }
    out_ += ") {\n";
    const std::string pad(size_t(indent + 2), ' ');
    // Constants have no place in the node order; they come first, in the order they were added.
    for (const auto& v : g.values) {
      if (v->producer || !v->constant || inputs.count(v.get())) continue;
      out_ += pad + value_ref(v.get()) + " = const " + constant(*v);
      Type own = Type::tensor(v->constant->dtype(), Shape::of(v->constant->dims()));
      if (!(v->type == own)) out_ += " : " + print_type(v->type);
      out_ += "\n";
    }
    for (const auto& n : g.nodes) {
      out_ += pad;
      node(*n, indent + 2);
      out_ += "\n";
    }
    out_ += pad + "return";
    for (size_t i = 0; i < g.outputs.size(); ++i) out_ += (i ? ", " : " ") + value_ref(g.outputs[i]);
    out_ += "\n" + std::string(size_t(indent), ' ') + "}";
  }

  std::string constant(const Value& v) {
    if (opt_.elided_constants && opt_.elided_constants->count(&v)) {
      PrintOptions elide = opt_;
      elide.max_inline_elements = -1;
      elide.elide_large_tensors = true;
      return print_tensor(*v.constant, elide);
    }
    return print_tensor(*v.constant, opt_);
  }

  void node(const Node& n, int indent) {
    if (!n.outputs.empty()) {
      for (size_t i = 0; i < n.outputs.size(); ++i) out_ += (i ? ", " : "") + value_ref(n.outputs[i]);
      out_ += " = ";
    }
    std::string_view domain = op_domain(n.op);
    if (!domain.empty()) out_ += std::string(domain) + ".";
    out_ += std::string(op_name(n.op)) + "(";
    for (size_t i = 0; i < n.inputs.size(); ++i) out_ += (i ? ", " : "") + value_ref(n.inputs[i]);
    out_ += ")";
    if (!n.attrs.empty()) {
      out_ += " {";
      bool first = true;
      for (const auto& [key, a] : n.attrs) {
        out_ += first ? "" : ", ";
        first = false;
        out_ += ident_name(key) + " = ";
        attr(a, indent);
      }
      out_ += "}";
    }
    bool first = true;
    for (const Value* v : n.outputs) {
      if (!v) continue;
      out_ += first ? " : " : ", ";
      first = false;
      out_ += print_type(v->type);
    }
    if (opt_.print_node_names && !n.name.empty()) out_ += " @" + ref_name(n.name);
  }

  void attr(const Attribute& a, int indent) {
    // Empty lists carry their kind (`ints[]`); non-empty ones show it through their elements.
    auto list = [&](std::string_view kind, size_t size, auto&& each) {
      if (size == 0) { out_ += std::string(kind) + "[]"; return; }
      out_ += "[";
      for (size_t i = 0; i < size; ++i) {
        if (i) out_ += ", ";
        each(i);
      }
      out_ += "]";
    };
    switch (a.kind) {
      case Attribute::Kind::kFloat: out_ += float_text(a.f, true); return;
      case Attribute::Kind::kInt: out_ += std::to_string(a.i); return;
      case Attribute::Kind::kString: out_ += quote_string(a.s); return;
      case Attribute::Kind::kTensor: out_ += print_tensor(a.t, opt_); return;
      case Attribute::Kind::kGraph:
        if (a.g) graph(*a.g, indent);
        else out_ += "graph \"\"() {}";  // unreachable in a verified graph
        return;
      case Attribute::Kind::kFloats:
        list("floats", a.floats.size(), [&](size_t i) { out_ += float_text(a.floats[i], true); });
        return;
      case Attribute::Kind::kInts:
        list("ints", a.ints.size(), [&](size_t i) { out_ += std::to_string(a.ints[i]); });
        return;
      case Attribute::Kind::kStrings:
        list("strings", a.strings.size(), [&](size_t i) { out_ += quote_string(a.strings[i]); });
        return;
      case Attribute::Kind::kTensors:
        list("tensors", a.tensors.size(), [&](size_t i) { out_ += print_tensor(a.tensors[i], opt_); });
        return;
      case Attribute::Kind::kGraphs:
        list("graphs", a.graphs.size(), [&](size_t i) { graph(*a.graphs[i], indent); });
        return;
      case Attribute::Kind::kType:
        out_ += "type<" + (a.types.empty() ? std::string("?") : print_type(a.types[0])) + ">";
        return;
      case Attribute::Kind::kTypes:
        list("types", a.types.size(), [&](size_t i) { out_ += "type<" + print_type(a.types[i]) + ">"; });
        return;
    }
  }

  std::string take() { return std::move(out_); }

 private:
  const PrintOptions& opt_;
  std::string out_;
};

}  // namespace

std::string quote_string(std::string_view s) {
  std::string q = "\"";
  for (char c : s) {
    switch (c) {
      case '"': q += "\\\""; break;
      case '\\': q += "\\\\"; break;
      case '\n': q += "\\n"; break;
      case '\t': q += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) q += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
        else q += c;
    }
  }
  return q + "\"";
}

std::string print_type(const Type& t) { return t.to_string(); }

std::string print_tensor(const Tensor& t, const PrintOptions& o) {
  std::string s = fmt::format("dense<{}[{}]>", dtype_name(t.dtype()), join_dims(t.dims()));
  if (t.numel() > 0 && !t.raw()) return s + " ...";  // undefined: no data to show
  if (t.numel() > o.max_inline_elements) {
    if (o.elide_large_tensors) return s + " ...";
    if (t.dtype() != DType::kString) {
      // Raw bytes in memory order (little-endian on every target kiln supports).
      const auto* p = static_cast<const unsigned char*>(t.raw());
      std::string hex = " 0x";
      hex.reserve(3 + t.nbytes() * 2);
      static const char kDigits[] = "0123456789abcdef";
      for (size_t i = 0; i < t.nbytes(); ++i) {
        hex += kDigits[p[i] >> 4];
        hex += kDigits[p[i] & 15];
      }
      return s + hex;
    }
  }
  s += " [";
  for (int64_t i = 0; i < t.numel(); ++i) s += (i ? ", " : "") + element_text(t, i);
  return s + "]";
}

std::string print_graph(const Graph& g, const PrintOptions& options) {
  Printer p(options);
  p.graph(g, 0);
  return p.take() + "\n";
}

}  // namespace kiln
