// kiln's own CUDA kernels, as plain launch functions the lowering calls (kernels/*.cu implement
// them). This header needs no CUDA headers beyond the runtime API, so C++ files compiled by the
// host compiler can include it. Every launcher enqueues on `s` and returns the launch's error
// (cudaGetLastError), never synchronizes and never allocates: all of them are safe inside CUDA
// graph capture.
//
//   k::unary(k::Unary::kRelu, k::DT::kF16, x, y, /*n=*/2 * 3 * 4, {}, stream);
//   k::NdStrides s = ...;  // dims + element strides (lower.h: nd(dims, strides))
//   k::copy_nd(2, x, s_transposed, y, s_contiguous, stream);
//
// Layout conventions: row-major element indexing; "strides" are in elements (not bytes); a
// stride of 0 broadcasts that dimension. Dtypes are the kernel's own small enum (DT) so that this
// header does not depend on the IR.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kiln::cuda::k {

// Values are part of the engine-file format: append, never renumber.
enum class DT : int { kF32, kF16, kBF16, kF64, kI64, kI32, kI8, kU8, kBool, kI16, kU16, kU32, kU64 };
inline constexpr DT kLastDT = DT::kU64;

inline int dt_size(DT d) {
  switch (d) {
    case DT::kF64: case DT::kI64: case DT::kU64: return 8;
    case DT::kF32: case DT::kI32: case DT::kU32: return 4;
    case DT::kF16: case DT::kBF16: case DT::kI16: case DT::kU16: return 2;
    case DT::kI8: case DT::kU8: case DT::kBool: return 1;
  }
  return 0;
}

inline constexpr int kMaxRank = 8;

// An N-d index space (the output's dims) plus strides into one operand, in elements.
struct NdStrides {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t strides[kMaxRank] = {};
};

// ---- elementwise -------------------------------------------------------------------------------

// y[i] = f(x[i]) over n contiguous elements; dtypes kF32, kF16, kBF16 (math in f32). kNot and
// kAbs/kNeg also take kBool / kI64 / kI32 where they make sense (kNot: kBool only).
enum class Unary : int {
  kIdentity, kRelu, kSigmoid, kTanh, kExp, kLog, kSqrt, kReciprocal, kNeg, kAbs, kErf, kFloor, kCeil,
  kSin, kCos, kSoftplus, kSign, kRound,
  kGeluErf,      // x * 0.5 * (1 + erf(x / sqrt 2))
  kGeluTanh,     // x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
  kClip,         // min(max(x, p.a), p.b)
  kLeakyRelu,    // x >= 0 ? x : p.a * x
  kElu,          // x >= 0 ? x : p.a * (exp(x) - 1)
  kHardSigmoid,  // max(0, min(1, p.a * x + p.b))
  kHardSwish,    // x * max(0, min(1, x / 6 + 0.5))
  kSilu,         // x * sigmoid(x)
  kNot,          // bool
  kSelu,         // p.b * (x > 0 ? x : p.a * (exp(x) - 1))
  kCelu,         // max(0, x) + min(0, p.a * (exp(x / p.a) - 1))
  kThresholdedRelu,  // x > p.a ? x : 0
  kSwish,        // x * sigmoid(p.a * x)
  kMish,         // x * tanh(softplus(x))
  kSoftsign,     // x / (1 + |x|)
  kShrink,       // x < -p.a ? x + p.b : (x > p.a ? x - p.b : 0)
  kTan, kAtan, kAsin, kAcos, kSinh, kCosh, kAsinh, kAcosh, kAtanh,
};
struct UnaryParams {
  float a = 0, b = 0;
};
cudaError_t unary(Unary op, DT dt, const void* x, void* y, int64_t n, UnaryParams p, cudaStream_t s);

// y[idx] = a[idx . sa] op b[idx . sb] over the index space sa.dims (== sb.dims == y's dims; y is
// contiguous). Arithmetic: kF32, kF16, kBF16 (math in f32), kI64, kI32. Comparisons write kBool
// (one byte, 0 or 1) from any of those dtypes. kAnd/kOr/kXor: kBool.
enum class Binary : int {
  kAdd, kSub, kMul, kDiv, kPow, kMax, kMin, kMod,
  kEqual, kLess, kLessOrEqual, kGreater, kGreaterOrEqual,
  kAnd, kOr, kXor,
  kPRelu,  // a < 0 ? a * b : a (b: the slope, broadcast)
  kShiftLeft, kShiftRight,  // BitShift on unsigned integers (a shift by the width or more gives 0)
};
cudaError_t binary(Binary op, DT dt, const void* a, const NdStrides& sa, const void* b, const NdStrides& sb, void* y,
                   cudaStream_t s);

