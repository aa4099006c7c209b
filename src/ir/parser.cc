// Text -> Graph: a hand-written recursive-descent parser for the format printer.cc writes (grammar
// in docs/ir.md). Newlines carry no meaning; `#` and `//` start comments. Names resolve at the
// point of use, innermost scope first, so a subgraph sees only outer values defined before its node.
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <type_traits>

#include "ir/text.h"

namespace kiln {

namespace {

enum class Tok { kEnd, kIdent, kNumber, kHex, kString, kValue, kAt, kPunct, kEllipsis };

struct Token {
  Tok kind = Tok::kEnd;
  std::string text;  // decoded: strings unescaped, '%'/'@' names without the sigil
  int line = 1, col = 1;
};

bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'; }

std::string describe(const Token& t) {
  switch (t.kind) {
    case Tok::kEnd: return "end of input";
    case Tok::kString: return "string " + quote_string(t.text);
    case Tok::kValue: return "'%" + t.text + "'";
    case Tok::kAt: return "'@" + t.text + "'";
    default: return "'" + t.text + "'";
  }
}

Status error_at(int line, int col, const std::string& msg) {
  return Status(ErrorCode::kInvalidModel, std::to_string(line) + ":" + std::to_string(col) + ": " + msg);
}

class Lexer {
 public:
  explicit Lexer(std::string_view s) : s_(s) {}

  Expected<std::vector<Token>> run() {
    std::vector<Token> out;
    for (;;) {
      skip_space();
      Token t;
      t.line = line_;
      t.col = col_;
      if (i_ >= s_.size()) { out.push_back(t); return out; }
      char c = s_[i_];
      if (c == '"') {
        t.kind = Tok::kString;
        KILN_RETURN_IF_ERROR(string(&t.text));
      } else if (c == '%' || c == '@') {
        t.kind = c == '%' ? Tok::kValue : Tok::kAt;
        advance();
        if (i_ < s_.size() && s_[i_] == '"') {
          KILN_RETURN_IF_ERROR(string(&t.text));
        } else {
          while (i_ < s_.size() && is_name_char(s_[i_])) t.text += advance();
          if (t.text.empty()) return error_at(t.line, t.col, fmt::format("expected a name after '{}'", c));
        }
      } else if (c == '0' && i_ + 1 < s_.size() && s_[i_ + 1] == 'x') {
        t.kind = Tok::kHex;
        advance(), advance();
        while (i_ < s_.size() && std::isxdigit(static_cast<unsigned char>(s_[i_]))) t.text += advance();
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        t.kind = Tok::kNumber;
        while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) t.text += advance();
        if (peek_is('.') && i_ + 1 < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_ + 1]))) {
          t.text += advance();
          while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) t.text += advance();
        }
        if (peek_is('e') || peek_is('E')) {
          size_t j = i_ + 1;
          if (j < s_.size() && (s_[j] == '+' || s_[j] == '-')) ++j;
          if (j < s_.size() && std::isdigit(static_cast<unsigned char>(s_[j]))) {
            while (i_ < j) t.text += advance();
            while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) t.text += advance();
          }
        }
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        t.kind = Tok::kIdent;
        while (i_ < s_.size() && is_name_char(s_[i_])) t.text += advance();
      } else if (c == '.' && s_.substr(i_, 3) == "...") {
        t.kind = Tok::kEllipsis;
        t.text = "...";
        advance(), advance(), advance();
      } else if (std::string_view("()[]{}<>,:=*+-/?").find(c) != std::string_view::npos) {
        t.kind = Tok::kPunct;
        t.text = std::string(1, advance());
      } else {
        return error_at(line_, col_, fmt::format("unexpected character '{}'", c));
      }
      out.push_back(std::move(t));
    }
  }

 private:
  bool peek_is(char c) const { return i_ < s_.size() && s_[i_] == c; }
  char advance() {
    char c = s_[i_++];
    if (c == '\n') { ++line_; col_ = 1; } else { ++col_; }
    return c;
  }
  void skip_space() {
    while (i_ < s_.size()) {
      char c = s_[i_];
      if (std::isspace(static_cast<unsigned char>(c))) {
        advance();
      } else if (c == '#' || (c == '/' && i_ + 1 < s_.size() && s_[i_ + 1] == '/')) {
        while (i_ < s_.size() && s_[i_] != '\n') advance();
      } else {
        return;
      }
    }
  }
  Status string(std::string* out) {
    int line = line_, col = col_;
    advance();  // opening quote
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = advance();
      if (c != '\\') { *out += c; continue; }
      if (i_ >= s_.size()) break;
      char e = advance();
      switch (e) {
        case 'n': *out += '\n'; break;
        case 't': *out += '\t'; break;
        case 'r': *out += '\r'; break;
        case '"': case '\\': *out += e; break;
        case 'x': {
          if (i_ + 2 > s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[i_])) ||
              !std::isxdigit(static_cast<unsigned char>(s_[i_ + 1]))) {
            return error_at(line_, col_, "expected two hex digits after \\x");
          }
          std::string h{advance()};
          h += advance();
          *out += char(std::strtol(h.c_str(), nullptr, 16));
          break;
        }
        default: return error_at(line_, col_ - 1, fmt::format("unknown escape '\\{}'", e));
      }
    }
    if (i_ >= s_.size()) return error_at(line, col, "unterminated string");
    advance();  // closing quote
    return Status::ok();
  }

  std::string_view s_;
  size_t i_ = 0;
  int line_ = 1, col_ = 1;
};

