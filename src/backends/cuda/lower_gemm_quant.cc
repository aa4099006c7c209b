// QuantizedMatMul (made by fuse-qdq-matmul from QDQ models) on the quantized values, through
// cuBLASLt:
//   int8: the activation quantized to int8 (uint8 activations shifted by -128), an IMMA product
//         with int32 sums, then one pass y = sum * (sx * sw[n]) + (bias[n] - sx * sw[n] * zx * colsum(w)[n])
//         (the zero point of x and the bias folded into a per-column offset at build);
//   fp8:  the activation quantized to float8 e4m3, one FP8 product with the weight's scales
//         (per column: cuBLASLt's outer-vector scale mode), x's scale and the bias in its epilogue;
//         where cuBLASLt has no such kernel, f32 sums scaled per column after, as for int8.
// Both use the row-major trick of lower_gemm.cc: D^T = W^T . X^T in column-major, with the weight
// transposed to [N, K] at build so that the product is the "TN" form these types require.
// On Hopper, in 16-bit builds, kiln's own 8-bit kernel (kernels_cutlass/gemm_sm90_q8.cu) does the
// whole product in one pass: the sums scaled per column, the bias (less x's zero point times the
// column's weights), a residual Add and a GELU in its epilogue, after the one quantize of x.
//
// A 16-bit build also times the product in 16 bits (x quantized and dequantized in one pass, the
// weight dequantized at build, emit_gemm with the bias in its epilogue: the values the QDQ model
// multiplies) and keeps the faster form (TensorRT's int8-vs-fp16 tactic choice): quantizing is an
// offer the model makes, and where the 8-bit kernels lose the layer stays 16-bit. The choice (16-bit,
// cuBLASLt 8-bit or the Hopper 8-bit kernel and its tile) is kept in the timing cache ("qform").
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <optional>

#include "backends/cuda/lower.h"
#include "backends/cuda/timing_cache.h"
#include "backends/cuda/tuning.h"

