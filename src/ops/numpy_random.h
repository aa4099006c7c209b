// numpy's legacy RandomState.random_sample, for seeded ops whose ONNX reference draws with numpy
// (Dropout's mask): the CPU kernel and the CUDA lowering draw the same values.
#pragma once

#include <random>

namespace kiln {

// 53 random bits from two MT19937 draws. std::mt19937 seeds exactly as numpy.random.seed(int) does.
inline double numpy_random_sample(std::mt19937& g) {
  const uint32_t a = g() >> 5, b = g() >> 6;
  return (double(a) * 67108864.0 + double(b)) / 9007199254740992.0;
}

}  // namespace kiln