// Values visible at the current point: one map per graph, innermost last.
struct Scope {
  std::map<std::string, Value*> names;
  const Scope* parent = nullptr;
  Value* find(const std::string& n) const {
    for (const Scope* s = this; s; s = s->parent) {
      auto it = s->names.find(n);
      if (it != s->names.end()) return it->second;
    }
    return nullptr;
  }
};

class Parser {
 public:
  explicit Parser(std::vector<Token> toks, ParseOptions opt = {}) : t_(std::move(toks)), opt_(opt) {}

  Status expect_end() {
    if (cur().kind != Tok::kEnd) return expected("end of input");
    return Status::ok();
  }

  // graph NAME(%in: T [= tensor], ...) { statements; return %a, ... }
  Status graph(Graph* g, const Scope* outer) {
    KILN_RETURN_IF_ERROR(keyword("graph"));
    if (cur().kind != Tok::kIdent && cur().kind != Tok::kString) return expected("a graph name");
    g->name = next().text;
    Scope scope;
    scope.parent = outer;
    KILN_RETURN_IF_ERROR(punct("("));
    while (!is_punct(")")) {
      if (!g->inputs.empty()) KILN_RETURN_IF_ERROR(punct(","));
      const Token name = cur();
      if (name.kind != Tok::kValue) return expected("an input name like %x");
      ++p_;
      KILN_RETURN_IF_ERROR(punct(":"));
      KILN_ASSIGN_OR_RETURN(Type type, parse_type_here());
      KILN_RETURN_IF_ERROR(define(scope, name));
      Value* v = g->add_input(name.text, std::move(type));
      scope.names[name.text] = v;
      if (accept("=")) {
        KILN_ASSIGN_OR_RETURN(Tensor t, tensor());
        v->constant = std::move(t);
      }
    }
    ++p_;
    KILN_RETURN_IF_ERROR(punct("{"));
    while (!(cur().kind == Tok::kIdent && cur().text == "return")) {
      if (cur().kind == Tok::kEnd || is_punct("}")) return expected("'return'");
      KILN_RETURN_IF_ERROR(statement(g, scope));
    }
    ++p_;
    if (cur().kind == Tok::kValue || is_ident("_")) {
      do {
        KILN_ASSIGN_OR_RETURN(Value* v, use(scope));
        if (!v) return error(t_[p_ - 1], "a graph output cannot be omitted ('_')");
        g->outputs.push_back(v);
      } while (accept(","));
    }
    return punct("}");
  }

  // Dim expressions, seq<opt<...>> types and subgraphs are parsed recursively; a hostile text can
  // nest them without bound (the IR text fuzzer found "((((..." overflowing the stack), so deeper
  // than kMaxNesting is an error.
  static constexpr int kMaxNesting = 100;
  struct Nest {
    explicit Nest(int& d) : depth(++d) {}
    ~Nest() { --depth; }
    int& depth;
  };
  Status too_deep() const { return error(cur(), fmt::format("nested more than {} deep", kMaxNesting)); }