namespace kiln::cuda {

namespace {

// What the body of a QuantizedMatMul says (its form is fixed by fuse-qdq-matmul; anything else is
// declined, and the node runs its body on the CPU).
struct QuantProduct {
  bool fp8 = false;
  float sx = 1, zx = 0;     // x's scale and zero point
  float offset = 0;         // 128 for uint8 activations (stored as int8 minus 128)
  float lo = -128, hi = 127;
  const Tensor* w = nullptr;  // [K, N], int8 or float8e4m3fn
  std::vector<float> sw;      // N scales (one repeated for a per-tensor scale)
  bool per_channel = false;
  const Tensor* bias = nullptr;  // [N] f32
  int64_t k = 0, n = 0;
};

bool all_zero_bytes(const Tensor& t) {
  const auto* p = static_cast<const unsigned char*>(t.raw());
  for (size_t i = 0; i < t.nbytes(); ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

const Value* in(const Node& n, size_t i) { return i < n.inputs.size() ? n.inputs[i] : nullptr; }

Expected<QuantProduct> read_body(Lowering& L, const Node& node) {
  const Graph* b = node.attr_graph("body");
  if (!b || b->inputs.size() != node.inputs.size() || b->outputs.size() != 1 ||
      (b->nodes.size() != 4 && b->nodes.size() != 5) || node.inputs.size() != b->nodes.size() - 1) {
    KILN_UNSUPPORTED("a body not of fuse-qdq-matmul's form");
  }
  const Node &q = *b->nodes[0], &dq = *b->nodes[1], &dw = *b->nodes[2], &mm = *b->nodes[3];
  const Node* add = b->nodes.size() == 5 ? b->nodes[4].get() : nullptr;
  const bool form =
      q.op == OpKind::kQuantizeLinear && dq.op == OpKind::kDequantizeLinear && dw.op == OpKind::kDequantizeLinear &&
      mm.op == OpKind::kMatMul && in(q, 0) == b->inputs[0] && in(dq, 0) == q.outputs[0] && in(dq, 1) == in(q, 1) &&
      in(dq, 2) == in(q, 2) && in(dw, 0) == b->inputs[1] && in(dw, 1) == b->inputs[2] && in(mm, 0) == dq.outputs[0] &&
      in(mm, 1) == dw.outputs[0] &&
      (add ? add->op == OpKind::kAdd && in(*add, 0) == mm.outputs[0] && in(*add, 1) == b->inputs[3] &&
                 b->outputs[0] == add->outputs[0]
           : b->outputs[0] == mm.outputs[0]);
  if (!form) KILN_UNSUPPORTED("a body not of fuse-qdq-matmul's form");
  if (q.attr_int("block_size", 0) || q.attr_int("precision", 0) || q.attr_int("saturate", 1) != 1 ||
      dq.attr_int("block_size", 0) || dw.attr_int("block_size", 0)) {
    KILN_UNSUPPORTED("blocked, precision or non-saturating quantization");
  }
  QuantProduct p;
  const Value* sx = in(q, 1);
  if (!sx || !sx->constant || sx->constant->numel() != 1 || sx->constant->dtype() != DType::kFloat32) {
    KILN_UNSUPPORTED("x's scale is not one float32 constant");
  }
  p.sx = float(sx->constant->as_double(0));
  if (!(p.sx > 0) || !std::isfinite(p.sx)) KILN_UNSUPPORTED("x's scale {} is not a positive number", p.sx);
  if (const Value* zx = in(q, 2)) {
    if (!zx->constant || zx->constant->numel() != 1) KILN_UNSUPPORTED("x's zero point is not one constant");
    p.zx = float(zx->constant->as_double(0));
  }
  const DType xt = q.outputs[0]->type.dtype;
  p.w = L.constant(node.inputs[1]);
  if (!p.w || p.w->rank() != 2) KILN_UNSUPPORTED("the weight is not a 2-D constant");
  p.k = p.w->dim(0);
  p.n = p.w->dim(1);
  if (xt == DType::kFloat8E4M3FN && p.w->dtype() == DType::kFloat8E4M3FN) {
    p.fp8 = true;
  } else if ((xt == DType::kInt8 || xt == DType::kUInt8) && p.w->dtype() == DType::kInt8) {
    if (xt == DType::kUInt8) {
      p.offset = 128;
      p.lo = 0;
      p.hi = 255;
    }
  } else {
    KILN_UNSUPPORTED("activation {} with weight {}", dtype_name(xt), dtype_name(p.w->dtype()));
  }
  const Tensor* sw = L.constant(node.inputs[2]);
  if (!sw || sw->dtype() != DType::kFloat32 || (sw->numel() != 1 && sw->numel() != p.n)) {
    KILN_UNSUPPORTED("the weight's scale is not a float32 constant of 1 or N elements");
  }
  p.per_channel = sw->numel() != 1;
  if (p.per_channel && (sw->rank() != 1 || (dw.attr_int("axis", 1) != 1 && dw.attr_int("axis", 1) != -1))) {
    KILN_UNSUPPORTED("the weight's scales are not along its columns");
  }
  for (int64_t i = 0; i < p.n; ++i) p.sw.push_back(float(sw->as_double(p.per_channel ? i : 0)));
  if (const Value* zw = in(dw, 2)) {
    if (!zw->constant || !all_zero_bytes(*zw->constant)) KILN_UNSUPPORTED("the weight's zero point is not 0");
  }
  if (add) {
    p.bias = L.constant(node.inputs[3]);
    if (!p.bias || p.bias->dtype() != DType::kFloat32 || p.bias->numel() != p.n) KILN_UNSUPPORTED("a bias not of N floats");
  }
  return p;
}

Status destroy_desc(cublasLtMatmulDesc_t d) { return cuda_status(cublasLtMatmulDescDestroy(d), "destroy"); }
Status destroy_layout(cublasLtMatrixLayout_t d) { return cuda_status(cublasLtMatrixLayoutDestroy(d), "destroy"); }

cudaDataType_t out_type(k::DT d) {
  return d == k::DT::kF16 ? CUDA_R_16F : d == k::DT::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
}

// How a product runs. kInt8Sums and kFp8Sums leave raw sums (int32 / f32) that dequant_cols scales
// per column; kFp8Scaled applies the scales (outer-vector or scalar) and the bias in cuBLASLt's
// epilogue and writes the output directly.
enum class Variant : int32_t { kInt8Sums, kFp8Scaled, kFp8Sums };

struct QuantLt {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
};

// Column-major: D [n, m] = op(A) [n, k] . B [k, m], A = the weight stored [n, k] (op T), B = the
// quantized x [m, k] rows (op N).
Expected<QuantLt> make_quant_lt(std::vector<std::shared_ptr<void>>& keep, Variant v, k::DT out, int64_t m, int64_t n,
                                int64_t k, bool per_channel, bool bias) {
  const bool fp8 = v != Variant::kInt8Sums;
  QuantLt q;
  KILN_CUDA_TRY(cublasLtMatmulDescCreate(&q.desc, fp8 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32I,
                                         fp8 ? CUDA_R_32F : CUDA_R_32I));
  hold(keep, q.desc, destroy_desc);
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  KILN_CUDA_TRY(cublasLtMatmulDescSetAttribute(q.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  KILN_CUDA_TRY(cublasLtMatmulDescSetAttribute(q.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  const cudaDataType_t in_t = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_8I;
  const cudaDataType_t d_t = v == Variant::kFp8Scaled ? out_type(out) : fp8 ? CUDA_R_32F : CUDA_R_32I;
  if (v == Variant::kFp8Scaled) {
    if (per_channel) {
      // Outer-vector scales on both sides: A's one per output column, B's x's scale per row.
      const cublasLtMatmulMatrixScale_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
      KILN_CUDA_TRY(cublasLtMatmulDescSetAttribute(q.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode)));
      KILN_CUDA_TRY(cublasLtMatmulDescSetAttribute(q.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode)));
    }
    const cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    KILN_CUDA_TRY(cublasLtMatmulDescSetAttribute(q.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  }
  auto layout = [&](cudaDataType_t t, int64_t rows, int64_t cols, cublasLtMatrixLayout_t* l) -> Status {
    KILN_CUDA_TRY(cublasLtMatrixLayoutCreate(l, t, uint64_t(rows), uint64_t(cols), rows));
    hold(keep, *l, destroy_layout);
    return Status::ok();
  };
  KILN_RETURN_IF_ERROR(layout(in_t, k, n, &q.la));
  KILN_RETURN_IF_ERROR(layout(in_t, k, m, &q.lb));
  KILN_RETURN_IF_ERROR(layout(d_t, n, m, &q.ld));
  return q;
}

// The heuristic's first working algorithm for these descriptors, or the status that says why none.
Expected<cublasLtMatmulAlgo_t> first_algo(cublasLtHandle_t lt, const QuantLt& q, size_t ws) {
  cublasLtMatmulPreference_t pref = nullptr;
  KILN_CUDA_TRY(cublasLtMatmulPreferenceCreate(&pref));
  constexpr int kMax = 8;
  cublasLtMatmulHeuristicResult_t heur[kMax] = {};
  int found = 0;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulAlgoGetHeuristic(lt, q.desc, q.la, q.lb, q.ld, q.ld, pref, kMax, heur, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  // Candidates cublasLtMatmulAlgoCheck also accepts first (the check an engine file's algorithm
  // gets when it is bound), then any the heuristic calls working.
  for (bool checked : {true, false}) {
    for (int i = 0; st == CUBLAS_STATUS_SUCCESS && i < found; ++i) {
      if (heur[i].state != CUBLAS_STATUS_SUCCESS || heur[i].workspaceSize > ws) continue;
      cublasLtMatmulHeuristicResult_t check{};
      if (!checked || cublasLtMatmulAlgoCheck(lt, q.desc, q.la, q.lb, q.ld, q.ld, &heur[i].algo, &check) == CUBLAS_STATUS_SUCCESS) {
        return heur[i].algo;
      }
    }
  }
  return KILN_ERROR(kUnsupported, "status {}, {} candidates", int(st), found);
}

template <typename T>
Expected<Ref> upload_vec(Lowering& L, const std::vector<T>& v) {
  return L.upload_raw(v.data(), v.size() * sizeof(T));
}

void emit_dequant_cols(Lowering& L, const Node& node, k::DT acc_dt, k::DT out_dt, int64_t m, int64_t n, int acc, Ref alpha,
                       Ref beta, Ref y) {
  ByteWriter dw;
  dw.put(int32_t(acc_dt));
  dw.put(int32_t(out_dt));
  dw.i64(m);
  dw.i64(n);
  put(dw, Ref{false, acc});
  put(dw, alpha);
  put(dw, beta);
  put(dw, y);
  L.emit(&node, "kernel dequant_cols", {acc}, {y.id}, StepOp::kDequantCols, std::move(dw));
}

// FNV-1a over bytes, continuing from h: what a derived weight's key says of the small values
// (scales, a bias) it was made with.
uint64_t fnv(const void* data, size_t bytes, uint64_t h = 1469598103934665603ull) {
  const auto* b = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

// The weight as [N, K] bytes (both element types are one byte): the K-major operand cuBLASLt's
// "TN" 8-bit products and the Hopper kernel read. Made once per weight for every shape plan of a
// dynamic engine (Lowering::upload_derived: the transpose of a BERT-base's 85 MB was each new
// shape's work).
Expected<Ref> weight_nk(Lowering& L, const QuantProduct& p) {
  const Tensor* src = p.w;
  const int64_t k = p.k, n = p.n;
  return L.upload_derived(*src, "8-bit [N,K]", k::DT::kU8, [src, k, n]() -> Expected<Tensor> {
    KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::create(DType::kUInt8, {n, k}));
    auto* wt = static_cast<uint8_t*>(t.raw());
    const auto* w = static_cast<const uint8_t*>(src->raw());
    for (int64_t r = 0; r < k; ++r) {
      for (int64_t c = 0; c < n; ++c) wt[size_t(c * k + r)] = w[size_t(r * n + c)];
    }
    return t;
  });
}

// What turns a column's sums into y = sum * alpha[c] + beta[c]: alpha = sx * sw[c], beta = bias[c]
// less, for int8, x's zero point times the column's sum of weights (the stored x is q - offset).
// Both uploaded; beta, which sums the whole weight, once per weight, scales and bias for every
// shape plan of a dynamic engine.
Status upload_column_affine(Lowering& L, const QuantProduct& p, Ref& alpha_ref, Ref& beta_ref) {
  std::vector<float> alpha(size_t(p.n));
  for (int64_t c = 0; c < p.n; ++c) alpha[size_t(c)] = float(double(p.sx) * double(p.sw[size_t(c)]));
  KILN_ASSIGN_OR_RETURN(alpha_ref, L.upload_raw(alpha.data(), alpha.size() * sizeof(float)));
  const double zx = p.fp8 ? 0.0 : double(p.zx) - double(p.offset);
  std::vector<float> bias(size_t(p.n), 0.0f);
  for (int64_t c = 0; p.bias && c < p.n; ++c) bias[size_t(c)] = float(p.bias->as_double(c));
  const std::vector<float> sw = p.sw;
  const float sx = p.sx;
  const uint64_t h = fnv(bias.data(), bias.size() * sizeof(float), fnv(sw.data(), sw.size() * sizeof(float)));
  const Tensor* src = p.w;
  const bool fp8 = p.fp8;
  const int64_t k = p.k, n = p.n;
  KILN_ASSIGN_OR_RETURN(beta_ref, L.upload_derived(*src, fmt::format("column offsets {} {} {:016x}", sx, zx, h),
                                                   k::DT::kF32, [src, fp8, k, n, sx, zx, sw, bias]() -> Expected<Tensor> {
    KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::create(DType::kFloat32, {n}));
    float* beta = t.data<float>();
    const auto* w = static_cast<const int8_t*>(src->raw());
    for (int64_t c = 0; c < n; ++c) {
      int64_t colsum = 0;
      for (int64_t r = 0; !fp8 && r < k; ++r) colsum += w[size_t(r * n + c)];
      beta[c] = float(double(bias[size_t(c)]) - double(sx) * double(sw[size_t(c)]) * zx * double(colsum));
    }
    return t;
  }));
  return Status::ok();
}

// x quantized to 8 bits (k::quantize_int8 / quantize_fp8) in a scratch buffer. Products of one x at
// one scale (a transformer's Q, K and V) share it: *copy is the key to record in L.fake_quants once
// the product is emitted, empty when the buffer is an earlier product's.
int quantized_x(Lowering& L, const Node& node, const QuantProduct& p, const DevValue* x, int64_t m, std::string* copy) {
  *copy = fmt::format("8-bit {} {} {} {} {} {} {} {} {}", x->ref.weight, x->ref.id, int(x->dt), p.fp8, p.sx, p.zx, p.lo,
                      p.hi, p.offset);
  if (auto made = L.fake_quants.find(*copy); made != L.fake_quants.end()) {
    copy->clear();
    return made->second;
  }
  const int xq = L.scratch(size_t(m * p.k));
  ByteWriter pw;
  pw.put(int32_t(x->dt));
  pw.u8(p.fp8);
  pw.i64(m * p.k);
  for (float f : {p.sx, p.zx, p.lo, p.hi, p.offset}) pw.put(f);
  put(pw, x->ref);
  put(pw, Ref{false, xq});
  L.emit(&node, fmt::format("kernel quantize_{} (x / {})", p.fp8 ? "fp8" : "int8", p.sx), {read_id(x)}, {xq},
         StepOp::kQuantizeAct, std::move(pw));
  return xq;
}

// Whether the Hopper 8-bit kernel can take the product in this build (its alignment, a 16-bit
// output of x's type, a device it runs on).
bool sm90_applies(const Lowering& L, const QuantProduct& p, k::DT xdt, k::DT odt, int64_t m) {
  return L.options().gemm_sm90 >= 0 && k::gemm_sm90_q8_available() && xdt == odt &&
         (odt == k::DT::kF16 || odt == k::DT::kBF16) && k::gemm_sm90_q8_shape_ok(m, p.n, p.k) &&
         k::gemm_sm90_q8_prepare(p.fp8, odt == k::DT::kBF16, 0, 0) == cudaSuccess;
}

// The Hopper kernel's tile when nothing was timed: the wide one for many rows.
int tile_for_rows(int64_t m) { return m >= 1024 ? 0 : 1; }

// The product on the Hopper 8-bit kernel: x quantized (or its shared copy), then one kernel with the
// scales, the bias, and the residual Add and GELU after it (when they follow) in its epilogue.
Status emit_sm90_form(Lowering& L, const Node& node, const QuantProduct& p, const DevValue* x, int64_t m, k::DT dt,
                      const Value* from, int tile, const std::string& why) {
  KILN_ASSIGN_OR_RETURN(Ref wref, weight_nk(L, p));
  Ref ar, br;
  KILN_RETURN_IF_ERROR(upload_column_affine(L, p, ar, br));
  Epilogue ep;
  std::vector<const Node*> fused;
  const Value* out = fuse_product_tail(L, from, dt, ep, fused);
  const bool bf16 = dt == k::DT::kBF16;
  // The kernel's epilogue has GELU only, prepared here so that binding the engine cannot fail on
  // it: a Relu (or a GELU kernel that cannot be prepared) runs on its own after the product.
  if (ep.act == Act::kRelu || (ep.act == Act::kGelu && k::gemm_sm90_q8_prepare(p.fp8, bf16, tile, 2) != cudaSuccess)) {
    ep = Epilogue{};
    fused.clear();
    out = fuse_residual(L, from, dt, ep, fused);
  }
  const int act = ep.act == Act::kGelu ? 2 : 0;
  KILN_CUDA_TRY(k::gemm_sm90_q8_prepare(p.fp8, bf16, tile, act));
  std::string copy;
  const int xq = quantized_x(L, node, p, x, m, &copy);
  const DevValue& y = L.define(out);
  ByteWriter w;
  w.u8(p.fp8);
  w.put(int32_t(dt));
  w.put(int32_t(tile));
  w.put(int32_t(act));
  for (int64_t d : {m, p.n, p.k}) w.i64(d);
  w.put(ep.c ? ep.beta : 0.0f);
  put(w, Ref{false, xq});
  put(w, wref);
  put(w, ar);
  put(w, br);
  put(w, ep.c ? ep.c->ref : Ref{});
  put(w, y.ref);
  std::vector<int> reads = {xq};
  if (ep.c && !ep.c->ref.weight) reads.push_back(ep.c->ref.id);
  L.emit(&node,
         fmt::format("kernel gemm_sm90_q8 {} m={} n={} k={}{}{}{}{} (CUTLASS TMA+wgmma, tile {}; {})",
                     p.fp8 ? "fp8" : "int8", m, p.n, p.k, p.per_channel ? " per-channel" : "", p.bias ? " +bias" : "",
                     ep.c ? " +residual" : "", act ? " +gelu" : "", tile == 0 ? "128x128x128" : "64x128x128", why),
         reads, {y.ref.id}, StepOp::kGemmSm90Quant, std::move(w));
  for (const Node* f : fused) L.mark_fused(f, &node);
  if (!copy.empty()) L.fake_quants[copy] = xq;
  return Status::ok();
}

// The product in x's 16-bit type: x quantized and dequantized (k::fake_quant), then emit_gemm on
// the weight dequantized at build ([K, N], each column times its scale) with the bias in the epilogue.
// The residual Add and Relu/Gelu after it join the 16-bit GEMM's epilogue as they do a MatMul's, and
// products of one x at one scale (a transformer's Q, K and V) share one quantized copy of it.
Status emit_16bit_form(Lowering& L, const Node& node, const QuantProduct& p, const DevValue* x, int64_t m, k::DT dt,
                       const Value* from, const std::string& why) {
  const std::string copy =
      fmt::format("{} {} {} {} {} {} {} {}", x->ref.weight, x->ref.id, int(dt), p.fp8, p.sx, p.zx, p.lo, p.hi);
  auto made = L.fake_quants.find(copy);
  const bool shared = made != L.fake_quants.end();
  const int xf = shared ? made->second : L.scratch(size_t(m * p.k) * size_t(k::dt_size(dt)));
  if (!shared) {
    ByteWriter fw;
    fw.put(int32_t(dt));
    fw.u8(p.fp8);
    fw.i64(m * p.k);
    for (float f : {p.sx, p.zx, p.lo, p.hi}) fw.put(f);
    put(fw, x->ref);
    put(fw, Ref{false, xf});
    L.emit(&node, fmt::format("kernel fake_quant_{} (x / {}; {})", p.fp8 ? "fp8" : "int8", p.sx, why), {read_id(x)},
           {xf}, StepOp::kFakeQuant, std::move(fw));
  }
  DevValue xv;
  xv.ref = Ref{false, xf};
  xv.dt = dt;
  xv.ir_dtype = x->ir_dtype;
  xv.dims = {m, p.k};
  // The pool shares the dequantized weight between shape plans by its source and its scales.
  const uint64_t h = fnv(p.sw.data(), p.sw.size() * sizeof(float));
  const std::vector<float> sw = p.sw;
  const Tensor* w = p.w;
  KILN_ASSIGN_OR_RETURN(Ref wr, L.upload_derived(*w, fmt::format("dequantized {:016x}", h), dt, [w, sw]() -> Expected<Tensor> {
    KILN_ASSIGN_OR_RETURN(Tensor wf, convert_tensor(*w, DType::kFloat32));
    float* d = wf.data<float>();
    const size_t cols = sw.size();
    for (size_t i = 0; i < size_t(wf.numel()); ++i) d[i] *= sw[i % cols];
    return wf;
  }));
  DevValue wv;
  wv.ref = wr;
  wv.dt = dt;
  wv.ir_dtype = dt == k::DT::kBF16 ? DType::kBFloat16 : DType::kFloat16;
  wv.dims = {p.k, p.n};
  DevValue bv;
  Epilogue ep;
  if (p.bias) {
    KILN_ASSIGN_OR_RETURN(bv.ref, L.upload_constant(*p.bias, dt));
    bv.dt = dt;
    bv.ir_dtype = wv.ir_dtype;
    bv.dims = {p.n};
    ep.bias = &bv;
  }
  GemmShape s;
  s.m = m;
  s.n = p.n;
  s.k = p.k;
  std::vector<const Node*> fused;
  const Value* out = fuse_product_tail(L, from, dt, ep, fused);
  const DevValue& y = L.define(out);
  if (Status st = emit_gemm(L, node, &xv, &wv, s, ep, y.ref, dt); !st) {
    L.values.erase(out);
    return st;
  }
  for (const Node* f : fused) L.mark_fused(f, &node);
  // Shared only now: a node that declines has its steps, this copy's too, dropped.
  L.fake_quants[copy] = xf;
  return Status::ok();
}

// What a product's timing found (microseconds per launch; -1: not timed) and the form it took.
struct Forms {
  int form = 8;  // 8: cuBLASLt's 8-bit product, 16: the 16-bit form, 90: the Hopper 8-bit kernel
  float q8 = -1, f16 = -1, s90 = -1;
  int tile = 0;  // the Hopper kernel's (k::GemmSm90QArgs::tile)

  // "FORM Q8 F16 [S90 TILE]", as the timing cache holds it; an older "FORM Q8 F16" reads too.
  static Forms parse(const std::string& s) {
    Forms f;
    if (std::sscanf(s.c_str(), "%d %f %f %f %d", &f.form, &f.q8, &f.f16, &f.s90, &f.tile) < 1 ||
        (f.form != 8 && f.form != 16 && f.form != 90) || (f.tile != 0 && f.tile != 1)) {
      return Forms{};
    }
    return f;
  }
  std::string str() const { return fmt::format("{} {:.1f} {:.1f} {:.1f} {}", form, q8, f16, s90, tile); }
  std::string timed() const {
    std::string t;
    for (auto [us, what] : {std::pair{q8, "cuBLASLt 8-bit"}, {s90, "Hopper 8-bit"}, {f16, "16-bit"}}) {
      if (us > 0) t += fmt::format("{}{} {:.1f} us", t.empty() ? "" : ", ", what, us);
    }
    return t;
  }
};

// The product's forms timed as the forward runs them (tuning.h), milliseconds per launch: the 8-bit
// ones (quantize x, then cuBLASLt's product and the sums scaled when it did not, or the Hopper
// kernel at each tile when `sm90`) and the 16-bit one (k::fake_quant, then the cuBLASLt algorithm
// emit_gemm takes for a bias epilogue, timed by gemm_ms). The comparison leans to the model's 8 bits:
// the 16-bit form is charged a fake_quant pass that products sharing x share, and not credited with
// the residual Add and activation its epilogue takes.
Expected<Forms> time_forms(Lowering& L, const QuantProduct& p, Variant v, const QuantLt& lt,
                           const cublasLtMatmulAlgo_t& algo, k::DT xdt, k::DT odt, int64_t m, bool sm90) {
  const int64_t n = p.n, k = p.k;
  const size_t ws = L.options().workspace_bytes;
  const size_t xbytes = size_t(m * k) * size_t(k::dt_size(xdt));
  const bool sums = v != Variant::kFp8Scaled;
  const size_t dbytes = size_t(m * n) * (sums ? 4 : size_t(k::dt_size(odt)));
  Forms f;
  float fq = -1;
  {  // the timing buffers go before gemm_ms times (and allocates) on its own
    ProductOperands op(size_t(m * k), size_t(n * k), dbytes, false);
    Scratch xs, xf, d, y, sa, sb, bias, alpha, beta;
    // Every buffer starts zeroed: compute-sanitizer's initcheck does not see cuBLASLt's fp8 kernels
    // write the sums (262k reports from dequant_cols reading them), and what is timed must not depend
    // on leftover bytes.
    bool ok = op.ok();
    for (auto [q, bytes] : {std::pair{&xs, xbytes}, {&xf, xbytes}, {&d, dbytes}, {&y, size_t(m * n) * size_t(k::dt_size(odt))}}) {
      ok = ok && cudaMalloc(&q->p, bytes) == cudaSuccess && cudaMemset(q->p, 0, bytes) == cudaSuccess;
    }
    const size_t vec = size_t(std::max(n, m)) * 4;  // scales (one per row or column), bias, alpha, beta
    for (Scratch* q : {&sa, &sb, &bias, &alpha, &beta}) {
      ok = ok && cudaMalloc(&q->p, vec) == cudaSuccess && cudaMemset(q->p, 0, vec) == cudaSuccess;
    }
    if (ok && v == Variant::kFp8Scaled) {
      ok = cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa.p, sizeof(sa.p)) ==
               CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb.p, sizeof(sb.p)) ==
               CUBLAS_STATUS_SUCCESS &&
           (!p.bias || cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias.p,
                                                      sizeof(bias.p)) == CUBLAS_STATUS_SUCCESS);
    }
    auto quantize = [&](void* xq, cudaStream_t st) {
      return (p.fp8 ? k::quantize_fp8(xdt, xs.p, xq, m * k, p.sx, st)
                    : k::quantize_int8(xdt, xs.p, xq, m * k, p.sx, p.zx, p.lo, p.hi, p.offset, st)) == cudaSuccess;
    };
    if (ok) {
      const float one = 1.0f, zero = 0.0f;
      const int32_t ione = 1, izero = 0;
      const bool fp8 = v != Variant::kInt8Sums;
      const void* a1 = fp8 ? static_cast<const void*>(&one) : &ione;
      const void* b0 = fp8 ? static_cast<const void*>(&zero) : &izero;
      f.q8 = time_in_graph(op.launches, [&](int i, cudaStream_t st) {
        void* xq = op.a.copy(i);
        if (!quantize(xq, st) ||
            cublasLtMatmul(L.lt, lt.desc, a1, op.w.copy(i), lt.la, xq, lt.lb, b0, d.p, lt.ld, d.p, lt.ld, &algo,
                           L.build_workspace, ws, st) != CUBLAS_STATUS_SUCCESS) {
          return false;
        }
        return !sums || k::dequant_cols(v == Variant::kInt8Sums ? k::DT::kI32 : k::DT::kF32, d.p,
                                        static_cast<const float*>(alpha.p), static_cast<const float*>(beta.p), odt, y.p,
                                        m, n, st) == cudaSuccess;
      });
      for (int tile = 0; sm90 && tile < 2; ++tile) {
        if (k::gemm_sm90_q8_prepare(p.fp8, odt == k::DT::kBF16, tile, 0) != cudaSuccess) continue;
        const float t = time_in_graph(op.launches, [&](int i, cudaStream_t st) {
          k::GemmSm90QArgs g;
          g.a = op.a.copy(i);
          g.b = op.w.copy(i);
          g.alpha = static_cast<const float*>(alpha.p);
          g.bias = static_cast<const float*>(beta.p);
          g.d = y.p;
          g.m = m;
          g.n = n;
          g.k = k;
          g.tile = tile;
          g.fp8 = p.fp8;
          g.bf16 = odt == k::DT::kBF16;
          return quantize(const_cast<void*>(g.a), st) && k::gemm_sm90_q8(g, st) == cudaSuccess;
        });
        if (t > 0 && (f.s90 < 0 || t < f.s90)) {
          f.s90 = t;
          f.tile = tile;
        }
      }
      fq = time_in_graph(op.launches, [&](int, cudaStream_t st) {
        return k::fake_quant(xdt, xs.p, xf.p, m * k, p.sx, p.zx, p.lo, p.hi, p.fp8, st) == cudaSuccess;
      });
    }
    KILN_RETURN_IF_ERROR(finish_timing(fmt::format("the 8-bit product m={} n={} k={}", m, n, k)));
  }
  if (fq > 0) {
    GemmShape s;
    s.m = m;
    s.n = n;
    s.k = k;
    DevValue stand_in;  // gemm_ms reads only whether there is a bias
    Epilogue ep;
    if (p.bias) ep.bias = &stand_in;
    // A GEMM cuBLASLt cannot time or run leaves the 8-bit form, not an error.
    Expected<float> g = gemm_ms(L, s, ep, xdt);
    if (g && *g > 0) f.f16 = fq + *g;
  }
  return f;
}

// The form a product takes (with what was timed): from the timing cache, else timed now (a build) or
// the nearest shape's (a dynamic engine's shape plan), else an 8-bit form (nothing timed: the
// model's 8 bits stand; the Hopper kernel where it applies). An entry from before the Hopper kernel
// ("FORM Q8 F16", no time for it) is timed again by a build where the kernel applies and taken as
// it is where nothing is timed. Only a timing of every form that applies is kept: a failed one is
// timed again by a later build.
Expected<Forms> quant_form(Lowering& L, const QuantProduct& p, Variant v, const QuantLt& lt,
                           const cublasLtMatmulAlgo_t& algo, k::DT xdt, k::DT odt, int64_t m, bool sm90) {
  const std::string key = fmt::format("{} v{} pc{} b{} x{} o{} @ {} {} {}", p.fp8 ? "fp8" : "int8", int(v),
                                      int(p.per_channel), p.bias != nullptr, int(xdt), int(odt), m, p.n, p.k);
  if (auto it = L.quant_forms.find(key); it != L.quant_forms.end()) return Forms::parse(it->second);
  TimingCache* cache = L.options().autotune ? L.options().timing_cache.get() : nullptr;
  const bool timing = L.options().autotune && L.options().time_misses;
  std::optional<std::string> form;
  if (cache) {
    form = cache->get("qform", key);
    if (!form && !L.options().time_misses) form = cache->nearest("qform", key);
  }
  if ((!form || (sm90 && Forms::parse(*form).s90 <= 0)) && timing) {
    KILN_ASSIGN_OR_RETURN(Forms f, time_forms(L, p, v, lt, algo, xdt, odt, m, sm90));
    if (f.q8 > 0 || f.s90 > 0) {
      float best = f.q8 > 0 ? f.q8 : f.s90;
      if (f.s90 > 0 && f.s90 <= best) {
        f.form = 90;
        best = f.s90;
      }
      if (f.f16 > 0 && f.f16 < best) f.form = 16;
      const bool complete = f.q8 > 0 && f.f16 > 0 && (!sm90 || f.s90 > 0);
      f.q8 *= f.q8 > 0 ? 1000.0f : 1.0f;  // kept in microseconds
      f.f16 *= f.f16 > 0 ? 1000.0f : 1.0f;
      f.s90 *= f.s90 > 0 ? 1000.0f : 1.0f;
      form = f.str();
      if (cache && complete) cache->put("qform", key, *form);
    }
  }
  if (!form) {
    Forms none;
    none.form = sm90 ? 90 : 8;
    none.tile = tile_for_rows(m);
    form = none.str();
  }
  L.quant_forms[key] = *form;
  return Forms::parse(*form);
}

// The product from `out` on (the node's output, or its bias Add's): its form chosen and emitted.
Status emit_quantized_matmul(Lowering& L, const Node& node, const QuantProduct& p, const DevValue* x, const Value* out) {
  auto odt = L.device_dt(out->type.dtype);
  if (!x || !odt || !is_float_dt(x->dt) || !is_float_dt(*odt) || x->dims.empty() || x->dims.back() != p.k) {
    KILN_UNSUPPORTED("x is not a float matrix of K = {} columns", p.k);
  }
  const int64_t m = x->numel() / p.k, n = p.n, k = p.k;
  const int forced = L.options().quant_form;
  const bool sm90 = sm90_applies(L, p, x->dt, *odt, m);
  if (forced == 8 && sm90 && L.options().gemm_sm90 == 1) {
    // Forced (tests): the wide tile when gemm_sm90_tile asks for 128 columns, else by the rows.
    const int t = L.options().gemm_sm90_tile;
    return emit_sm90_form(L, node, p, x, m, *odt, out, t == 128 ? 0 : t == 64 ? 1 : tile_for_rows(m), "as the build asked");
  }
  // cuBLASLt's 8-bit products want 16-byte rows (fp8) / 4-element multiples (int8).
  const int64_t align = p.fp8 ? 16 : 4;
  if (k % align || n % align || m < 1) KILN_UNSUPPORTED("K = {} and N = {} must be multiples of {}", k, n, align);
  const size_t ws = L.options().workspace_bytes;
  // fp8: scales and bias in cuBLASLt's epilogue when it has such a kernel, else f32 sums scaled after.
  Variant v = p.fp8 ? Variant::kFp8Scaled : Variant::kInt8Sums;
  KILN_ASSIGN_OR_RETURN(QuantLt lt, make_quant_lt(L.keep_alive, v, *odt, m, n, k, p.per_channel, p.bias != nullptr));
  Expected<cublasLtMatmulAlgo_t> algo = first_algo(L.lt, lt, ws);
  std::string scaled_why;
  if (!algo && v == Variant::kFp8Scaled) {
    scaled_why = fmt::format(" (no fp8 kernel with {} scales: {})", p.per_channel ? "per-column" : "scalar",
                             algo.status().message());
    v = Variant::kFp8Sums;
    KILN_ASSIGN_OR_RETURN(lt, make_quant_lt(L.keep_alive, v, *odt, m, n, k, false, false));
    algo = first_algo(L.lt, lt, ws);
  }
  if (!algo) {
    const std::string why = fmt::format("cuBLASLt has no {} algorithm for m={} n={} k={} ({})", p.fp8 ? "fp8" : "int8",
                                        m, n, k, algo.status().message());
    if (sm90 && forced != 16) return emit_sm90_form(L, node, p, x, m, *odt, out, tile_for_rows(m), why);
    KILN_UNSUPPORTED("{}", why);
  }
  std::string timed;
  if ((x->dt == k::DT::kF16 || x->dt == k::DT::kBF16) && x->dt == *odt && forced != 8) {
    Forms f;
    f.form = 16;
    if (forced != 16) {
      KILN_ASSIGN_OR_RETURN(f, quant_form(L, p, v, lt, *algo, x->dt, *odt, m, sm90));
    }
    timed = f.timed();
    if (f.form == 16) {
      return emit_16bit_form(L, node, p, x, m, x->dt, out,
                             timed.empty() ? "16-bit, as the build asked" : "16-bit: " + timed);
    }
    if (f.form == 90) {
      if (sm90) return emit_sm90_form(L, node, p, x, m, *odt, out, f.tile, timed);
      // Chosen where the Hopper kernel ran (the same key, gemm_sm90 on): the faster of the others.
      if (f.f16 > 0 && (f.q8 <= 0 || f.f16 < f.q8)) return emit_16bit_form(L, node, p, x, m, x->dt, out, "16-bit: " + timed);
    }
    if (!timed.empty()) timed = "; " + timed;
  }

  KILN_ASSIGN_OR_RETURN(Ref wref, weight_nk(L, p));
  std::string copy;
  const int xq = quantized_x(L, node, p, x, m, &copy);
  const DevValue& y = L.define(out);
  ByteWriter w8;
  w8.put(int32_t(v));
  w8.put(int32_t(*odt));
  for (int64_t d : {m, n, k}) w8.i64(d);
  w8.u8(p.per_channel);
  for (uint64_t word : algo->data) w8.u64(word);
  put(w8, wref);
  put(w8, Ref{false, xq});
  const std::string shape = fmt::format("m={} n={} k={}", m, n, k);
  if (v == Variant::kFp8Scaled) {
    KILN_ASSIGN_OR_RETURN(Ref sa, upload_vec(L, p.per_channel ? p.sw : std::vector<float>{p.sw[0]}));
    KILN_ASSIGN_OR_RETURN(Ref sb, upload_vec(L, std::vector<float>(p.per_channel ? size_t(m) : 1, p.sx)));
    Ref bias{};
    if (p.bias) {
      KILN_ASSIGN_OR_RETURN(bias, L.upload(*p.bias, *odt));
    }
    put(w8, sa);
    put(w8, sb);
    put(w8, bias);
    put(w8, y.ref);
    L.emit(&node, fmt::format("cublasLt fp8 {}{}{}{}", shape, p.per_channel ? " per-channel" : "", p.bias ? " +bias" : "",
                              timed.empty() ? "" : " (" + timed.substr(2) + ")"),
           {xq}, {y.ref.id}, StepOp::kLtMatmulQuant, std::move(w8));
  } else {
    const k::DT acc_dt = v == Variant::kInt8Sums ? k::DT::kI32 : k::DT::kF32;
    const int acc = L.scratch(size_t(m * n) * 4);
    for (int i = 0; i < 3; ++i) put(w8, Ref{});
    put(w8, Ref{false, acc});
    L.emit(&node, fmt::format("cublasLt {} {} (sums{}){}", p.fp8 ? "fp8" : "int8", shape, timed, scaled_why), {xq}, {acc},
           StepOp::kLtMatmulQuant, std::move(w8));
    Ref ar, br;
    KILN_RETURN_IF_ERROR(upload_column_affine(L, p, ar, br));
    emit_dequant_cols(L, node, acc_dt, *odt, m, n, acc, ar, br, y.ref);
  }
  if (!copy.empty()) L.fake_quants[copy] = xq;
  return Status::ok();
}

// The Add of a per-column float32 constant that alone reads the product, when the body has no bias
// (fuse-qdq-matmul runs before fold-constants, so a bias that only folding makes constant, such as
// a Cast of an fp16 one, stays outside): the product takes it as the body's own, in its epilogue.
const Node* outer_bias(Lowering& L, const Value* out, QuantProduct& p) {
  const Node* add = p.bias ? nullptr : L.only_consumer(out);
  if (!add || add->op != OpKind::kAdd || L.is_fused(add) || add->inputs.size() != 2 || !add->has_output(0) ||
      !(add->outputs[0]->type == out->type)) {
    return nullptr;
  }
  const Value* other = add->inputs[0] == out ? add->inputs[1] : add->inputs[0];
  const Tensor* b = other != out ? L.constant(other) : nullptr;
  if (!b || b->dtype() != DType::kFloat32 || b->numel() != p.n || b->rank() < 1 || b->dim(b->rank() - 1) != p.n) {
    return nullptr;
  }
  p.bias = b;
  return add;
}

Status lower_quantized_matmul(Lowering& L, const Node& node) {
  KILN_ASSIGN_OR_RETURN(QuantProduct p, read_body(L, node));
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(node.inputs[0]));
  const Node* bias_add = outer_bias(L, node.outputs[0], p);
  const Value* out = bias_add ? bias_add->outputs[0] : node.outputs[0];
  if (Status st = emit_quantized_matmul(L, node, p, x, out); !st) {
    return st;
  }
  if (bias_add) L.mark_fused(bias_add, &node);
  return Status::ok();
}

Expected<StepFn> bind_quantize_act(Params& in, BindCtx&) {
  const k::DT dt = in.dt();
  const bool fp8 = in.flag();
  const int64_t count = in.i64();
  const float sx = in.f32(), zx = in.f32(), lo = in.f32(), hi = in.f32(), offset = in.f32();
  const Ref x = in.ref(), y = in.ref();
  KILN_RETURN_IF_ERROR(in.done());
  if (count < 0 || !(sx > 0)) return KILN_ERROR(kInvalidModel, "step '{}': malformed quantization", in.step().label);
  return StepFn([=](const RunCtx& c) -> Status {
    KILN_CUDA_TRY(fp8 ? k::quantize_fp8(dt, c.ptr(x), c.ptr(y), count, sx, c.stream)
                      : k::quantize_int8(dt, c.ptr(x), c.ptr(y), count, sx, zx, lo, hi, offset, c.stream));
    return Status::ok();
  });
}

Expected<StepFn> bind_fake_quant(Params& in, BindCtx&) {
  const k::DT dt = in.dt();
  const bool fp8 = in.flag();
  const int64_t count = in.i64();
  const float sx = in.f32(), zx = in.f32(), lo = in.f32(), hi = in.f32();
  const Ref x = in.ref(), y = in.ref();
  KILN_RETURN_IF_ERROR(in.done());
  if (count < 0 || !(sx > 0) || !(lo <= hi) || y.weight) {
    return KILN_ERROR(kInvalidModel, "step '{}': malformed quantization", in.step().label);
  }
  return StepFn([=](const RunCtx& c) -> Status {
    KILN_CUDA_TRY(k::fake_quant(dt, c.ptr(x), c.ptr(y), count, sx, zx, lo, hi, fp8, c.stream));
    return Status::ok();
  });
}

Expected<StepFn> bind_gemm_sm90_quant(Params& in, BindCtx&) {
  const bool fp8 = in.flag();
  const k::DT dt = in.dt();
  const int tile = in.i32(), act = in.i32();
  const int64_t m = in.i64(), n = in.i64(), kk = in.i64();
  const float beta = in.f32();
  const Ref a = in.ref(), w = in.ref(), alpha = in.ref(), bias = in.ref(), c = in.opt_ref(), y = in.ref();
  KILN_RETURN_IF_ERROR(in.done());
  if (!k::gemm_sm90_q8_available()) {
    return KILN_ERROR(kUnsupported, "step '{}': this kiln was built without the Hopper 8-bit kernel", in.step().label);
  }
  if (!k::gemm_sm90_q8_shape_ok(m, n, kk) || (dt != k::DT::kF16 && dt != k::DT::kBF16) || (tile != 0 && tile != 1) ||
      (act != 0 && act != 2) || y.weight) {
    return KILN_ERROR(kInvalidModel, "step '{}': a malformed quantized product (m={} n={} k={}, tile {}, act {})",
                      in.step().label, m, n, kk, tile, act);
  }
  // Once per kernel before the first launch, outside graph capture.
  KILN_CUDA_TRY(k::gemm_sm90_q8_prepare(fp8, dt == k::DT::kBF16, tile, act));
  return StepFn([=](const RunCtx& ctx) -> Status {
    k::GemmSm90QArgs g;
    g.a = ctx.ptr(a);
    g.b = ctx.ptr(w);
    g.alpha = static_cast<const float*>(ctx.ptr(alpha));
    g.bias = static_cast<const float*>(ctx.ptr(bias));
    g.c = c.id >= 0 ? ctx.ptr(c) : nullptr;
    g.d = ctx.ptr(y);
    g.m = m;
    g.n = n;
    g.k = kk;
    g.tile = tile;
    g.act = act;
    g.beta = beta;
    g.fp8 = fp8;
    g.bf16 = dt == k::DT::kBF16;
    return cuda_status(k::gemm_sm90_q8(g, ctx.stream), "gemm_sm90_q8");
  });
}

Expected<StepFn> bind_lt_matmul_quant(Params& in, BindCtx& bc) {
  const auto v = in.en<Variant>(Variant::kFp8Sums);
  const k::DT dt = in.dt();
  const int64_t m = in.i64(), n = in.i64(), k = in.i64();
  const bool per_channel = in.flag();
  cublasLtMatmulAlgo_t algo{};
  for (uint64_t& word : algo.data) word = uint64_t(in.i64());
  const Ref a = in.ref(), b = in.ref(), sa = in.opt_ref(), sb = in.opt_ref(), bias = in.opt_ref(), d = in.ref();
  KILN_RETURN_IF_ERROR(in.done());
  const bool scaled = v == Variant::kFp8Scaled, has_bias = bias.id >= 0;
  if (m < 1 || n < 1 || k < 1 || (scaled && (sa.id < 0 || sb.id < 0))) {
    return KILN_ERROR(kInvalidModel, "step '{}': a malformed quantized product", in.step().label);
  }
  KILN_ASSIGN_OR_RETURN(QuantLt lt, make_quant_lt(bc.keep_alive, v, dt, m, n, k, scaled && per_channel, scaled && has_bias));
  cublasLtMatmulHeuristicResult_t check{};
  const cublasStatus_t st = cublasLtMatmulAlgoCheck(bc.lt, lt.desc, lt.la, lt.lb, lt.ld, lt.ld, &algo, &check);
  if (st != CUBLAS_STATUS_SUCCESS || check.workspaceSize > bc.opt.workspace_bytes) {
    // This cuBLASLt refuses the recorded algorithm (another version, or one its check rejects for
    // these types): its heuristic's choice for the same product instead.
    Expected<cublasLtMatmulAlgo_t> again = first_algo(bc.lt, lt, bc.opt.workspace_bytes);
    if (!again) {
      return KILN_ERROR(kInvalidModel, "step '{}': cuBLASLt refuses the engine's algorithm (status {}) and has no other: {}",
                        in.step().label, int(st), again.status().message());
    }
    algo = *again;
  }
  auto mu = std::make_shared<std::mutex>();  // the scale and bias pointers live in the descriptor sessions share
  bc.keep_alive.push_back(mu);
  const bool fp8 = v != Variant::kInt8Sums;
  return StepFn([=](const RunCtx& c) -> Status {
    const float one = 1.0f, zero = 0.0f;
    const int32_t ione = 1, izero = 0;
    const void* alpha = fp8 ? static_cast<const void*>(&one) : &ione;
    const void* beta = fp8 ? static_cast<const void*>(&zero) : &izero;
    std::unique_lock<std::mutex> lock(*mu, std::defer_lock);
    if (scaled) {
      lock.lock();
      void* pa = c.ptr(sa);
      void* pb = c.ptr(sb);
      KILN_CUDA_TRY(cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &pa, sizeof(pa)));
      KILN_CUDA_TRY(cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &pb, sizeof(pb)));
      if (has_bias) {
        void* bp = c.ptr(bias);
        KILN_CUDA_TRY(cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp)));
      }
    }
    void* dp = c.ptr(d);
    KILN_CUDA_TRY(cublasLtMatmul(c.lt, lt.desc, alpha, c.ptr(a), lt.la, c.ptr(b), lt.lb, beta, dp, lt.ld, dp, lt.ld,
                                 &algo, c.workspace, c.workspace_bytes, c.stream));
    return Status::ok();
  });
}

