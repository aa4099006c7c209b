// Element helpers for the reduce family: the accumulator type of a reduction, conversion back to the
// element type, and NaN-aware comparisons (NaN orders above every number, as numpy sorts it).
#pragma once

#include <cmath>
#include <type_traits>

#include "support/dtype.h"

namespace kiln {

// Floats accumulate in double; integers in 64 bits of their signedness; bool as 0/1.
template <typename T>
using acc_t = std::conditional_t<is_float_v<T>, double,
                                 std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>>;

template <typename T>
acc_t<T> to_acc(T v) {
  return acc_t<T>(compute_t<T>(v));
}

template <typename T, typename A>
T from_acc(A a) {
  if constexpr (is_reduced_float_v<T>) return T(float(a));
  else if constexpr (std::is_same_v<T, bool>) return a != 0;
  else return static_cast<T>(a);
}

template <typename A>
bool is_nan(A v) {
  if constexpr (std::is_floating_point_v<A>) return std::isnan(v);
  else return false;
}

// a < b with NaN above everything (and NaNs equal to each other).
template <typename A>
bool less_nan_last(A a, A b) {
  if (is_nan(a)) return false;
  if (is_nan(b)) return true;
  return a < b;
}

}  // namespace kiln