// y[idx] = cond[idx . sc] ? x[idx . sx] : z[idx . sz]; cond is kBool; x, z, y have dtype dt (any).
cudaError_t where(DT dt, const void* cond, const NdStrides& sc, const void* x, const NdStrides& sx, const void* z,
                  const NdStrides& sz, void* y, cudaStream_t s);

// y[i] = (to)x[i] over n elements, any DT pair (float -> int truncates toward zero, like ONNX;
// -> kBool is x != 0).
cudaError_t cast(DT from, DT to, const void* x, void* y, int64_t n, cudaStream_t s);
// The same over rows of a matrix with leading dims: y[r*ldy + c] = (to)x[r*ldx + c], c < cols
// (drops padding columns, e.g. after a GEMM on a padded width; from == to is a plain copy).
cudaError_t cast_rows(DT from, DT to, const void* x, int64_t ldx, void* y, int64_t ldy, int64_t rows, int64_t cols,
                      cudaStream_t s);

// Strided N-d copy of elem_bytes-sized elements (1, 2, 4 or 8):
//   dst[idx . dst_strides] = src[idx . src_strides] for idx in the index space src.dims
// (dst.dims must equal src.dims). Covers Transpose, Slice (offset the src pointer, scale its
// strides by the step), Expand (zero strides), Concat and Split (offset the dst / src pointer).
cudaError_t copy_nd(int elem_bytes, const void* src, const NdStrides& src_strides, void* dst,
                    const NdStrides& dst_strides, cudaStream_t s);

// Concat of parts that are row blocks of one destination: part i, [rows, width_i] contiguous, lands at
// dst[r * row_width + col_i + c]. Every part moves in one launch (per kMaxConcatParts), as wide words
// when every width, column and pointer allows. What Concat is when its inputs share the output's
// layout: the axis's outer dims are the rows, the axis and the dims inside it the columns.
inline constexpr int kMaxConcatParts = 64;
struct ConcatPart {
  const void* src = nullptr;
  int64_t width = 0, col = 0;  // elements
};
cudaError_t concat_rows(int elem_bytes, const ConcatPart* parts, int n_parts, void* dst, int64_t rows,
                        int64_t row_width, cudaStream_t s);

// ---- indexing ----------------------------------------------------------------------------------

// Gather along one axis, data viewed as [outer, axis_dim, inner], indices (kI64 or kI32, n_idx of
// them, negative counted from the end) -> y [outer, n_idx, inner]. Out-of-range indices are
// clamped and counted: *bad_count (device int, may be null) is incremented once per bad index,
// so the caller can report an error after the run.
cudaError_t gather(int elem_bytes, const void* data, int64_t outer, int64_t axis_dim, int64_t inner, const void* idx,
                   DT idx_dt, int64_t n_idx, void* y, int* bad_count, cudaStream_t s);

// ---- normalization and reductions (accumulate in f32; dtypes kF32, kF16, kBF16) ---------------

// Softmax (or LogSoftmax) along the last axis of x viewed as [rows, cols].
// zero_masked (softmax only): a row whose every element is -inf gives zeros instead of 0 / 0 = NaN
// (an ONNX Attention's rows with every key masked).
cudaError_t softmax(DT dt, const void* x, void* y, int64_t rows, int64_t cols, bool log, bool zero_masked, cudaStream_t s);

// LayerNorm over the last axis of x viewed as [rows, cols]: y = (x - mean) / sqrt(var + eps) *
// scale + bias; scale and bias ([cols], same dtype as x; bias may be null). mean/var biased, f32.
// y_dt: y's dtype, dt or (x half) kF32, so that a half model's f32 output needs no cast pass.
// pdl: launched with programmatic stream serialization (the kernel waits for the previous one before
// it reads x), worth it after a kernel that lets its dependents launch early (gemm_sm90).
cudaError_t layer_norm(DT dt, const void* x, const void* scale, const void* bias, void* y, DT y_dt, int64_t rows,
                       int64_t cols, float eps, cudaStream_t s, bool pdl = false);