  Expected<Type> parse_type_here() {
    Nest nest(depth_);
    if (depth_ > kMaxNesting) return too_deep();
    const Token& t = cur();
    if (accept("?")) return Type();
    if (t.kind != Tok::kIdent) return expected("a type like f32[N,3]");
    if (t.text == "seq" || t.text == "opt") {
      bool seq = t.text == "seq";
      ++p_;
      KILN_RETURN_IF_ERROR(punct("<"));
      KILN_ASSIGN_OR_RETURN(Type e, parse_type_here());
      KILN_RETURN_IF_ERROR(punct(">"));
      return seq ? Type::sequence(std::move(e)) : Type::optional(std::move(e));
    }
    std::optional<DType> dt = dtype_from_name(t.text);
    if (!dt) return expected("a dtype (f32, i64, ...), 'seq', 'opt' or '?'");
    ++p_;
    KILN_RETURN_IF_ERROR(punct("["));
    if (accept("*")) {
      KILN_RETURN_IF_ERROR(punct("]"));
      return Type::tensor(*dt);
    }
    Shape s;
    while (!is_punct("]")) {
      if (!s.dims.empty()) KILN_RETURN_IF_ERROR(punct(","));
      KILN_ASSIGN_OR_RETURN(Dim d, dim());
      s.dims.push_back(std::move(d));
    }
    ++p_;
    return Type::tensor(*dt, std::move(s));
  }

  // dim := '?' | expr;  expr := term (('+'|'-') term)*;  term := unary (('*'|'/') unary)*
  Expected<Dim> dim() {
    if (accept("?")) return Dim::unknown();
    return dim_expr();
  }

  // dense<dtype[d0,d1]> ( [e0, e1, ...] | 0xHEX | ... )
  Expected<Tensor> tensor() {
    KILN_RETURN_IF_ERROR(keyword("dense"));
    KILN_RETURN_IF_ERROR(punct("<"));
    const Token& dt_tok = cur();
    std::optional<DType> dt = dt_tok.kind == Tok::kIdent ? dtype_from_name(dt_tok.text) : std::nullopt;
    if (!dt) return expected("a dtype (f32, i64, ...)");
    ++p_;
    KILN_RETURN_IF_ERROR(punct("["));
    std::vector<int64_t> dims;
    while (!is_punct("]")) {
      if (!dims.empty()) KILN_RETURN_IF_ERROR(punct(","));
      if (cur().kind != Tok::kNumber) return expected("a static dimension");
      KILN_ASSIGN_OR_RETURN(int64_t d, integer(next()));
      dims.push_back(d);
    }
    ++p_;
    KILN_RETURN_IF_ERROR(punct(">"));
    const Token& start = cur();
    if (cur().kind == Tok::kEllipsis && !opt_.zero_elided_tensors) {  // the caller supplies the data
      ++p_;
      KILN_ASSIGN_OR_RETURN(int64_t numel, checked_numel(dims));
      (void)numel;
      return Tensor::view(*dt, dims, nullptr, nullptr);
    }
    auto made = Tensor::create(*dt, dims);
    if (!made) return error(start, made.status().message());
    Tensor t = std::move(*made);
    if (cur().kind == Tok::kEllipsis) {  // elided data: zeros
      ++p_;
      return t;
    }
    if (cur().kind == Tok::kHex) {
      const Token& h = next();
      if (*dt == DType::kString) return error(h, "string tensors cannot be given in hex");
      if (h.text.size() != 2 * t.nbytes()) {
        return error(h, fmt::format("expected {} hex digits for {}, got {}", 2 * t.nbytes(), t.summary(),
                                    h.text.size()));
      }
      auto* p = static_cast<unsigned char*>(t.raw());
      for (size_t i = 0; i < t.nbytes(); ++i) {
        p[i] = static_cast<unsigned char>(std::stoi(h.text.substr(2 * i, 2), nullptr, 16));
      }
      return t;
    }
    if (!is_punct("[")) return expected("'[' with elements, 0x hex data or '...'");
    ++p_;
    int64_t n = 0;
    while (!is_punct("]")) {
      if (n) KILN_RETURN_IF_ERROR(punct(","));
      if (n >= t.numel()) return error(cur(), fmt::format("too many elements for {}", t.summary()));
      KILN_RETURN_IF_ERROR(element(t, n++));
    }
    ++p_;
    if (n == 1 && t.numel() > 1) {  // splat: one element fills the tensor
      visit_dtype(t.dtype(), [&]<typename T>() {
        T* d = t.data<T>();
        for (int64_t i = 1; i < t.numel(); ++i) d[i] = d[0];
      });
    } else if (n != t.numel()) {
      return error(start, fmt::format("expected {} elements for {}, got {}", t.numel(), t.summary(), n));
    }
    return t;
  }

