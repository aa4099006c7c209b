// Storage types for the reduced-precision floats ONNX uses: IEEE half, bfloat16 and the four
// float8 variants. Each is a bit container that converts to and from float with round-to-nearest-even;
// arithmetic is done in float by the kernels (the CPU backend is the oracle, not the fast path).
#pragma once

#include <cstdint>
#include <cstring>

namespace kiln {

inline uint32_t float_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

uint16_t float_to_half_bits(float f);
float half_bits_to_float(uint16_t h);
uint16_t float_to_bf16_bits(float f);
inline float bf16_bits_to_float(uint16_t b) { return bits_float(uint32_t(b) << 16); }

// float8 formats, named as in ONNX (FN: no infinities; UZ: no negative zero, NaN is 0x80).
enum class F8Format { kE4M3FN, kE4M3FNUZ, kE5M2, kE5M2FNUZ };
// saturate=true clamps out-of-range finite values to the largest finite value (ONNX Cast default).
uint8_t float_to_f8(float f, F8Format fmt, bool saturate = true);
float f8_to_float(uint8_t v, F8Format fmt);

struct half {
  uint16_t bits = 0;
  half() = default;
  explicit half(float f) : bits(float_to_half_bits(f)) {}
  operator float() const { return half_bits_to_float(bits); }  // NOLINT: implicit widening
};

struct bfloat16 {
  uint16_t bits = 0;
  bfloat16() = default;
  explicit bfloat16(float f) : bits(float_to_bf16_bits(f)) {}
  operator float() const { return bf16_bits_to_float(bits); }  // NOLINT
};

template <F8Format kFmt>
struct float8 {
  uint8_t bits = 0;
  float8() = default;
  explicit float8(float f) : bits(float_to_f8(f, kFmt, true)) {}
  static float8 from_bits(uint8_t b) { float8 r; r.bits = b; return r; }
  operator float() const { return f8_to_float(bits, kFmt); }  // NOLINT
};
using f8e4m3fn = float8<F8Format::kE4M3FN>;
using f8e4m3fnuz = float8<F8Format::kE4M3FNUZ>;
using f8e5m2 = float8<F8Format::kE5M2>;
using f8e5m2fnuz = float8<F8Format::kE5M2FNUZ>;

}  // namespace kiln
