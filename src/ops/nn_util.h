// Helpers shared by the neural-network op families (matmul, conv, pool, norm):
//  - the accumulator type of a dot product and wrapping integer multiply-add;
//  - one GEMM on accumulator arrays (MatMul, Gemm, Conv via im2col, ConvTranspose via col2im);
//  - sliding-window geometry (kernel, strides, dilations, pads, auto_pad, ceil_mode) with symbolic
//    output dims for inference and a concrete "window table" for the kernels.
//
//   KILN_ASSIGN_OR_RETURN(Window w, read_window(c, nspatial, w_dims));
//   KILN_ASSIGN_OR_RETURN(std::vector<int64_t> out, resolve_window(c, w, in_spatial));
//   WindowTable t = make_window_table(w, in_spatial, out);   // t.at(p, q): input offset or kPad
#pragma once

#include <optional>
#include <type_traits>
#include <vector>

#include "ops/op_util.h"

namespace kiln {

// ---- accumulation ---------------------------------------------------------------------------

// The float types ONNX's neural-network ops accept (f16, bf16, f32, f64; not the float8s).
template <typename T>
inline constexpr bool is_nn_float_v =
    std::is_floating_point_v<T> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

// Dot products accumulate in double for every float type (f32 conformance needs it) and in 64-bit
// integers otherwise; integer overflow wraps like numpy, computed in unsigned arithmetic.
template <typename T>
using nn_acc_t = std::conditional_t<is_float_v<T>, double, int64_t>;

template <typename T>
nn_acc_t<T> nn_to_acc(T v) {
  return nn_acc_t<T>(compute_t<T>(v));
}

template <typename T, typename A>
T nn_from_acc(A a) {
  if constexpr (is_reduced_float_v<T>) return T(float(a));
  else return static_cast<T>(a);  // integers: modular (C++20), like numpy's wrap-around
}

template <typename A>
inline A mul_add(A acc, A a, A b) {
  if constexpr (std::is_integral_v<A>) return A(uint64_t(acc) + uint64_t(a) * uint64_t(b));
  else return acc + a * b;
}

// The elements of t converted to the accumulator type of T.
template <typename T>
std::vector<nn_acc_t<T>> to_acc_vector(const Tensor& t) {
  std::vector<nn_acc_t<T>> v(size_t(t.numel()));
  const T* p = t.data<T>();
  for (size_t i = 0; i < v.size(); ++i) v[i] = nn_to_acc(p[i]);
  return v;
}

// Writes accumulator values into t (of element type T), rounding floats and wrapping integers.
template <typename T, typename A>
void store_from_acc(Tensor& t, const std::vector<A>& v) {
  T* p = t.data<T>();
  for (size_t i = 0; i < v.size(); ++i) p[i] = nn_from_acc<T>(v[i]);
}

// A strided matrix view: element (i, j) is data[i * rs + j * cs].
template <typename A>
struct MatView {
  const A* data;
  int64_t rs, cs;
  A at(int64_t i, int64_t j) const { return data[i * rs + j * cs]; }
};

// c[i*ldc + j] += sum_k a(i,k) * b(k,j) for an m x n result; rows of c are split across threads.
// The k-then-j loop order walks b and c along rows, which keeps the common layouts cache friendly.
template <typename A>
void gemm_accumulate(int64_t m, int64_t n, int64_t k, MatView<A> a, MatView<A> b, A* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  parallel_for(m, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, n * k)), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      A* crow = c + i * ldc;
      for (int64_t p = 0; p < k; ++p) {
        const A aip = a.at(i, p);
        const A* brow = b.data + p * b.rs;
        for (int64_t j = 0; j < n; ++j) crow[j] = mul_add(crow[j], aip, brow[j * b.cs]);
      }
    }
  });
}

// ---- sliding windows ------------------------------------------------------------------------

enum class AutoPad { kNotSet, kSameUpper, kSameLower, kValid };

// Geometry of a window sliding over the spatial dims of an [N, C, D1, ..., Dn] tensor.
struct Window {
  std::vector<int64_t> kernel, strides, dilations;
  std::vector<int64_t> pads;  // n begins, then n ends (the ONNX order)
  AutoPad auto_pad = AutoPad::kNotSet;
  bool ceil_mode = false;

  size_t rank() const { return kernel.size(); }
  int64_t extent(size_t i) const { return (kernel[i] - 1) * dilations[i] + 1; }
  int64_t kernel_size() const;
};

template <typename Ctx>
Expected<AutoPad> read_auto_pad(const Ctx& c);

// Reads kernel_shape (default: `kernel`, e.g. the weight's spatial dims; required when empty),
// strides, dilations, pads, auto_pad and ceil_mode, checking their lengths and values.
template <typename Ctx>
Expected<Window> read_window(const Ctx& c, size_t nspatial, const std::vector<int64_t>& kernel);

// Output spatial dims of a forward (conv / pool) window, symbolic.
std::vector<Dim> window_output_dims(const Window& w, const std::vector<Dim>& in);

// Concrete output dims; resolves SAME_* / VALID into w.pads. Errors when an output dim is < 1.
Expected<std::vector<int64_t>> resolve_window(const KernelCtx& c, Window& w, const std::vector<int64_t>& in);

// For every output position p (row-major over `out`) and kernel position q (row-major over the
// kernel): the row-major offset of the input element the window reads, kPad inside the explicit
// padding, or kBeyond past the end padding (only windows extended by ceil_mode reach there).
struct WindowTable {
  static constexpr int64_t kPad = -1;
  static constexpr int64_t kBeyond = -2;
  int64_t positions = 0, kernel_size = 0;
  std::vector<int64_t> offsets;
  int64_t at(int64_t p, int64_t q) const { return offsets[size_t(p * kernel_size + q)]; }
};
WindowTable make_window_table(const Window& w, const std::vector<int64_t>& in, const std::vector<int64_t>& out);

// Product of dims from `first` on (e.g. the spatial size of an NC... tensor).
int64_t prod_from(const std::vector<int64_t>& dims, size_t first);

// Spatial dims of a tensor type (dims 2..), or nullopt when its rank is unknown.
std::optional<std::vector<Dim>> spatial_dims(const Type& t);

// Reads a whole tensor (scales, zero points, or data for double-precision kernels) as doubles.
std::vector<double> tensor_as_doubles(const Tensor& t);

// Stores v into t, rounding to t's float type (f16, bf16, f32, f64); other types are unsupported.
Status store_doubles(const KernelCtx& c, Tensor& t, const std::vector<double>& v);

// Input i as a per-channel parameter of `channels` values (1-D, or a scalar when channels == 1).
Expected<std::vector<double>> channel_param(const KernelCtx& c, size_t i, int64_t channels, const char* what);

// v rounded to the nearest value of float type dt (numpy computes scale products in the scales'
// own precision); v itself for other types.
double round_to_dtype(double v, DType dt);

inline bool is_8bit_int(DType t) { return t == DType::kInt8 || t == DType::kUInt8; }

// Quantized-op helpers: x - zero_point as int64. A 1-D zero point of length > 1 lies along `axis`
// of x (per row of a matmul operand, per output channel of a conv weight); other zero points
// broadcast numpy-style.
Expected<std::vector<int64_t>> subtract_zero_point(const KernelCtx& c, const Tensor& x, const Tensor* zp,
                                                   int64_t axis);
// Round half to even and saturate to the range of integer type dt (int8, uint8, ...).
int64_t saturate_round(double v, DType dt);

}  // namespace kiln
