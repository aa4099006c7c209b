// Output comparison for the conformance runner: dtype, shape, then values with a tolerance that
// depends on the element type (exact for ints, bools and strings; NaN matches NaN).
#pragma once

#include <string>

#include "ir/tensor.h"

namespace kiln::conformance {

struct Tolerance {
  double rtol = 1e-3;
  double atol = 1e-5;
};
Tolerance tolerance_for(DType dt);

// Empty string when `got` matches `want`; otherwise what differs, with the first bad element.
std::string compare_tensors(const Tensor& want, const Tensor& got, const Tolerance& tol);
// Only dtype and shape (outputs that are random by definition), plus finiteness.
std::string compare_shape_only(const Tensor& want, const Tensor& got);

}  // namespace kiln::conformance
