// Element conversion with ONNX Cast semantics, shared by Cast/CastLike and any kernel that has to
// write a double or another dtype into a tensor of arbitrary type (Range, random ops, EyeLike...).
//
//   Tensor out = ...;                       // some dtype
//   visit_dtype(out.dtype(), [&]<typename T>() { out.data<T>()[0] = cast_value<T>(3.5); });
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "ir/tensor.h"
#include "ops/op_registry.h"

namespace kiln {

template <typename T>
inline constexpr bool is_f8_v = std::is_same_v<T, f8e4m3fn> || std::is_same_v<T, f8e4m3fnuz> ||
                                std::is_same_v<T, f8e5m2> || std::is_same_v<T, f8e5m2fnuz>;

// Numeric text <-> values, as numpy's astype(str) / astype(float) do it (Cast to/from string).
std::string number_to_string(double v, DType from);  // shortest text that round-trips in `from`
std::string int_to_string(int64_t v);
std::string uint_to_string(uint64_t v);
double string_to_double(const std::string& s);      // "+INF", "nan", "1e-5"...; junk gives NaN
bool string_to_int(const std::string& s, int64_t* out);  // exact integer text only

namespace cast_detail {

// Float to integer: ONNX leaves out-of-range undefined; C++ makes it UB. Clamp into int64 (NaN -> 0)
// and then wrap into the target, which is what x86 hardware does for the in-range-of-int64 cases.
template <typename To>
To float_to_int(double v) {
  if (std::isnan(v)) return To(0);
  if constexpr (std::is_same_v<To, uint64_t>) {
    if (v >= 18446744073709551616.0) return std::numeric_limits<uint64_t>::max();
    if (v >= 0) return static_cast<uint64_t>(v);
  }
  if (v >= 9223372036854775808.0) return static_cast<To>(std::numeric_limits<int64_t>::max());
  if (v < -9223372036854775808.0) return static_cast<To>(std::numeric_limits<int64_t>::min());
  return static_cast<To>(static_cast<int64_t>(v));
}

template <typename T>
F8Format f8_format() {
  if constexpr (std::is_same_v<T, f8e4m3fn>) return F8Format::kE4M3FN;
  else if constexpr (std::is_same_v<T, f8e4m3fnuz>) return F8Format::kE4M3FNUZ;
  else if constexpr (std::is_same_v<T, f8e5m2>) return F8Format::kE5M2;
  else return F8Format::kE5M2FNUZ;
}

// float_to_f8 drops the sign when saturating into the FNUZ formats (-inf -> +max instead of -max,
// which those formats can represent); restore it here until support/float_types.cc is fixed.
inline uint8_t to_f8_bits(float f, F8Format fmt, bool saturate) {
  uint8_t b = float_to_f8(f, fmt, saturate);
  bool uz = fmt == F8Format::kE4M3FNUZ || fmt == F8Format::kE5M2FNUZ;
  if (uz && saturate && b != 0 && std::signbit(f) && !std::isnan(f)) b |= 0x80;
  return b;
}

// To from a string's text.
template <typename To>
To from_string(const std::string& s, bool saturate);

}  // namespace cast_detail

// One element From -> To with ONNX Cast rules. `saturate` only matters for float8 targets.
template <typename To, typename From>
To cast_value(const From& v, bool saturate = true) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<To, std::string>) {
    if constexpr (std::is_same_v<From, bool>) return v ? "True" : "False";
    else if constexpr (is_float_v<From>) return number_to_string(double(compute_t<From>(v)), dtype_of<From>());
    else if constexpr (std::is_signed_v<From> || is_small_int_v<From>) return int_to_string(int64_t(int(v)));
    else return uint_to_string(uint64_t(v));
  } else if constexpr (std::is_same_v<From, std::string>) {
    return cast_detail::from_string<To>(v, saturate);
  } else if constexpr (std::is_same_v<To, bool>) {
    return compute_t<From>(v) != compute_t<From>(0);  // NaN is true
  } else if constexpr (is_f8_v<To>) {
    return To::from_bits(cast_detail::to_f8_bits(float(compute_t<From>(v)), cast_detail::f8_format<To>(), saturate));
  } else if constexpr (is_reduced_float_v<To>) {
    return To(float(compute_t<From>(v)));
  } else if constexpr (std::is_floating_point_v<To>) {
    return static_cast<To>(compute_t<From>(v));
  } else if constexpr (is_float_v<From>) {  // float -> integer
    return cast_detail::float_to_int<To>(double(compute_t<From>(v)));
  } else {  // integer or bool -> integer: two's complement wrap
    return static_cast<To>(v);
  }
}

template <typename To>
To cast_detail::from_string(const std::string& s, bool saturate) {
  if constexpr (std::is_same_v<To, std::string>) {
    return s;
  } else if constexpr (std::is_integral_v<To> && !std::is_same_v<To, bool>) {
    int64_t i = 0;
    if (string_to_int(s, &i)) return static_cast<To>(i);
    return float_to_int<To>(string_to_double(s));
  } else if constexpr (std::is_same_v<To, bool>) {
    if (s == "True" || s == "true") return true;
    if (s == "False" || s == "false") return false;
    return cast_value<bool>(string_to_double(s));
  } else {
    return cast_value<To>(string_to_double(s), saturate);
  }
}

// Converts every element of src into dst (same element count, dst's dtype).
void cast_elements(const Tensor& src, Tensor& dst, bool saturate);

// Writes v, converted, into element i of t (any dtype).
void set_element(Tensor& t, int64_t i, double v);

void register_create_cast_ops(OpRegistry& r);
void register_create_random_ops(OpRegistry& r);

}  // namespace kiln
