// Storage types for the reduced-precision numbers ONNX uses: IEEE half, bfloat16, the four float8
// variants, float4 e2m1 and the sub-byte integers int4/uint4/int2/uint2. Sub-byte types are held one
// element per byte in memory; ONNX files pack them (onnx_tensor.cc). Each is a bit container that converts to and from float with round-to-nearest-even;
// arithmetic is done in float by the kernels (the CPU backend is the oracle, not the fast path).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

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

// float4 e2m1 (ONNX FLOAT4E2M1): sign, 2 exponent bits, 1 mantissa bit; finite values only
// (0, 0.5, 1, 1.5, 2, 3, 4, 6). Conversion rounds to nearest even and saturates; NaN becomes -0.
uint8_t float_to_f4e2m1(float f);
float f4e2m1_to_float(uint8_t v);

struct float4e2m1 {
  uint8_t bits = 0;
  float4e2m1() = default;
  explicit float4e2m1(float f) : bits(float_to_f4e2m1(f)) {}
  static float4e2m1 from_bits(uint8_t b) { float4e2m1 r; r.bits = b & 0xF; return r; }
  operator float() const { return f4e2m1_to_float(bits); }  // NOLINT
};

// A kBits-wide two's-complement (or unsigned) integer. Construction from a wider integer wraps,
// like any narrowing integer conversion (numpy / ml_dtypes astype).
template <int kBits, bool kSigned>
struct small_int {
  using storage = std::conditional_t<kSigned, int8_t, uint8_t>;
  static constexpr int kMin = kSigned ? -(1 << (kBits - 1)) : 0;
  static constexpr int kMax = kSigned ? (1 << (kBits - 1)) - 1 : (1 << kBits) - 1;
  static constexpr uint8_t kMask = uint8_t((1u << kBits) - 1);
  storage v = 0;
  small_int() = default;
  explicit small_int(int64_t x) {
    const unsigned m = unsigned(uint64_t(x) & kMask);
    v = storage(kSigned && m > unsigned(kMax) ? int(m) - (1 << kBits) : int(m));
  }
  static small_int from_bits(uint8_t b) { return small_int(int64_t(b & kMask)); }
  uint8_t bits() const { return uint8_t(v) & kMask; }
  operator int() const { return v; }  // NOLINT: implicit widening
};
using int4 = small_int<4, true>;
using uint4 = small_int<4, false>;
using int2 = small_int<2, true>;
using uint2 = small_int<2, false>;

}  // namespace kiln
