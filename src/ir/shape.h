// Dim and Shape: tensor dimensions that are either known integers or symbolic expressions over
// named dims (ONNX dim_param), so a batch size "N" flows through as N, N*12, (N+1)/2...
//
//   Dim n = Dim::symbol("N");
//   Dim m = n * Dim(2) + Dim(1);   // prints "2*N+1"; (m - Dim(1)) / Dim(2) == n
//
// A symbolic dim is a polynomial with integer coefficients over atoms; an atom is a symbol or an
// irreducible quotient such as "(N+1)/2". Equal polynomials compare equal, so shape checks can
// prove N*2 == 2*N without knowing N.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kiln {

class Dim {
 public:
  Dim() = default;  // unknown: neither a number nor a name (ONNX dims with no value or param)
  Dim(int64_t v) : kind_(Kind::kStatic), value_(v) {}  // NOLINT: ints are dims
  static Dim symbol(const std::string& name);
  static Dim unknown() { return Dim(); }

  bool is_static() const { return kind_ == Kind::kStatic; }
  bool is_symbolic() const { return kind_ == Kind::kSymbolic; }
  bool is_unknown() const { return kind_ == Kind::kUnknown; }
  int64_t value() const;  // requires is_static()
  std::string to_string() const;  // "3", "N", "2*N+1", "?"

  // Values of all symbols; returns nullopt if some symbol is unbound or the dim is unknown.
  std::optional<int64_t> evaluate(const std::map<std::string, int64_t>& bindings) const;
  // True if both are known and provably equal (static equal, or identical polynomials).
  bool same_as(const Dim& o) const;
  // True if the two could be equal (either is unknown/symbolic, or both are equal statics).
  bool compatible(const Dim& o) const;
  bool operator==(const Dim& o) const { return same_as(o) || (is_unknown() && o.is_unknown()); }
  bool operator!=(const Dim& o) const { return !(*this == o); }

  friend Dim operator+(const Dim& a, const Dim& b);
  friend Dim operator-(const Dim& a, const Dim& b);
  friend Dim operator*(const Dim& a, const Dim& b);
  friend Dim floor_div(const Dim& a, const Dim& b);  // b must not be static 0
  friend Dim ceil_div(const Dim& a, const Dim& b);
  friend Dim operator/(const Dim& a, const Dim& b) { return floor_div(a, b); }
  friend Dim dim_max(const Dim& a, const Dim& b);   // only folds statics; else a derived atom
  friend Dim dim_min(const Dim& a, const Dim& b);

  // Polynomial form: monomial (sorted atom names, repeated for powers) -> coefficient.
  using Poly = std::map<std::vector<std::string>, int64_t>;

 private:
  enum class Kind { kUnknown, kStatic, kSymbolic };
  static Dim from_poly(Poly p);
  Poly poly() const;
  Kind kind_ = Kind::kUnknown;
  int64_t value_ = 0;
  std::shared_ptr<const Poly> poly_;
};

// nullopt rank is represented by std::optional<Shape> in Type.
struct Shape {
  std::vector<Dim> dims;
  Shape() = default;
  Shape(std::vector<Dim> d) : dims(std::move(d)) {}  // NOLINT
  Shape(std::initializer_list<Dim> d) : dims(d) {}
  static Shape of(const std::vector<int64_t>& v);
  size_t rank() const { return dims.size(); }
  const Dim& operator[](size_t i) const { return dims[i]; }
  Dim& operator[](size_t i) { return dims[i]; }
  bool is_static() const;
  std::optional<std::vector<int64_t>> static_dims() const;
  Dim numel() const;
  std::string to_string() const;  // "[N,3,224,224]"
  bool operator==(const Shape& o) const { return dims == o.dims; }
};

}  // namespace kiln
