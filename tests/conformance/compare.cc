#include "compare.h"

#include <cmath>

namespace kiln::conformance {

Tolerance tolerance_for(DType dt) {
  switch (dt) {
    case DType::kFloat16: return {1e-2, 1e-3};
    case DType::kBFloat16: return {2e-2, 1e-2};
    case DType::kFloat8E4M3FN: case DType::kFloat8E4M3FNUZ: case DType::kFloat8E5M2: case DType::kFloat8E5M2FNUZ:
      return {1e-1, 1e-2};
    default: return {};
  }
}

std::string compare_tensors(const Tensor& want, const Tensor& got, const Tolerance& tol) {
  if (want.dtype() != got.dtype()) {
    return fmt::format("dtype: expected {}, got {}", dtype_name(want.dtype()), dtype_name(got.dtype()));
  }
  if (want.dims() != got.dims()) {
    return fmt::format("shape: expected {}, got {}", dims_to_string(want.dims()), dims_to_string(got.dims()));
  }
  return visit_dtype(want.dtype(), [&]<typename T>() -> std::string {
    const T* a = want.data<T>();
    const T* b = got.data<T>();
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < want.numel(); ++i) {
      bool ok;
      if constexpr (is_float_v<T>) {
        double x = double(compute_t<T>(a[i])), y = double(compute_t<T>(b[i]));
        if (std::isnan(x) || std::isnan(y)) ok = std::isnan(x) && std::isnan(y);
        else if (std::isinf(x) || std::isinf(y)) ok = x == y;
        else ok = std::fabs(x - y) <= tol.atol + tol.rtol * std::fabs(x);
      } else {
        ok = a[i] == b[i];
      }
      if (!ok) { if (first < 0) first = i; ++bad; }
    }
    if (!bad) return "";
    std::string ex, gt;
    if constexpr (std::is_same_v<T, std::string>) { ex = "'" + a[first] + "'"; gt = "'" + b[first] + "'"; }
    else if constexpr (is_float_v<T>) { ex = fmt::format("{}", double(compute_t<T>(a[first]))); gt = fmt::format("{}", double(compute_t<T>(b[first]))); }
    else { ex = fmt::format("{}", int64_t(a[first])); gt = fmt::format("{}", int64_t(b[first])); }
    return fmt::format("{} of {} values differ; first at flat index {}: expected {}, got {}", bad, want.numel(), first, ex, gt);
  });
}

std::string compare_shape_only(const Tensor& want, const Tensor& got) {
  if (want.dtype() != got.dtype()) {
    return fmt::format("dtype: expected {}, got {}", dtype_name(want.dtype()), dtype_name(got.dtype()));
  }
  if (want.dims() != got.dims()) {
    return fmt::format("shape: expected {}, got {}", dims_to_string(want.dims()), dims_to_string(got.dims()));
  }
  if (dtype_is_float(got.dtype())) {
    for (int64_t i = 0; i < got.numel(); ++i) {
      if (!std::isfinite(got.as_double(i))) return fmt::format("non-finite value at {}", i);
    }
  }
  return "";
}

}  // namespace kiln::conformance