Expected<StepFn> bind_dequant_cols(Params& in, BindCtx&) {
  const k::DT acc_dt = in.dt(), dt = in.dt();
  const int64_t rows = in.i64(), cols = in.i64();
  const Ref acc = in.ref(), alpha = in.ref(), beta = in.ref(), y = in.ref();
  KILN_RETURN_IF_ERROR(in.done());
  if (rows < 1 || cols < 1 || (acc_dt != k::DT::kI32 && acc_dt != k::DT::kF32)) {
    return KILN_ERROR(kInvalidModel, "step '{}': a malformed dequantization", in.step().label);
  }
  return StepFn([=](const RunCtx& c) -> Status {
    KILN_CUDA_TRY(k::dequant_cols(acc_dt, c.ptr(acc), static_cast<const float*>(c.ptr(alpha)),
                                  static_cast<const float*>(c.ptr(beta)), dt, c.ptr(y), rows, cols, c.stream));
    return Status::ok();
  });
}

// DynamicQuantizeLinear (onnxruntime's dynamic quantization in front of MatMulInteger): the
// range, scale and zero point on the device (k::dynamic_quantize_u8), no host round trip.
Status lower_dynamic_quantize(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  if (x->dt != k::DT::kF32 && x->dt != k::DT::kF16 && x->dt != k::DT::kBF16) {
    KILN_UNSUPPORTED("DynamicQuantizeLinear of {}", dtype_name(x->ir_dtype));
  }
  const DevValue& y = L.define(n.outputs[0], Layout::kRowMajor, k::DT::kU8);
  // The scale stays f32 in half builds too: it is what the reference computes and what consumers read.
  const Ref scale = n.has_output(1) ? L.define(n.outputs[1], Layout::kRowMajor, k::DT::kF32).ref
                                    : Ref{false, L.scratch(sizeof(float))};
  const Ref zp = n.has_output(2) ? L.define(n.outputs[2], Layout::kRowMajor, k::DT::kU8).ref : Ref{false, L.scratch(1)};
  ByteWriter w;
  w.put(int32_t(x->dt));
  put(w, x->ref);
  put(w, y.ref);
  put(w, scale);
  put(w, zp);
  w.i64(x->numel());
  L.emit(&n, "kernel dynamic_quantize (uint8)", {read_id(x)}, {y.ref.id, scale.id, zp.id}, StepOp::kDynamicQuantize,
         std::move(w));
  return Status::ok();
}