 private:
  const Token& cur() const { return t_[p_]; }
  const Token& next() { return t_[p_ < t_.size() - 1 ? p_++ : p_]; }
  bool is_punct(std::string_view s) const { return cur().kind == Tok::kPunct && cur().text == s; }
  bool is_ident(std::string_view s) const { return cur().kind == Tok::kIdent && cur().text == s; }
  bool accept(std::string_view s) {
    if (!is_punct(s)) return false;
    ++p_;
    return true;
  }
  Status error(const Token& t, const std::string& msg) const { return error_at(t.line, t.col, msg); }
  Status expected(const std::string& what) const {
    return error(cur(), "expected " + what + ", got " + describe(cur()));
  }
  Status punct(std::string_view s) {
    if (accept(s)) return Status::ok();
    return expected("'" + std::string(s) + "'");
  }
  Status keyword(std::string_view s) {
    if (!is_ident(s)) return expected("'" + std::string(s) + "'");
    ++p_;
    return Status::ok();
  }

  Status define(const Scope& scope, const Token& name) const {
    if (scope.find(name.text)) return error(name, "value %" + name.text + " is already defined");
    return Status::ok();
  }

  // %name (must be visible) or '_' (omitted: nullptr).
  Expected<Value*> use(const Scope& scope) {
    if (is_ident("_")) {
      ++p_;
      return static_cast<Value*>(nullptr);
    }
    if (cur().kind != Tok::kValue) return expected("a value like %x or '_'");
    const Token& t = next();
    Value* v = scope.find(t.text);
    if (!v) return error(t, "use of undefined value %" + t.text);
    return v;
  }

