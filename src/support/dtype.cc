#include "support/dtype.h"

#include <string>

namespace kiln {

std::string_view dtype_name(DType t) {
  switch (t) {
#define KILN_DTYPE(e, T, code, name) case DType::e: return name;
#include "support/dtypes.def"
#undef KILN_DTYPE
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view n) {
#define KILN_DTYPE(e, T, code, name) if (n == name) return DType::e;
#include "support/dtypes.def"
#undef KILN_DTYPE
  return std::nullopt;
}

std::optional<DType> dtype_from_onnx(int32_t c) {
#define KILN_DTYPE(e, T, code, name) if (c == code) return DType::e;
#include "support/dtypes.def"
#undef KILN_DTYPE
  return std::nullopt;
}

int32_t dtype_to_onnx(DType t) {
  switch (t) {
#define KILN_DTYPE(e, T, code, name) case DType::e: return code;
#include "support/dtypes.def"
#undef KILN_DTYPE
  }
  return 0;
}

std::string_view dtype_onnx_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "FLOAT";
    case DType::kUInt8: return "UINT8";
    case DType::kInt8: return "INT8";
    case DType::kUInt16: return "UINT16";
    case DType::kInt16: return "INT16";
    case DType::kInt32: return "INT32";
    case DType::kInt64: return "INT64";
    case DType::kString: return "STRING";
    case DType::kBool: return "BOOL";
    case DType::kFloat16: return "FLOAT16";
    case DType::kFloat64: return "DOUBLE";
    case DType::kUInt32: return "UINT32";
    case DType::kUInt64: return "UINT64";
    case DType::kBFloat16: return "BFLOAT16";
    case DType::kFloat8E4M3FN: return "FLOAT8E4M3FN";
    case DType::kFloat8E4M3FNUZ: return "FLOAT8E4M3FNUZ";
    case DType::kFloat8E5M2: return "FLOAT8E5M2";
    case DType::kFloat8E5M2FNUZ: return "FLOAT8E5M2FNUZ";
    case DType::kUInt4: return "UINT4";
    case DType::kInt4: return "INT4";
    case DType::kFloat4E2M1: return "FLOAT4E2M1";
    case DType::kUInt2: return "UINT2";
    case DType::kInt2: return "INT2";
  }
  return "?";
}

size_t dtype_size(DType t) {
  return visit_dtype(t, []<typename T>() -> size_t { return sizeof(T); });
}

int dtype_bits(DType t) {
  switch (t) {
    case DType::kUInt4: case DType::kInt4: case DType::kFloat4E2M1: return 4;
    case DType::kUInt2: case DType::kInt2: return 2;
    default: return int(dtype_size(t) * 8);
  }
}

bool dtype_is_packed(DType t) { return t != DType::kString && dtype_bits(t) < 8; }

bool dtype_is_float(DType t) {
  return visit_dtype(t, []<typename T>() { return is_float_v<T>; });
}

bool dtype_is_int(DType t) {
  return visit_dtype(t, []<typename T>() {
    return (std::is_integral_v<T> && !std::is_same_v<T, bool>) || is_small_int_v<T>;
  });
}

bool dtype_is_signed(DType t) {
  return visit_dtype(t, []<typename T>() {
    if constexpr (std::is_arithmetic_v<T>) return std::is_signed_v<T>;
    else if constexpr (is_small_int_v<T>) return T::kMin < 0;
    else return is_reduced_float_v<T>;
  });
}

bool dtype_is_f8(DType t) {
  return t == DType::kFloat8E4M3FN || t == DType::kFloat8E4M3FNUZ || t == DType::kFloat8E5M2 ||
         t == DType::kFloat8E5M2FNUZ;
}

}  // namespace kiln
