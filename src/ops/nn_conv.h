// Convolution machinery shared by conv.cc (Conv, ConvInteger, QLinearConv) and nn_conv_extra.cc
// (ConvTranspose, DeformConv, Col2Im): shape inference, the concrete plan, and the grouped
// im2col + GEMM that every forward convolution reduces to.
#pragma once

#include "ops/nn_util.h"

namespace kiln {

// Output type of a forward convolution of x (input xi, [N, C, D...]) by w (input wi, [M, C/group,
// k...]): [N, M, out...] with element type dt.
Status infer_conv_output(InferCtx& c, size_t xi, size_t wi, DType dt);

// The attributes every convolution reads.
std::vector<AttrSpec> conv_attrs();

struct ConvPlan {
  Window w;
  int64_t batch = 0, in_ch = 0, out_ch = 0, group = 1;
  std::vector<int64_t> in, out;  // spatial dims of x and y
  std::vector<int64_t> y_dims;   // [N, M, out...]
  int64_t in_size() const { return prod_from(in, 0); }
  int64_t out_size() const { return prod_from(out, 0); }
  int64_t col_rows() const { return in_ch / group * w.kernel_size(); }  // rows of one group's im2col
};

// Checks x [N, C, D...] against w [M, C/group, k...] and resolves the window.
Expected<ConvPlan> plan_conv(const KernelCtx& c, const std::vector<int64_t>& x, const std::vector<int64_t>& w);

// The grouped GEMM of a forward convolution, in accumulator type A:
//   y[n, g*Mg + m, p] = sum_r w[g*Mg + m, r] * col[r, p]
// where fill_col(n, g, col) writes the im2col matrix (col_rows() x out_size()) of image n, group g.
template <typename A, typename FillCol>
std::vector<A> conv_gemm(const ConvPlan& p, const A* w, FillCol&& fill_col) {
  const int64_t mg = p.out_ch / p.group, rows = p.col_rows(), cols = p.out_size();
  std::vector<A> y(size_t(p.batch * p.out_ch * cols), A(0));
  std::vector<A> col(size_t(rows * cols));
  for (int64_t n = 0; n < p.batch; ++n) {
    for (int64_t g = 0; g < p.group; ++g) {
      fill_col(n, g, col.data());
      A* yg = y.data() + (n * p.out_ch + g * mg) * cols;
      gemm_accumulate<A>(mg, cols, rows, {w + g * mg * rows, rows, 1}, {col.data(), cols, 1}, yg, cols);
    }
  }
  return y;
}

// The im2col matrix of image n, group g from a window table: col[ci*K + q, p] = x at the input
// position of output p and kernel tap q, or 0 in the padding.
template <typename A>
void im2col(const ConvPlan& p, const WindowTable& t, const A* x, int64_t n, int64_t g, A* col) {
  const int64_t cg = p.in_ch / p.group, k = t.kernel_size, cols = t.positions, plane = p.in_size();
  parallel_for(cg * k, std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t ci = r / k, q = r % k;
      const A* xc = x + (n * p.in_ch + g * cg + ci) * plane;
      A* out = col + r * cols;
      for (int64_t pos = 0; pos < cols; ++pos) {
        const int64_t off = t.at(pos, q);
        out[pos] = off >= 0 ? xc[off] : A(0);
      }
    }
  });
}

// Adds bias[m] (accumulator values, one per output channel) to every element of y [N, M, P].
template <typename A>
void add_channel_bias(std::vector<A>& y, const std::vector<A>& bias, int64_t channels, int64_t plane) {
  for (size_t i = 0; i < y.size(); ++i) y[i] += bias[size_t(int64_t(i) / plane % channels)];
}

}  // namespace kiln