  // [%a, _, ... =] (const TENSOR [: T] | [domain.]Op(args) [{attrs}] [: types] [@name])
  Status statement(Graph* g, Scope& scope) {
    std::vector<Token> outs;  // kEnd tokens stand for '_'
    if (cur().kind == Tok::kValue || is_ident("_")) {
      for (;;) {
        if (is_ident("_")) {
          outs.push_back(Token{Tok::kEnd, "_", cur().line, cur().col});
          ++p_;
        } else if (cur().kind == Tok::kValue) {
          outs.push_back(next());
        } else {
          return expected("an output name like %y or '_'");
        }
        if (!accept(",")) break;
      }
      KILN_RETURN_IF_ERROR(punct("="));
    }
    for (size_t i = 0; i < outs.size(); ++i) {
      if (outs[i].kind == Tok::kEnd) continue;
      KILN_RETURN_IF_ERROR(define(scope, outs[i]));
      for (size_t j = 0; j < i; ++j) {
        if (outs[j].kind != Tok::kEnd && outs[j].text == outs[i].text) {
          return error(outs[i], "value %" + outs[i].text + " is already defined");
        }
      }
    }
    if (is_ident("const")) {
      ++p_;
      if (outs.size() != 1 || outs[0].kind == Tok::kEnd) return error(t_[p_ - 1], "a const defines exactly one value");
      KILN_ASSIGN_OR_RETURN(Tensor t, tensor());
      Value* v = g->add_constant(outs[0].text, std::move(t));
      if (accept(":")) {
        KILN_ASSIGN_OR_RETURN(v->type, parse_type_here());
      }
      scope.names[v->name] = v;
      return Status::ok();
    }
    if (cur().kind != Tok::kIdent) return expected("an op name or 'const'");
    const Token& op_tok = next();
    size_t dot = op_tok.text.rfind('.');
    std::string_view domain = dot == std::string::npos ? std::string_view() : std::string_view(op_tok.text).substr(0, dot);
    std::string_view name = dot == std::string::npos ? std::string_view(op_tok.text) : std::string_view(op_tok.text).substr(dot + 1);
    std::optional<OpKind> op = op_from_name(domain, name);
    if (!op) return error(op_tok, "unknown op '" + op_tok.text + "'");

    auto node = std::make_unique<Node>();
    node->op = *op;
    node->owner = g;
    node->index = int(g->nodes.size());
    KILN_RETURN_IF_ERROR(punct("("));
    while (!is_punct(")")) {
      if (!node->inputs.empty()) KILN_RETURN_IF_ERROR(punct(","));
      KILN_ASSIGN_OR_RETURN(Value* v, use(scope));
      node->inputs.push_back(v);
    }
    ++p_;
    if (accept("{")) {
      while (!is_punct("}")) {
        if (!node->attrs.empty()) KILN_RETURN_IF_ERROR(punct(","));
        if (cur().kind != Tok::kIdent && cur().kind != Tok::kString) return expected("an attribute name");
        const Token& key = next();
        if (node->attrs.count(key.text)) return error(key, "duplicate attribute '" + key.text + "'");
        KILN_RETURN_IF_ERROR(punct("="));
        KILN_ASSIGN_OR_RETURN(Attribute a, attribute(g, node.get(), scope));
        node->attrs.emplace(key.text, std::move(a));
      }
      ++p_;
    }
    std::vector<Type> types;
    size_t present = 0;
    for (const Token& o : outs) present += o.kind != Tok::kEnd;
    if (accept(":")) {
      do {
        KILN_ASSIGN_OR_RETURN(Type ty, parse_type_here());
        types.push_back(std::move(ty));
      } while (accept(","));
      if (types.size() != present) {
        return error(t_[p_ - 1], fmt::format("{} types for {} outputs", types.size(), present));
      }
    }
    if (cur().kind == Tok::kAt) node->name = next().text;
    size_t k = 0;
    for (size_t i = 0; i < outs.size(); ++i) {
      if (outs[i].kind == Tok::kEnd) {
        node->outputs.push_back(nullptr);
        continue;
      }
      Value* v = g->add_value(outs[i].text, k < types.size() ? types[k] : Type());
      ++k;
      v->producer = node.get();
      v->producer_output = int(i);
      node->outputs.push_back(v);
      scope.names[v->name] = v;
    }
    g->nodes.push_back(std::move(node));
    return Status::ok();
  }

