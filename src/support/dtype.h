// DType: the element type of a tensor, and dispatch from a runtime DType to C++ code.
//
//   visit_dtype(t.dtype(), [&]<typename T>() { auto* p = t.data<T>(); ... });
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "kiln/dtype.h"
#include "support/float_types.h"

namespace kiln {

// DType is public (include/kiln/dtype.h); its enumerators must follow dtypes.def's order.
#define KILN_DTYPE(e, T, code, name) e##_position_,
enum class DTypeDefOrder_ {
#include "support/dtypes.def"
};
#undef KILN_DTYPE
#define KILN_DTYPE(e, T, code, name) \
  static_assert(int(DType::e) == int(DTypeDefOrder_::e##_position_), "include/kiln/dtype.h out of order: " #e);
#include "support/dtypes.def"
#undef KILN_DTYPE

inline constexpr int kNumDTypes = 0
#define KILN_DTYPE(e, T, code, name) +1
#include "support/dtypes.def"
#undef KILN_DTYPE
    ;
static_assert(int(DType::kInt2) + 1 == kNumDTypes, "include/kiln/dtype.h and dtypes.def differ in length");

std::optional<DType> dtype_from_name(std::string_view name);
std::optional<DType> dtype_from_onnx(int32_t onnx_code);    // TensorProto.DataType
int32_t dtype_to_onnx(DType t);
std::string_view dtype_onnx_name(DType t);                  // "FLOAT", for messages
int dtype_bits(DType t);                                    // bits per element in ONNX files (4 for int4)
bool dtype_is_float(DType t);                               // f64 f32 f16 bf16 f8*
bool dtype_is_int(DType t);                                 // signed or unsigned integer
bool dtype_is_signed(DType t);
bool dtype_is_f8(DType t);
bool dtype_is_packed(DType t);                              // sub-byte: int4 uint4 int2 uint2 f4e2m1

template <DType D> struct dtype_traits;
#define KILN_DTYPE(e, T, code, name) \
  template <> struct dtype_traits<DType::e> { using type = T; };
#include "support/dtypes.def"
#undef KILN_DTYPE

template <typename T> constexpr DType dtype_of();
#define KILN_DTYPE(e, T, code, name) \
  template <> constexpr DType dtype_of<T>() { return DType::e; }
#include "support/dtypes.def"
#undef KILN_DTYPE

// Calls f.template operator()<T>() with T the C++ type of dt.
template <typename F>
decltype(auto) visit_dtype(DType dt, F&& f) {
  switch (dt) {
#define KILN_DTYPE(e, T, code, name) \
    case DType::e: return f.template operator()<T>();
#include "support/dtypes.def"
#undef KILN_DTYPE
  }
  return f.template operator()<float>();  // unreachable: the switch covers every DType
}

template <typename T>
inline constexpr bool is_reduced_float_v =
    std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, f8e4m3fn> ||
    std::is_same_v<T, f8e4m3fnuz> || std::is_same_v<T, f8e5m2> || std::is_same_v<T, f8e5m2fnuz> ||
    std::is_same_v<T, float4e2m1>;
template <typename T>
inline constexpr bool is_small_int_v =
    std::is_same_v<T, int4> || std::is_same_v<T, uint4> || std::is_same_v<T, int2> || std::is_same_v<T, uint2>;
template <typename T>
inline constexpr bool is_float_v = std::is_floating_point_v<T> || is_reduced_float_v<T>;
template <typename T>
inline constexpr bool is_numeric_v = is_float_v<T> || (std::is_integral_v<T> && !std::is_same_v<T, bool>);

// The type arithmetic on T is done in: float for the reduced floats, T otherwise.
template <typename T>
using compute_t = std::conditional_t<is_reduced_float_v<T>, float, T>;

}  // namespace kiln