Expected<StepFn> bind_dynamic_quantize(Params& in, BindCtx&) {
  const k::DT dt = in.dt();
  const Ref xr = in.ref(), yr = in.ref(), sr = in.ref(), zr = in.ref();
  const int64_t count = in.i64();
  KILN_RETURN_IF_ERROR(in.done());
  if (count < 0 || yr.weight || sr.weight || zr.weight) {
    return KILN_ERROR(kInvalidModel, "{}: malformed dynamic_quantize parameters", in.step().label);
  }
  return StepFn([=](const RunCtx& c) {
    return cuda_status(k::dynamic_quantize_u8(dt, c.ptr(xr), count, static_cast<uint8_t*>(c.ptr(yr)),
                                              static_cast<float*>(c.ptr(sr)), static_cast<uint8_t*>(c.ptr(zr)), c.stream),
                       "dynamic_quantize_u8");
  });
}

}  // namespace

void register_quant_lowerings(std::map<OpKind, LowerFn>& t) {
  t[OpKind::kQuantizedMatMul] = lower_quantized_matmul;
  t[OpKind::kDynamicQuantizeLinear] = lower_dynamic_quantize;
}

void register_quant_binders(std::map<StepOp, BindFn>& t) {
  t[StepOp::kQuantizeAct] = bind_quantize_act;
  t[StepOp::kFakeQuant] = bind_fake_quant;
  t[StepOp::kGemmSm90Quant] = bind_gemm_sm90_quant;
  t[StepOp::kLtMatmulQuant] = bind_lt_matmul_quant;
  t[StepOp::kDequantCols] = bind_dequant_cols;
  t[StepOp::kDynamicQuantize] = bind_dynamic_quantize;
}

}  // namespace kiln::cuda
