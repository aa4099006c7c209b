// Helpers shared by the norm family files (norm.cc, nn_norm_misc.cc): statistics in double.
#pragma once

#include "ops/nn_util.h"

namespace kiln {

struct Moments {
  double mean = 0, var = 0;  // population variance
};
// Two-pass mean and variance of x[0], x[stride], ..., x[(n-1)*stride].
Moments moments(const double* x, int64_t n, int64_t stride);

// Requires dt to be one of the float types the norm ops accept.
Status check_nn_float(InferCtx& c, DType dt);

}  // namespace kiln