  Expected<Attribute> attribute(Graph* g, Node* node, const Scope& scope) {
    Attribute a;
    const Token& t = cur();
    if (t.kind == Tok::kNumber || is_punct("-") || is_ident("nan") || is_ident("inf")) {
      KILN_ASSIGN_OR_RETURN(Scalar s, scalar());
      if (s.is_float) a = Attribute::of_float(float(s.f));
      else a = Attribute::of_int(s.i);
      return a;
    }
    if (t.kind == Tok::kString) return Attribute::of_string(next().text);
    if (is_ident("dense")) {
      KILN_ASSIGN_OR_RETURN(Tensor x, tensor());
      return Attribute::of_tensor(std::move(x));
    }
    if (is_ident("graph")) {
      KILN_ASSIGN_OR_RETURN(std::shared_ptr<Graph> sg, subgraph(g, node, scope));
      return Attribute::of_graph(std::move(sg));
    }
    if (is_ident("type")) {
      a.kind = Attribute::Kind::kType;
      KILN_ASSIGN_OR_RETURN(Type ty, type_attr());
      a.types.push_back(std::move(ty));
      return a;
    }
    // Lists: `[...]`, or `kind[...]` (required when empty).
    static const std::map<std::string, Attribute::Kind, std::less<>> kLists = {
        {"ints", Attribute::Kind::kInts},       {"floats", Attribute::Kind::kFloats},
        {"strings", Attribute::Kind::kStrings}, {"tensors", Attribute::Kind::kTensors},
        {"graphs", Attribute::Kind::kGraphs},   {"types", Attribute::Kind::kTypes}};
    std::optional<Attribute::Kind> kind;
    if (t.kind == Tok::kIdent) {
      auto it = kLists.find(t.text);
      if (it == kLists.end()) return expected("an attribute value");
      kind = it->second;
      ++p_;
    }
    KILN_RETURN_IF_ERROR(punct("["));
    std::vector<Scalar> nums;  // ints and floats mix to floats ([1, 2.5]); `ints[...]` takes no floats
    bool any_float = false;
    std::optional<Attribute::Kind> elem;  // kind of the non-number elements seen
    size_t n = 0;
    while (!is_punct("]")) {
      if (n++) KILN_RETURN_IF_ERROR(punct(","));
      const Token& e = cur();
      if (e.kind == Tok::kNumber || is_punct("-") || is_ident("nan") || is_ident("inf")) {
        if (elem || (kind && *kind != Attribute::Kind::kInts && *kind != Attribute::Kind::kFloats)) {
          return error(e, fmt::format("expected an element of {}", attr_kind_name(kind ? *kind : *elem)));
        }
        KILN_ASSIGN_OR_RETURN(Scalar s, scalar());
        if (s.is_float && kind == Attribute::Kind::kInts) return error(e, "expected an integer");
        any_float = any_float || s.is_float;
        nums.push_back(s);
        continue;
      }
      Attribute::Kind k;
      if (e.kind == Tok::kString) k = Attribute::Kind::kStrings;
      else if (is_ident("dense")) k = Attribute::Kind::kTensors;
      else if (is_ident("graph")) k = Attribute::Kind::kGraphs;
      else if (is_ident("type")) k = Attribute::Kind::kTypes;
      else return expected("a list element");
      std::optional<Attribute::Kind> want = kind ? kind : elem;
      if (!want && !nums.empty()) want = any_float ? Attribute::Kind::kFloats : Attribute::Kind::kInts;
      if (want && *want != k) return error(e, fmt::format("expected an element of {}", attr_kind_name(*want)));
      elem = k;
      if (k == Attribute::Kind::kStrings) {
        a.strings.push_back(next().text);
      } else if (k == Attribute::Kind::kTensors) {
        KILN_ASSIGN_OR_RETURN(Tensor x, tensor());
        a.tensors.push_back(std::move(x));
      } else if (k == Attribute::Kind::kGraphs) {
        KILN_ASSIGN_OR_RETURN(std::shared_ptr<Graph> sg, subgraph(g, node, scope));
        a.graphs.push_back(std::move(sg));
      } else {
        KILN_ASSIGN_OR_RETURN(Type ty, type_attr());
        a.types.push_back(std::move(ty));
      }
    }
    ++p_;
    if (!kind) kind = elem;
    if (!kind && !nums.empty()) kind = any_float ? Attribute::Kind::kFloats : Attribute::Kind::kInts;
    if (!kind) return error(t, "an empty list needs its kind, e.g. ints[]");
    a.kind = *kind;
    for (const Scalar& s : nums) {
      if (a.kind == Attribute::Kind::kInts) a.ints.push_back(s.i);
      else a.floats.push_back(s.is_float ? float(s.f) : float(s.i));
    }
    return a;
  }

  Expected<std::shared_ptr<Graph>> subgraph(Graph* g, Node* node, const Scope& scope) {
    Nest nest(depth_);
    if (depth_ > kMaxNesting) return too_deep();
    auto sg = std::make_shared<Graph>();
    sg->parent = g;
    sg->parent_node = node;
    KILN_RETURN_IF_ERROR(graph(sg.get(), &scope));
    return sg;
  }

  Expected<Type> type_attr() {
    KILN_RETURN_IF_ERROR(keyword("type"));
    KILN_RETURN_IF_ERROR(punct("<"));
    KILN_ASSIGN_OR_RETURN(Type ty, parse_type_here());
    KILN_RETURN_IF_ERROR(punct(">"));
    return ty;
  }