// LayerNorm's optional outputs: per row of x [rows, cols] its mean and 1 / sqrt(var + eps) (biased
// variance, f32 math), written as out_dt (kF32, kF16, kBF16); either pointer may be null.
cudaError_t row_moments(DT dt, const void* x, int64_t rows, int64_t cols, float eps, DT out_dt, void* mean,
                        void* inv_std, cudaStream_t s);

// RMSNorm-style variant (no mean subtraction): y = x / sqrt(mean(x^2) + eps) * scale.
cudaError_t rms_norm(DT dt, const void* x, const void* scale, void* y, DT y_dt, int64_t rows, int64_t cols, float eps,
                     cudaStream_t s, bool pdl = false);

// Reduce the middle axis of x viewed as [outer, n, inner] -> y [outer, inner].
// Dtypes: kF32, kF16, kBF16 (f32 accumulation); kSum/kMax/kMin also kI64, kI32. With a workspace
// (ws_bytes of device scratch), few outputs over a long strided axis split it across blocks.
enum class Reduce : int { kSum, kMean, kMax, kMin, kProd, kSumSquare, kL1, kL2, kLogSumExp };
cudaError_t reduce(Reduce op, DT dt, const void* x, void* y, int64_t outer, int64_t n, int64_t inner, cudaStream_t s,
                   void* ws = nullptr, size_t ws_bytes = 0);

// ArgMax/ArgMin of the middle axis of x viewed as [outer, n, inner] -> y (kI64) [outer, inner];
// ties pick the first index, or the last with `last` (select_last_index=1).
cudaError_t arg_reduce(bool is_max, bool last, DT dt, const void* x, int64_t* y, int64_t outer, int64_t n,
                       int64_t inner, cudaStream_t s);

// Per-channel affine on x viewed as [outer, c, inner]: y = clamp(x * scale[c] + shift[c], lo, hi)
// (scale and shift f32). BatchNormalization (inference) lowers to this with folded scale/shift, and
// a following Relu or Clip as the clamp.
cudaError_t channel_affine(DT dt, const void* x, const float* scale, const float* shift, void* y, int64_t outer,
                           int64_t c, int64_t inner, float lo, float hi, cudaStream_t s);

// GroupNormalization / InstanceNormalization (groups == c): each (batch, group) of x is normalized
// by its own statistics, then y = act(x_hat * scale[ch] + shift[ch]) with act 0 none, 1 relu, 2 silu.
// x_bias, when set, is added to x first (x + b[image, channel], b of dt with bias_stride elements
// per image: c for an [n, c] value such as a diffusion UNet's timestep embedding, 0 for one [c]
// every image shares), so that the Add in front of the normalization needs no pass of its own.
struct GroupNormArgs {
  DT dt = DT::kF32;
  const void* x = nullptr;       // [n, c, spatial] in NCHW order, [n, spatial, c] for the _nhwc forms
  const void* x_bias = nullptr;  // optional
  int64_t bias_stride = 0;
  const float* scale = nullptr;  // [c], f32
  const float* shift = nullptr;  // [c], f32
  void* y = nullptr;             // x's layout
  int64_t n = 0, c = 0, groups = 0, spatial = 0;
  float eps = 1e-5f;
  int act = 0;
  void* scratch = nullptr;
};
// The shape and math of one normalization; the caller sets the pointers.
inline GroupNormArgs group_norm_shape(DT dt, int64_t n, int64_t c, int64_t groups, int64_t spatial, float eps = 1e-5f,
                                      int act = 0) {
  GroupNormArgs a;
  a.dt = dt;
  a.n = n;
  a.c = c;
  a.groups = groups;
  a.spatial = spatial;
  a.eps = eps;
  a.act = act;
  return a;
}
// NCHW: `scratch` holds group_norm_scratch_bytes(...) bytes (per-row statistics and per-chunk partials).
size_t group_norm_scratch_bytes(int64_t n, int64_t c, int64_t groups, int64_t spatial);
cudaError_t group_norm(const GroupNormArgs& a, cudaStream_t s);
// NHWC ([n, spatial, c]), y in NHWC too. Its statistics run one block per `pixels` pixels of an
// image; group_norm_nhwc_pixels picks 256, or fewer (down to 8) so that about target_blocks blocks
// run (a small batch would leave most SMs idle with 256).
int64_t group_norm_nhwc_pixels(int64_t n, int64_t spatial, int64_t target_blocks);
size_t group_norm_nhwc_smem(DT dt, int64_t c);  // shared memory its statistics kernel needs
size_t group_norm_nhwc_scratch_bytes(int64_t n, int64_t groups, int64_t spatial, int64_t pixels);
cudaError_t group_norm_nhwc(const GroupNormArgs& a, int64_t pixels, cudaStream_t s);
// The same in one cooperative launch: b blocks per image, all resident at once, a grid barrier
// between the statistics and the output. group_norm_nhwc_one_blocks gives the b to use on the
// current GPU (as many as fit it at once, shared by the images, at most `spatial`), or 0 where this
// kernel cannot run (channel vectors past one block, more images than fit); `scratch` holds
// group_norm_nhwc_one_scratch_bytes(n, groups, b) bytes.
int group_norm_nhwc_one_blocks(DT dt, int64_t n, int64_t c, int64_t groups, int64_t spatial);
size_t group_norm_nhwc_one_scratch_bytes(int64_t n, int64_t groups, int b);
cudaError_t group_norm_nhwc_one_launch(const GroupNormArgs& a, int b, cudaStream_t s);

