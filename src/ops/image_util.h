// Helpers shared by the image family's files (image.cc, image_resize.cc, image_grid.cc): the
// registration entry points of the sub-files, string-attribute enums, and value conversions.
#pragma once

#include <cmath>
#include <string>

#include "ops/elementwise_util.h"

namespace kiln {

void register_image_resize_ops(OpRegistry& r);  // Resize
void register_image_grid_ops(OpRegistry& r);    // GridSample, AffineGrid

// One allowed value of a string attribute and the enum it maps to.
template <typename E>
struct NamedValue {
  const char* name;
  E value;
};

// Reads string attribute `attr` (default `dflt`) and maps it through `table`; an unknown value is
// an error listing the allowed ones. Works with InferCtx and KernelCtx.
template <typename Ctx, typename E, size_t N>
Expected<E> parse_enum_attr(const Ctx& c, const char* attr, const char* dflt, const NamedValue<E> (&table)[N]) {
  std::string s = c.node().attr_string(attr, dflt);
  std::string allowed;
  for (const auto& v : table) {
    if (s == v.name) return v.value;
    allowed += (allowed.empty() ? "'" : ", '") + std::string(v.name) + "'";
  }
  return c.error("attribute {} must be one of {}, got '{}'", attr, allowed, s);
}

// A double converted to element type T the way the ONNX reference does after float math:
// integers round half to even and saturate; floats convert; strings get "".
template <typename T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, std::string>) {
    return T();
  } else if constexpr (std::is_same_v<T, bool>) {
    return v != 0;
  } else if constexpr (is_int_v<T>) {
    return saturate_cast<T>(std::nearbyint(v));
  } else {
    return static_cast<T>(static_cast<compute_t<T>>(v));
  }
}

}  // namespace kiln
