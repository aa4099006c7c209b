#include "support/float_types.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

namespace kiln {

uint16_t float_to_half_bits(float f) {
  uint32_t x = float_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    return uint16_t(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u | ((abs >> 13) & 0x3ffu) : 0));
  }
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds past 65504 -> inf
  if (abs < 0x38800000u) {  // result is subnormal or zero: let float arithmetic round (RNE)
    float v = bits_float(abs) * 16777216.0f;  // scale by 2^24: half subnormal unit is 2^-24
    return uint16_t(sign | uint32_t(std::nearbyint(v)));
  }
  uint32_t mant_odd = (abs >> 13) & 1u;
  abs += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
  return uint16_t(sign | (abs >> 13));
}

float half_bits_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    float v = float(mant) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t float_to_bf16_bits(float f) {
  uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return uint16_t((x + rounding) >> 16);
}

namespace {

struct F8Spec {
  int exp_bits, mant_bits, bias;
  bool has_inf;   // E5M2 only
  bool uz;        // no negative zero; 0x80 is the one NaN
};

constexpr F8Spec spec_of(F8Format f) {
  switch (f) {
    case F8Format::kE4M3FN: return {4, 3, 7, false, false};
    case F8Format::kE4M3FNUZ: return {4, 3, 8, false, true};
    case F8Format::kE5M2: return {5, 2, 15, true, false};
    case F8Format::kE5M2FNUZ: return {5, 2, 16, false, true};
  }
  return {4, 3, 7, false, false};
}

// Decodes one code; returns NaN for NaN codes.
float decode(uint8_t v, const F8Spec& s) {
  if (s.uz && v == 0x80) return std::numeric_limits<float>::quiet_NaN();
  bool neg = v & 0x80;
  int e = (v >> s.mant_bits) & ((1 << s.exp_bits) - 1);
  int m = v & ((1 << s.mant_bits) - 1);
  int emax = (1 << s.exp_bits) - 1;
  float r;
  if (s.has_inf && e == emax) {
    r = m == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  } else if (!s.has_inf && !s.uz && e == emax && m == (1 << s.mant_bits) - 1) {
    r = std::numeric_limits<float>::quiet_NaN();  // E4M3FN: S.1111.111
  } else if (e == 0) {
    r = std::ldexp(float(m), 1 - s.bias - s.mant_bits);
  } else {
    r = std::ldexp(float(m + (1 << s.mant_bits)), e - s.bias - s.mant_bits);
  }
  return neg ? -r : r;
}

struct F8Table {
  std::array<float, 256> decoded;
  std::array<std::pair<float, uint8_t>, 128> positive;  // finite positive values, sorted
  int count = 0;
  float max_finite = 0;
};

const F8Table& table_of(F8Format f) {
  static const auto build = [](F8Format fmt) {
    F8Table t;
    F8Spec s = spec_of(fmt);
    for (int i = 0; i < 256; ++i) t.decoded[i] = decode(uint8_t(i), s);
    for (int i = 0; i < 128; ++i) {
      float v = t.decoded[i];
      if (std::isfinite(v)) t.positive[t.count++] = {v, uint8_t(i)};
    }
    std::sort(t.positive.begin(), t.positive.begin() + t.count);
    t.max_finite = t.positive[t.count - 1].first;
    return t;
  };
  static const F8Table tables[4] = {build(F8Format::kE4M3FN), build(F8Format::kE4M3FNUZ),
                                    build(F8Format::kE5M2), build(F8Format::kE5M2FNUZ)};
  return tables[int(f)];
}

}  // namespace

float f8_to_float(uint8_t v, F8Format fmt) { return table_of(fmt).decoded[v]; }

uint8_t float_to_f8(float f, F8Format fmt, bool saturate) {
  const F8Spec s = spec_of(fmt);
  const F8Table& t = table_of(fmt);
  const uint8_t nan_code = s.uz ? 0x80 : 0x7f;
  if (std::isnan(f)) return nan_code;
  bool neg = std::signbit(f);
  float a = std::fabs(f);
  uint8_t sign = neg ? 0x80 : 0;
  auto out_of_range = [&]() -> uint8_t {
    if (saturate) return uint8_t((s.uz ? 0 : sign) | (t.positive[t.count - 1].second));
    if (s.has_inf) return uint8_t(sign | 0x7c);
    return nan_code;
  };
  if (std::isinf(a)) return out_of_range();
  // Round |f| to the grid of its binade (round half to even), then find that grid value's code.
  int min_exp = 1 - s.bias;  // exponent of the smallest normal
  int e = a > 0 ? std::ilogb(a) : min_exp;
  if (e < min_exp) e = min_exp;
  double quantum = std::ldexp(1.0, e - s.mant_bits);
  double q = std::nearbyint(double(a) / quantum) * quantum;
  if (q > t.max_finite) return out_of_range();
  if (q == 0) return s.uz ? 0 : sign;
  auto it = std::lower_bound(t.positive.begin(), t.positive.begin() + t.count,
                             std::pair<float, uint8_t>{float(q), 0});
  return uint8_t(sign | it->second);
}

// ---- float4 e2m1 ---------------------------------------------------------------------------------

float f4e2m1_to_float(uint8_t v) {
  static constexpr float kMagnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = kMagnitude[v & 7];
  return (v & 8) ? -m : m;
}

uint8_t float_to_f4e2m1(float f) {
  if (std::isnan(f)) return 8;  // as ml_dtypes (the ONNX reference): NaN has no encoding and becomes -0
  const uint8_t sign = std::signbit(f) ? 8 : 0;
  const float a = std::fabs(f);
  // Midpoints between neighbouring magnitudes; a tie goes to the code with an even mantissa bit.
  static constexpr float kMid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  uint8_t code = 0;
  while (code < 7 && (a > kMid[code] || (a == kMid[code] && (code & 1)))) ++code;
  return uint8_t(sign | code);
}

}  // namespace kiln