// Squeeze-and-excitation's gate (squeeze_excite.cu): per image, the mean of x over its pixels per
// channel, then g = act2(b2 + W2 . act1(b1 + W1 . mean)) as [n, c] of dt. x is [n, spatial, c]
// (channels_last) or [n, c, spatial]; w1 is [cr, c] and w2 [c, cr], b1 [cr] and b2 [c] optional,
// all of dt. One cooperative launch of `blocks` blocks (squeeze_excite_blocks: as many as help, at
// most what fits the current GPU at once; 0 where it cannot run) and `splits` runs of pixels per
// image (squeeze_excite_splits); `part` holds squeeze_excite_scratch_bytes(n, c, cr, splits) bytes.
inline constexpr int64_t kSqueezeExciteMaxC = 4096, kSqueezeExciteMaxCr = 1024;
struct SqueezeExciteArgs {
  DT dt = DT::kF32;
  const void* x = nullptr;
  bool channels_last = false;
  int64_t n = 0, c = 0, spatial = 0, cr = 0;
  const void *w1 = nullptr, *b1 = nullptr, *w2 = nullptr, *b2 = nullptr;
  Unary act1 = Unary::kIdentity, act2 = Unary::kIdentity;
  UnaryParams p1, p2;
  void* g = nullptr;
  float* part = nullptr;
};
bool squeeze_excite_act_ok(Unary op);  // the activations the kernel applies
int squeeze_excite_splits(int64_t c, int64_t spatial, bool channels_last);
size_t squeeze_excite_scratch_bytes(int64_t n, int64_t c, int64_t cr, int splits);
int squeeze_excite_blocks(const SqueezeExciteArgs& a, int splits);
cudaError_t squeeze_excite(const SqueezeExciteArgs& a, int splits, int blocks, cudaStream_t s);

// Pad of x (dims in_dims) into y (out_dims), rank <= kMaxRank, any element width up to 8 bytes:
// y[o] = x[src(o - begin)] per dim, where a coordinate outside x is the constant `value_bits`
// (mode 0), mirrored (1, reflect), clamped (2, edge) or wrapped (3). Negative begin crops.
cudaError_t pad_nd(int elem_bytes, const void* x, void* y, int rank, const int64_t* in_dims, const int64_t* out_dims,
                   const int64_t* begin, int mode, uint64_t value_bits, cudaStream_t s);