  struct Scalar {
    bool is_float = false;
    int64_t i = 0;
    double f = 0;
  };
  // [-] (integer | decimal | nan | inf)
  Expected<Scalar> scalar() {
    bool neg = accept("-");
    const Token& t = cur();
    Scalar s;
    if (is_ident("nan") || is_ident("inf")) {
      ++p_;
      s.is_float = true;
      s.f = t.text == "nan" ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
    } else if (t.kind == Tok::kNumber) {
      ++p_;
      if (t.text.find_first_of(".eE") != std::string::npos) {
        s.is_float = true;
        s.f = std::strtod(t.text.c_str(), nullptr);
      } else {
        // Parse the magnitude unsigned so that -9223372036854775808 reads.
        errno = 0;
        unsigned long long m = std::strtoull(t.text.c_str(), nullptr, 10);
        uint64_t limit = neg ? uint64_t(1) << 63 : uint64_t(std::numeric_limits<int64_t>::max());
        if (errno == ERANGE || m > limit) return error(t, "integer out of range: " + t.text);
        s.i = neg ? int64_t(0 - uint64_t(m)) : int64_t(m);
        return s;
      }
    } else {
      return expected("a number");
    }
    if (neg) s.f = -s.f;
    return s;
  }

  Expected<int64_t> integer(const Token& t) {
    errno = 0;
    long long v = std::strtoll(t.text.c_str(), nullptr, 10);
    if (errno == ERANGE || t.text.find_first_of(".eE") != std::string::npos) return error(t, "expected an integer, got " + t.text);
    return int64_t(v);
  }

  // One tensor element of t's dtype at index i.
  Status element(Tensor& t, int64_t i) {
    const Token& tok = cur();
    return visit_dtype(t.dtype(), [&]<typename T>() -> Status {
      T* d = t.data<T>();
      if constexpr (std::is_same_v<T, std::string>) {
        if (tok.kind != Tok::kString) return expected("a string");
        d[i] = next().text;
      } else if constexpr (std::is_same_v<T, bool>) {
        if (is_ident("true") || is_ident("false")) {
          d[i] = next().text == "true";
        } else {
          KILN_ASSIGN_OR_RETURN(Scalar s, scalar());
          if (s.is_float || (s.i != 0 && s.i != 1)) return error(tok, "expected true or false");
          d[i] = s.i != 0;
        }
      } else if constexpr (is_float_v<T>) {
        bool neg = accept("-");
        const Token& n = cur();
        double v;
        if (is_ident("nan") || is_ident("inf")) {
          v = n.text == "nan" ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
        } else if (n.kind == Tok::kNumber) {
          // strtof for narrow types: strtod then a cast could round twice.
          v = std::is_same_v<T, double> ? std::strtod(n.text.c_str(), nullptr) : double(std::strtof(n.text.c_str(), nullptr));
        } else {
          return expected("a number");
        }
        ++p_;
        if (neg) v = -v;
        if constexpr (std::is_same_v<T, double>) d[i] = v;
        else if constexpr (std::is_same_v<T, float>) d[i] = float(v);
        else d[i] = T(float(v));
      } else if constexpr (std::is_same_v<T, uint64_t>) {  // may exceed INT64_MAX
        errno = 0;
        unsigned long long v = std::strtoull(tok.text.c_str(), nullptr, 10);
        if (tok.kind != Tok::kNumber || tok.text.find_first_of(".eE") != std::string::npos || errno == ERANGE) {
          return error(tok, "expected an integer that fits u64");
        }
        ++p_;
        d[i] = uint64_t(v);
      } else {
        KILN_ASSIGN_OR_RETURN(Scalar s, scalar());
        if (s.is_float || s.i < int64_t(std::numeric_limits<T>::min()) || s.i > int64_t(std::numeric_limits<T>::max())) {
          return error(tok, fmt::format("expected an integer that fits {}", dtype_name(t.dtype())));
        }
        d[i] = T(s.i);
      }
      return Status::ok();
    });
  }

