// The element types of kiln tensors (ONNX's TensorProto types that kiln runs).
//
//   if (engine.inputs()[0].dtype == kiln::DType::kFloat32) { ... }
//   std::printf("%s\n", kiln::dtype_name(kiln::DType::kFloat16).data());   // "f16"
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kiln {

// The order is kiln's own (src/support/dtypes.def checks it entry by entry); the values are not
// ONNX's codes. Sub-byte types (int4, uint4, int2, uint2, f4e2m1) hold one element per byte.
enum class DType : uint8_t {
  kFloat32, kUInt8, kInt8, kUInt16, kInt16, kInt32, kInt64, kString, kBool, kFloat16, kFloat64,
  kUInt32, kUInt64, kBFloat16, kFloat8E4M3FN, kFloat8E4M3FNUZ, kFloat8E5M2, kFloat8E5M2FNUZ,
  kUInt4, kInt4, kFloat4E2M1, kUInt2, kInt2,
};

std::string_view dtype_name(DType t);  // "f32", "f16", "i64", ...
size_t dtype_size(DType t);            // bytes per element in memory (strings: sizeof(std::string))

}  // namespace kiln