// Resize of the sp (1..3) dims of x viewed as [outer, in_dims..., inner] to [outer, out_dims...,
// inner] (inner > 1: the channels of NHWC) from host-planned taps (ops/resize_taps.h): output
// coordinate o of axis d reads the taps_per_axis[d] entries at (sum of the earlier axes' out * n)
// + o * n; a first entry with index -1 writes the extrapolation value (tf_crop_and_resize).
// interpolate = false: nearest (one tap per axis, copied, any dtype; extrapolation_bits is the
// value as the element's bits); true: the weighted sum in f32 (f32/f16/bf16; `extrapolation`).
struct ResizeTap {
  int32_t index;
  float weight;
};
cudaError_t resize(DT dt, const void* x, void* y, int64_t outer, int sp, const int64_t* in_dims, const int64_t* out_dims,
                   int64_t inner, const int* taps_per_axis, const ResizeTap* taps, bool interpolate,
                   double extrapolation, uint64_t extrapolation_bits, cudaStream_t s);

// GridSample of x [n, c, in_sp...] (r = 1..3 spatial dims) at grid [n, points..., r] (coordinates
// innermost-first, normalized to [-1, 1]) into y [n, c, points...]: the CPU's per-point taps
// (ops/grid_sample_math.h), summed in f32. mode 0 nearest, 1 linear, 2 cubic; padding 0 zeros,
// 1 border, 2 reflection.
cudaError_t grid_sample(DT dt, DT grid_dt, const void* x, const void* grid, void* y, int64_t n, int64_t c, int r,
                        const int64_t* in_sp, int64_t points, int mode, int padding, bool align_corners,
                        cudaStream_t s);

// CumSum of x viewed as [outer, n, inner] along n (ONNX exclusive and reverse); f32/f16/bf16 sum
// in f32, i32/i64 in i64.
cudaError_t cumsum(DT dt, const void* x, void* y, int64_t outer, int64_t n, int64_t inner, bool exclusive, bool reverse,
                   cudaStream_t s);
// GatherElements: y[o, j, i] = data[o, idx[o, j, i], i] with data [outer, axis_dim, inner] and idx,
// y [outer, n_axis, inner] (the lowering checks that the other dims agree); negative indices wrap,
// out-of-range ones are clamped and counted in *bad_count.
// The k indexed dims of GatherND/ScatterND: their sizes (negative indices wrap) and element strides.
struct IndexTuple {
  int k = 0;
  int64_t dims[kMaxRank] = {};
  int64_t strides[kMaxRank] = {};
};
// GatherND: y [nb, ni, nr] = data[b, idx[b, i, 0..k), r] with data's batch b at b * batch_stride;
// out-of-range tuples are clamped and counted in *bad.
cudaError_t gather_nd(int elem_bytes, const void* data, const void* idx, DT idx_dt, void* y, int64_t nb, int64_t ni,
                      int64_t nr, const IndexTuple& t, int64_t batch_stride, int* bad, cudaStream_t s);
// ScatterND / ScatterElements: y = data (copied unless the same buffer), then each update written
// where its index says (ScatterND: slices of nr elements at tuples of t; ScatterElements: along an
// axis of nr_or_axis elements, idx/upd viewed as [outer, n_axis, inner]). reduction 0 (none) writes
// (any dtype; duplicates land in an unspecified order); 1 add, 2 mul, 3 max, 4 min combine in
// the updates' order, deterministically (f32/f16/bf16/f64/i32/i64). Negative indices count from
// the end (ScatterElements: unless !wrap_negative, MaxUnpool's); out-of-range ones are skipped and
// counted in *bad.
cudaError_t scatter(DT dt, const void* data, int64_t data_numel, const void* idx, DT idx_dt, const void* upd,
                    int64_t upd_numel, void* y, bool elements, int64_t nr_or_axis, const IndexTuple& t, int64_t n_axis,
                    int64_t inner, int reduction, bool wrap_negative, int* bad, cudaStream_t s);
// ReverseSequence of x viewed as [d0, d1, inner], batch and time the first two dims (batch_first:
// batch is d0): y[b, t] = x[b, lens[b] - 1 - t] for t < lens[b] (clamped to [0, steps]), else x[b, t].
cudaError_t reverse_sequence(int elem_bytes, const void* x, const void* lens, DT lens_dt, void* y, int64_t d0, int64_t d1,
                             int64_t inner, bool batch_first, cudaStream_t s);