  Expected<Dim> dim_expr() {
    Nest nest(depth_);
    if (depth_ > kMaxNesting) return too_deep();
    KILN_ASSIGN_OR_RETURN(Dim d, dim_term());
    for (;;) {
      if (accept("+")) {
        KILN_ASSIGN_OR_RETURN(Dim r, dim_term());
        d = d + r;
      } else if (accept("-")) {
        KILN_ASSIGN_OR_RETURN(Dim r, dim_term());
        d = d - r;
      } else {
        return d;
      }
    }
  }
  Expected<Dim> dim_term() {
    KILN_ASSIGN_OR_RETURN(Dim d, dim_unary());
    for (;;) {
      if (accept("*")) {
        KILN_ASSIGN_OR_RETURN(Dim r, dim_unary());
        d = d * r;
      } else if (is_punct("/")) {
        const Token& at = next();
        KILN_ASSIGN_OR_RETURN(Dim r, dim_unary());
        if (r.is_static() && r.value() == 0) return error(at, "division by zero");
        d = d / r;
      } else {
        return d;
      }
    }
  }
  Expected<Dim> dim_unary() {
    Nest nest(depth_);
    if (depth_ > kMaxNesting) return too_deep();
    if (accept("-")) {
      KILN_ASSIGN_OR_RETURN(Dim d, dim_unary());
      return Dim(int64_t{0}) - d;
    }
    return dim_primary();
  }
  // A parenthesized expression directly followed by "/(" is one quotient atom: Dim::to_string
  // prints 2*((N+1)/2) as "2*(N+1)/(2)", and that must read back as the same product.
  Expected<Dim> dim_primary() {
    const Token& t = cur();
    if (t.kind == Tok::kNumber) {
      KILN_ASSIGN_OR_RETURN(int64_t v, integer(next()));
      return Dim(v);
    }
    if (t.kind == Tok::kString) return Dim::symbol(next().text);
    if (accept("?")) return Dim::unknown();
    if (t.kind == Tok::kIdent) {
      ++p_;
      if ((t.text == "max" || t.text == "min") && accept("(")) {
        KILN_ASSIGN_OR_RETURN(Dim a, dim_expr());
        KILN_RETURN_IF_ERROR(punct(","));
        KILN_ASSIGN_OR_RETURN(Dim b, dim_expr());
        KILN_RETURN_IF_ERROR(punct(")"));
        return t.text == "max" ? dim_max(a, b) : dim_min(a, b);
      }
      return Dim::symbol(t.text);
    }
    if (accept("(")) {
      KILN_ASSIGN_OR_RETURN(Dim a, dim_expr());
      KILN_RETURN_IF_ERROR(punct(")"));
      if (is_punct("/") && t_[p_ + 1].kind == Tok::kPunct && t_[p_ + 1].text == "(") {
        const Token& at = next();
        ++p_;
        KILN_ASSIGN_OR_RETURN(Dim b, dim_expr());
        KILN_RETURN_IF_ERROR(punct(")"));
        if (b.is_static() && b.value() == 0) return error(at, "division by zero");
        return a / b;
      }
      return a;
    }
    return expected("a dimension (integer, name, '(' or '?')");
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  int depth_ = 0;  // current nesting (Nest)
  ParseOptions opt_;
};

template <typename T, typename F>
Expected<T> parse_whole(std::string_view text, F&& f, ParseOptions opt = {}) {
  KILN_ASSIGN_OR_RETURN(std::vector<Token> toks, Lexer(text).run());
  Parser p(std::move(toks), opt);
  KILN_ASSIGN_OR_RETURN(T v, f(p));
  KILN_RETURN_IF_ERROR(p.expect_end());
  return v;
}

}  // namespace

Expected<std::unique_ptr<Graph>> parse_graph(std::string_view text, const ParseOptions& options) {
  return parse_whole<std::unique_ptr<Graph>>(
      text,
      [](Parser& p) -> Expected<std::unique_ptr<Graph>> {
        auto g = std::make_unique<Graph>();
        KILN_RETURN_IF_ERROR(p.graph(g.get(), nullptr));
        return g;
      },
      options);
}

Expected<Type> parse_type(std::string_view text) {
  return parse_whole<Type>(text, [](Parser& p) { return p.parse_type_here(); });
}

Expected<Dim> parse_dim(std::string_view text) {
  return parse_whole<Dim>(text, [](Parser& p) { return p.dim(); });
}

Expected<Tensor> parse_tensor(std::string_view text) {
  return parse_whole<Tensor>(text, [](Parser& p) { return p.tensor(); });
}

}  // namespace kiln
