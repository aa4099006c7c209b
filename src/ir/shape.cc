#include "ir/shape.h"

#include <algorithm>
#include <limits>

#include "support/status.h"

namespace kiln {

namespace {

bool is_plain_identifier(const std::string& s) {
  if (s.empty() || !(isalpha((unsigned char)s[0]) || s[0] == '_')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return isalnum((unsigned char)c) || c == '_'; });
}

// Atoms that are derived expressions ("(N+1)/2", "max(N,M)") print as they are; other names
// print quoted when they are not plain identifiers, so the text form parses back.
std::string atom_text(const std::string& a) {
  if (a.size() > 1 && a[0] == '\x01') return a.substr(1);
  if (is_plain_identifier(a)) return a;
  std::string q = "\"";
  for (char c : a) {
    if (c == '"' || c == '\\') q += '\\';
    q += c;
  }
  return q + "\"";
}

std::string derived_atom(const std::string& text) { return std::string("\x01") + text; }

bool checked_add(int64_t a, int64_t b, int64_t* r) { return !__builtin_add_overflow(a, b, r); }
bool checked_mul(int64_t a, int64_t b, int64_t* r) { return !__builtin_mul_overflow(a, b, r); }

int64_t floor_div_int(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

}  // namespace

Dim Dim::symbol(const std::string& name) {
  Poly p;
  p[{name}] = 1;
  return from_poly(std::move(p));
}

int64_t Dim::value() const {
  KILN_CHECK(is_static(), "Dim::value() on {}", to_string());
  return value_;
}

Dim::Poly Dim::poly() const {
  if (is_static()) {
    Poly p;
    if (value_ != 0) p[{}] = value_;
    return p;
  }
  return poly_ ? *poly_ : Poly{};
}

Dim Dim::from_poly(Poly p) {
  for (auto it = p.begin(); it != p.end();) it = it->second == 0 ? p.erase(it) : std::next(it);
  if (p.empty()) return Dim(int64_t{0});
  if (p.size() == 1 && p.begin()->first.empty()) return Dim(p.begin()->second);
  Dim d;
  d.kind_ = Kind::kSymbolic;
  d.poly_ = std::make_shared<const Poly>(std::move(p));
  return d;
}

std::string Dim::to_string() const {
  if (is_unknown()) return "?";
  if (is_static()) return std::to_string(value_);
  // Highest-degree terms first, constant last: "2*N*M+N+1".
  std::vector<std::pair<std::vector<std::string>, int64_t>> terms(poly_->begin(), poly_->end());
  std::stable_sort(terms.begin(), terms.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  std::string s;
  for (const auto& [mono, coef] : terms) {
    int64_t c = coef;
    if (!s.empty()) s += c < 0 ? "-" : "+";
    else if (c < 0) s += "-";
    uint64_t mag = c < 0 ? uint64_t(0) - uint64_t(c) : uint64_t(c);
    bool first = true;
    if (mag != 1 || mono.empty()) { s += std::to_string(mag); first = false; }
    for (const auto& a : mono) {
      if (!first) s += "*";
      s += atom_text(a);
      first = false;
    }
  }
  return s;
}

std::optional<int64_t> Dim::evaluate(const std::map<std::string, int64_t>& b) const {
  if (is_static()) return value_;
  if (is_unknown()) return std::nullopt;
  int64_t total = 0;
  for (const auto& [mono, coef] : *poly_) {
    int64_t term = coef;
    for (const auto& a : mono) {
      auto it = b.find(a);
      if (it == b.end() || !checked_mul(term, it->second, &term)) return std::nullopt;
    }
    if (!checked_add(total, term, &total)) return std::nullopt;
  }
  return total;
}

bool Dim::same_as(const Dim& o) const {
  if (is_unknown() || o.is_unknown()) return false;
  if (is_static() && o.is_static()) return value_ == o.value_;
  if (is_static() != o.is_static()) return false;
  return *poly_ == *o.poly_;
}

bool Dim::compatible(const Dim& o) const {
  if (is_static() && o.is_static()) return value_ == o.value_;
  return true;
}

Dim operator+(const Dim& a, const Dim& b) {
  if (a.is_unknown() || b.is_unknown()) return Dim();
  if (a.is_static() && b.is_static()) {
    int64_t r;
    return checked_add(a.value_, b.value_, &r) ? Dim(r) : Dim();
  }
  Dim::Poly p = a.poly();
  for (const auto& [m, c] : b.poly()) {
    if (!checked_add(p[m], c, &p[m])) return Dim();
  }
  return Dim::from_poly(std::move(p));
}

Dim operator-(const Dim& a, const Dim& b) {
  if (b.is_unknown()) return Dim();
  if (b.is_static()) return a + Dim(-b.value_);
  Dim::Poly p = b.poly();
  for (auto& [m, c] : p) c = -c;
  return a + Dim::from_poly(std::move(p));
}

Dim operator*(const Dim& a, const Dim& b) {
  if (a.is_unknown() || b.is_unknown()) {
    if ((a.is_static() && a.value_ == 0) || (b.is_static() && b.value_ == 0)) return Dim(int64_t{0});
    return Dim();
  }
  if (a.is_static() && b.is_static()) {
    int64_t r;
    return checked_mul(a.value_, b.value_, &r) ? Dim(r) : Dim();
  }
  Dim::Poly p;
  for (const auto& [ma, ca] : a.poly()) {
    for (const auto& [mb, cb] : b.poly()) {
      std::vector<std::string> m = ma;
      m.insert(m.end(), mb.begin(), mb.end());
      std::sort(m.begin(), m.end());
      int64_t c;
      if (!checked_mul(ca, cb, &c) || !checked_add(p[m], c, &p[m])) return Dim();
    }
  }
  return Dim::from_poly(std::move(p));
}

Dim floor_div(const Dim& a, const Dim& b) {
  if (a.is_unknown() || b.is_unknown()) return Dim();
  if (b.is_static()) {
    int64_t d = b.value_;
    if (d == 0) return Dim();
    if (d == 1) return a;
    if (a.is_static()) return Dim(floor_div_int(a.value_, d));
    // Exact when every coefficient is divisible: (2*N+4)/2 -> N+2.
    Dim::Poly p = a.poly();
    bool exact = std::all_of(p.begin(), p.end(), [d](const auto& t) { return t.second % d == 0; });
    if (exact) {
      for (auto& [m, c] : p) c /= d;
      return Dim::from_poly(std::move(p));
    }
  } else if (a.same_as(b)) {
    return Dim(int64_t{1});
  }
  Dim::Poly p;
  p[{derived_atom("(" + a.to_string() + ")/(" + b.to_string() + ")")}] = 1;
  return Dim::from_poly(std::move(p));
}

Dim ceil_div(const Dim& a, const Dim& b) {
  if (b.is_static() && b.value_ > 0) return floor_div(a + Dim(b.value_ - 1), b);
  return floor_div(a + b - Dim(1), b);
}

Dim dim_max(const Dim& a, const Dim& b) {
  if (a.is_static() && b.is_static()) return Dim(std::max(a.value_, b.value_));
  if (a.same_as(b)) return a;
  if (a.is_unknown() || b.is_unknown()) return Dim();
  Dim::Poly p;
  p[{derived_atom("max(" + a.to_string() + "," + b.to_string() + ")")}] = 1;
  return Dim::from_poly(std::move(p));
}

Dim dim_min(const Dim& a, const Dim& b) {
  if (a.is_static() && b.is_static()) return Dim(std::min(a.value_, b.value_));
  if (a.same_as(b)) return a;
  if (a.is_unknown() || b.is_unknown()) return Dim();
  Dim::Poly p;
  p[{derived_atom("min(" + a.to_string() + "," + b.to_string() + ")")}] = 1;
  return Dim::from_poly(std::move(p));
}

Shape Shape::of(const std::vector<int64_t>& v) {
  Shape s;
  for (int64_t d : v) s.dims.emplace_back(d);
  return s;
}

bool Shape::is_static() const {
  return std::all_of(dims.begin(), dims.end(), [](const Dim& d) { return d.is_static(); });
}

std::optional<std::vector<int64_t>> Shape::static_dims() const {
  if (!is_static()) return std::nullopt;
  std::vector<int64_t> v;
  for (const Dim& d : dims) v.push_back(d.value());
  return v;
}

Dim Shape::numel() const {
  Dim n(int64_t{1});
  for (const Dim& d : dims) n = n * d;
  return n;
}

std::string Shape::to_string() const {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + dims[i].to_string();
  return s + "]";
}

}  // namespace kiln