// Det of each [n, n] matrix of x [batch, n, n] into y [batch] (f32/f16/bf16/f64): LU with partial
// pivoting in f64, a thread per matrix in `work` (batch * n * n doubles).
cudaError_t det(DT dt, const void* x, void* y, double* work, int64_t batch, int64_t n, cudaStream_t s);
// TopK along n of x viewed as [outer, n, inner] (n <= 4096: topk_supported): values (x's dtype) and
// indices (may be null) [outer, k, inner], best first (larger or smaller; NaN above every number;
// ties by lower index). f32/f16/bf16/i64/i32.
bool topk_supported(int64_t n);
cudaError_t topk(DT dt, const void* x, void* values, int64_t* indices, int64_t outer, int64_t n, int64_t inner, int64_t k,
                 bool largest, cudaStream_t s);
// Trilu over the last two dims of x viewed as [batch, rows, cols]: element (i, j) kept when
// j - i >= k (upper) or j - i <= k (lower), else zero; any element width.
cudaError_t trilu(int elem_bytes, const void* x, void* y, int64_t batch, int64_t rows, int64_t cols, int64_t k, bool upper,
                  cudaStream_t s);
cudaError_t gather_elements(int elem_bytes, const void* data, int64_t outer, int64_t axis_dim, int64_t inner, const void* idx,
                            DT idx_dt, int64_t n_axis, void* y, int* bad_count, cudaStream_t s);

// ---- convolution ---------------------------------------------------------------------------------

// Depthwise 2-D convolution in NHWC (one filter per channel): x [n,h,w,c], filter [r,s,c],
// bias [c] (may be null), y [n,p,q,c]; y = act(sum + bias) with act 0 none, 1 relu,
// 2 clip(lo, hi), 3 SiLU. pad_h/pad_w are the leading pads (trailing pads only bound the output size).
// kF32, kF16, kBF16; f32 accumulation.

// The activation applied to each x as it is read (the one before the convolution, fused; padded
// taps are skipped, never activated). A few instructions each: every x is read once per filter
// tap (SiLU's exponential and division 25 times over for a 5x5 filter lost: bench/RESULTS.md,
// forty-third session). Values are stored in engine files: append only.
enum class DwInput : int {
  kNone = 0,
  kClip = 1,       // min(max(x, in_a), in_b), in_a <= 0 <= in_b
  kHardSwish = 2,  // x * max(0, min(1, x / 6 + 0.5))
  kLeakyRelu = 3,  // x >= 0 ? x : in_a * x
  kLast = kLeakyRelu
};
struct DepthwiseShape {
  int n, h, w, c, r, s, p, q;
  int stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
  int in_act;        // a DwInput
  float in_a, in_b;  // its parameters
};
cudaError_t depthwise_conv2d_nhwc(DT dt, const void* x, const void* filter, const void* bias, void* y,
                                  const DepthwiseShape& sh, int act, float lo, float hi, cudaStream_t s);

// An image x[n, c, h, w] (fp16, bf16 or f32) at element strides sn, sc, sh, sw (any layout) copied
// to y [n, ho, wo, cp] (cp 8 or 16, y 16-byte aligned) with
//   y[n, Y, X, (dy * block + dx) * c + ch] = x[n, ch, Y * block + dy - top, X * block + dx - left]
// (zero outside the image), channels from block * block * c on zero. block 1 and top = left = 0
// just pads the channels.
struct SpaceToDepthShape {
  int64_t n, c, h, w;
  int64_t sn, sc, sh, sw;
  int64_t block, top, left;
  int64_t ho, wo, cp;
};
// x_dt: y_dt, or kF32 (converted while copying: a model's f32 input image needs no cast pass);
// y_dt kF16 or kBF16.
cudaError_t space_to_depth_nhwc(const void* x, DT x_dt, const SpaceToDepthShape& sh, void* y, DT y_dt, cudaStream_t s);

// 2-D max pooling in NHWC, 16-bit (kF16, kBF16), c % 8 == 0, x and y 16-byte aligned: y[n, p, q, c]
// is the maximum of x[n, p * sh - ph + r, q * sw - pw + k, c] over the window's pixels inside the
// image (pads never win; NaN does not propagate). y is [n, p, q, c].
struct PoolShape {
  int n, h, w, c, p, q, kh, kw, sh, sw, ph, pw;
};
cudaError_t max_pool_nhwc(DT dt, const void* x, const PoolShape& s, void* y, cudaStream_t st);

// ---- attention -----------------------------------------------------------------------------------

// Fused scaled-dot-product attention, one pass (flash-attention style online softmax):
//   O[b,h,i,:] = sum_j softmax_j(scale * Q[b,h,i,:].K[b,h,j,:] + mask[b,h,i,j]) V[b,h,j,:]
// Q, K, V, O are addressed through per-tensor strides {b, h, s} in elements (the head-dim stride
// is 1), so [B,S,H,D] projections are read in place, without transposes. mask (may be null) is
// additive, dtype mask_dt (kF32/kF16/kBF16), broadcast through its strides {b, h, i, j} (0 where
// broadcast). dt kF16 or kBF16, head_dim 32 or 64; accumulation and softmax statistics in f32. All
// strides and base pointers must allow 16-byte vector access (strides multiples of 8).
struct AttentionShape {
  int b, h, sq, sk, d;
  int64_t q[3], k[3], v[3], o[3];  // {batch, head, sequence} strides
  int64_t m[4];                    // mask strides {b, h, i, j}
  bool pdl = false;                // launch with programmatic stream serialization (see layer_norm)
};
bool attention_supported(DT dt, int head_dim);
// Whether a mask of mask_dt with sh's strides is read as one row per (batch, head), staged in shared
// memory with the K/V tiles (kernels/attention.cu kRow); the mask pointer must also be 16-byte aligned.
bool attention_row_mask(const AttentionShape& sh, DT mask_dt);
cudaError_t attention(DT dt, const void* q, const void* k, const void* v, const void* mask, DT mask_dt, void* o,
                      const AttentionShape& sh, float scale, cudaStream_t s);

// ---- Hopper GEMM (kernels_cutlass/gemm_sm90.cu, CUTLASS 3 collectives) ----------------------------

// D[M,N] = act(alpha * A[M,K] . B[K,N] + beta * C[M,N] + bias[N]): A row-major with leading
// dimension lda, B, C and D row-major and contiguous; kF16 or kBF16, f32 accumulation; act 0 none, 2
// gelu (tanh form, as cuBLASLt's epilogue). CTA tile 64 x bn x 64 (bn 32 or 64), TMA loads, wgmma.
// bias and c may be null; pointers 16-byte aligned, N, K and lda multiples of 8 (else
// cudaErrorInvalidValue: these are what the TMA descriptors need). `pdl`: launched
// with programmatic stream serialization; the kernel waits for the previous one before its first
// load and lets the next one launch when its main loop is done. gemm_sm90_prepare once per (bn,
// act) before the first launch, outside graph capture. gemm_sm90_available() is false when kiln was
// built without the CUTLASS headers (every other call then fails).
struct GemmSm90Args {
  const void* a = nullptr;
  const void* b = nullptr;
  const void* bias = nullptr;
  const void* c = nullptr;
  void* d = nullptr;
  int64_t m = 0, n = 0, k = 0, lda = 0;
  int bn = 64, act = 0;
  float alpha = 1, beta = 0;
  bool pdl = true;
};
bool gemm_sm90_available();
cudaError_t gemm_sm90_prepare(DT dt, int bn, int act);
cudaError_t gemm_sm90(DT dt, const GemmSm90Args& g, cudaStream_t s);

// QuantizedMatMul's 8-bit product on Hopper (kernels_cutlass/gemm_sm90_q8.cu): d [m, n] fp16 (bf16) =
// act(alpha[n] * (a [m, k] . b [n, k]^T) + bias[n] + beta * c [m, n]), a and b both float8 e4m3
// (fp8) or both int8; alpha and bias f32 (bias and c may be null). tile 0: 128x128x128, 1: 64x128x128;
// act 0 none, 2 GELU (tanh). n and k multiples of 16, pointers 16-byte aligned.
struct GemmSm90QArgs {
  const void* a = nullptr;
  const void* b = nullptr;
  const float* alpha = nullptr;
  const float* bias = nullptr;
  const void* c = nullptr;
  void* d = nullptr;
  int64_t m = 0, n = 0, k = 0;
  int tile = 0, act = 0;
  float beta = 0;
  bool fp8 = true, bf16 = false;  // c and d bf16 rather than fp16
};
bool gemm_sm90_q8_available();
bool gemm_sm90_q8_shape_ok(int64_t m, int64_t n, int64_t k);  // the dims the kernel takes
cudaError_t gemm_sm90_q8_prepare(bool fp8, bool bf16, int tile, int act);
cudaError_t gemm_sm90_q8(const GemmSm90QArgs& g, cudaStream_t s);

// ---- generators ----------------------------------------------------------------------------------

// y[i] = value for n elements of dt (value converted from double).
// ---- losses (loss.cu) -----------------------------------------------------------------------------

// NegativeLogLikelihoodLoss (softmax = false: x holds log-probabilities) and SoftmaxCrossEntropyLoss
// (softmax: a log-softmax over the classes first) on x [n, classes, inner...] and targets [n, inner...].
struct LossShape {
  int64_t n = 0, classes = 0, inner = 1;
  bool softmax = false;
  bool has_ignore = false;
  int64_t ignore_index = 0;
  int reduction = 0;  // 0 none (out [n, inner]), 1 sum, 2 mean (out: one element)
};
// weight: [classes] or null; log_prob: x's shape (SCE's second output) or null; scratch: 2 * n * inner
// floats when reducing; bad counts out-of-range targets. Math in f32 for f16/bf16.
cudaError_t loss(DT dt, const void* x, const void* target, DT target_dt, const void* weight, const LossShape& sh,
                 void* out, void* log_prob, float* scratch, int* bad, cudaStream_t s);

// ---- quantized products (quant.cu) ----------------------------------------------------------------

// y (int8) = clamp(rint(x / scale) + zp, lo, hi) - offset, NaN -> -offset; x f32/f16/bf16.
cudaError_t quantize_int8(DT dt, const void* x, void* y, int64_t n, float scale, float zp, float lo, float hi,
                          float offset, cudaStream_t s);
// y (float8 e4m3, saturated) = x / scale.
cudaError_t quantize_fp8(DT dt, const void* x, void* y, int64_t n, float scale, cudaStream_t s);
// y (x's dt: f32/f16/bf16) = DequantizeLinear(QuantizeLinear(x)): int8 (zp, lo, hi as quantize_int8,
// NaN -> (0 - zp) * scale) or float8 e4m3 (fp8: zp, lo, hi unused).
cudaError_t fake_quant(DT dt, const void* x, void* y, int64_t n, float scale, float zp, float lo, float hi, bool fp8,
                       cudaStream_t s);
// y[r, c] (dt: f32/f16/bf16) = acc[r, c] * alpha[c] + beta[c] over a row-major [rows, cols] matrix
// of acc_dt (kI32 or kF32).
cudaError_t dequant_cols(DT acc_dt, const void* acc, const float* alpha, const float* beta, DT dt, void* y, int64_t rows,
                         int64_t cols, cudaStream_t s);

// *count += the number of NaN and Inf among x's n elements (f32/f16/bf16/f64); for --check-finite.
cudaError_t count_nonfinite(DT dt, const void* x, int64_t n, unsigned long long* count, cudaStream_t s);

// DynamicQuantizeLinear of x (f32/f16/bf16, n elements): *scale = (max(0, max x) - min(0, min x))
// / 255 (1/255 when that range is empty), *zp = round(-min / scale) clamped to [0, 255], y (uint8)
// = saturate(round(x / scale) + zp), as the CPU reference computes them (quant.cu).
cudaError_t dynamic_quantize_u8(DT dt, const void* x, int64_t n, uint8_t* y, float* scale, uint8_t* zp, cudaStream_t s);

// RandomUniform (dist 0: [a, b)), RandomNormal (1: mean a, scale b) and Bernoulli (2: 1 where a
// draw is below probs[i], of dtype probs_dt: f32/f16/bf16/f64) into y (dt, n elements): Philox
// draws keyed by seed, the element index and *counter (a device word), which each call advances,
// so that every run draws anew (random.cu).
cudaError_t random(DT dt, void* y, int64_t n, int dist, float a, float b, uint64_t seed, unsigned long long* counter,
                   const void* probs, DT probs_dt, cudaStream_t s);

cudaError_t fill(DT dt, void* y, int64_t n, double value, cudaStream_t s);

// Writes 0x7f-ish garbage (every byte = `byte`) over n bytes; the op harness poisons outputs.
cudaError_t poison(void* y, size_t n_bytes, unsigned char byte, cudaStream_t s);

}  // namespace kiln::cuda::k
