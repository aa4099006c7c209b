#include "backends/cpu/fast_plan.h"

#include <algorithm>
#include <cfloat>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "backends/cpu/fast_fused.h"
#include "ops/op_kind.h"
#include "runtime/bytes.h"

namespace kiln {

std::string_view cpu_step_kind_name(CpuStepKind k) {
  switch (k) {
    case CpuStepKind::kHost: return "host";
    case CpuStepKind::kConv: return "conv";
    case CpuStepKind::kMatMul: return "matmul";
    case CpuStepKind::kPool: return "pool";
    case CpuStepKind::kAttention: return "attention";
    case CpuStepKind::kNorm: return "norm";
    case CpuStepKind::kTranspose: return "transpose";
    case CpuStepKind::kBinary: return "binary";
    case CpuStepKind::kBatchMatMul: return "batch matmul";
    case CpuStepKind::kConcat: return "concat";
    case CpuStepKind::kBatchNorm: return "batch norm";
    case CpuStepKind::kDeconv: return "deconv";
    case CpuStepKind::kStft: return "stft";
    case CpuStepKind::kEltwise: return "eltwise";
    case CpuStepKind::kLstm: return "lstm";
    case CpuStepKind::kGroupNorm: return "group norm";
    case CpuStepKind::kResample: return "resample";
    case CpuStepKind::kFused: return "fused loop";
    case CpuStepKind::kRmsNorm: return "rms norm";
    case CpuStepKind::kSoftmax: return "softmax";
    case CpuStepKind::kSlice: return "slice";
    case CpuStepKind::kGru: return "gru";
  }
  return "?";
}

size_t binary_src0(const Node& n) {
  const auto& y = n.outputs[0]->type.shape;
  const auto& a = n.inputs[0]->type.shape;
  return a && y && a->static_dims() == y->static_dims() ? 0 : 1;
}

namespace {

bool f32_static(const Value* v) {
  return v && v->type.kind == Type::Kind::kTensor && v->type.dtype == DType::kFloat32 && v->type.shape &&
         v->type.shape->is_static();
}
bool f32_constant(const Value* v) { return v && v->constant && v->constant->dtype() == DType::kFloat32; }
std::vector<int64_t> dims_of(const Value* v) { return *v->type.shape->static_dims(); }
int64_t numel_of(const std::vector<int64_t>& d) {
  int64_t n = 1;
  for (int64_t x : d) n *= x;
  return n;
}

std::optional<CpuPostOp> post_op(const Node& c, const Value* chained, size_t channel);
std::vector<CpuPostOp> body_chain(const Node& n);

// A windowed node's kernel_shape (when `kernel` says it needs one), strides, dilations and pads
// give one entry per spatial dim (two for pads), as the oneDNN steps read them; a node that does not
// stays on the reference kernels, which name what is wrong (a fuzzed MaxPool with a short
// kernel_shape read past it).
bool window_attrs_fit(const Node& n, size_t sp, bool kernel) {
  const auto fits = [&](const char* name, size_t want) {
    const std::vector<int64_t> v = n.attr_ints(name);
    return n.attr(name) == nullptr || v.size() == want;
  };
  if (kernel && n.attr_ints("kernel_shape").size() != sp) return false;
  return fits("strides", sp) && fits("dilations", sp) && fits("pads", 2 * sp);
}

// The kind of primitive n becomes, if oneDNN runs it.
std::optional<CpuStepKind> primitive_kind(const Node& n) {
  const Value* x = n.inputs.empty() ? nullptr : n.inputs[0];
  if (!f32_static(x) || n.outputs.empty() || !f32_static(n.outputs[0])) return std::nullopt;
  const size_t r = dims_of(x).size();
  if (n.op == OpKind::kConv) {
    if (r < 3 || r > 5 || n.inputs.size() < 2 || !f32_constant(n.inputs[1]) || n.inputs[1]->constant->rank() != r) return std::nullopt;
    if (n.inputs.size() > 2 && n.inputs[2] && !f32_constant(n.inputs[2])) return std::nullopt;
    if (!window_attrs_fit(n, r - 2, /*kernel=*/false)) return std::nullopt;
    return CpuStepKind::kConv;
  }
  if (n.op == OpKind::kMatMul) {
    if (r < 2 || n.inputs.size() != 2 || !f32_static(n.inputs[1])) return std::nullopt;
    if (f32_constant(n.inputs[1]) && n.inputs[1]->constant->rank() == 2) return CpuStepKind::kMatMul;
    // Both operands of rank 2-6 (a vector operand's implied dim is left to the host); batch dims
    // broadcast where one side has 1.
    const std::vector<int64_t> a = dims_of(x), b = dims_of(n.inputs[1]);
    if (b.size() < 2 || r > 6 || b.size() > 6) return std::nullopt;
    for (size_t k = 3; k <= std::min(r, b.size()); ++k) {
      const int64_t p = a[r - k], q = b[b.size() - k];
      if (p != q && p != 1 && q != 1) return std::nullopt;
    }
    return CpuStepKind::kBatchMatMul;
  }
  if (n.op == OpKind::kGemm) {
    if (r != 2 || n.inputs.size() < 2 || !f32_constant(n.inputs[1]) || n.inputs[1]->constant->rank() != 2) return std::nullopt;
    if (n.attr_int("transA", 0) != 0 || n.attr_float("alpha", 1.f) != 1.f) return std::nullopt;
    if (n.inputs.size() > 2 && n.inputs[2]) {
      // C as one row broadcast over the rows ([N] or [1, N]); a column or a full matrix stays on the host.
      const int64_t cols = dims_of(n.outputs[0])[1];
      if (n.attr_float("beta", 1.f) != 1.f || !f32_constant(n.inputs[2])) return std::nullopt;
      const std::vector<int64_t>& cd = n.inputs[2]->constant->dims();
      if (!(cd == std::vector<int64_t>{cols} || cd == std::vector<int64_t>{1, cols})) return std::nullopt;
    }
    return CpuStepKind::kMatMul;
  }
  if (n.op == OpKind::kAttention) {
    // Plain scaled-dot-product attention: no past KV, causal mask, sliding window, softcap or extra
    // outputs, as many KV heads as query heads, an additive float mask (or none).
    if (r != 4 || n.inputs.size() < 3 || n.inputs.size() > 4 || !f32_static(n.inputs[1]) || !f32_static(n.inputs[2])) {
      return std::nullopt;
    }
    for (size_t k = 1; k < n.outputs.size(); ++k) {
      if (n.outputs[k]) return std::nullopt;
    }
    if (n.attr_int("is_causal", 0) != 0 || n.attr_float("softcap", 0.f) != 0.f || n.attr_int("qk_matmul_output_mode", 0) != 0 ||
        n.attr_int("left_window_size", -1) != -1 || n.attr_int("right_window_size", -1) != -1) {
      return std::nullopt;  // ... or a sliding window (ONNX 1.23's left/right_window_size)
    }
    const std::vector<int64_t> q = dims_of(x), k = dims_of(n.inputs[1]), v = dims_of(n.inputs[2]);
    if (k.size() != 4 || v.size() != 4 || q[0] != k[0] || q[1] != k[1] || v[1] != k[1] || k[2] != v[2] || q[3] != k[3]) {
      return std::nullopt;
    }
    if (n.inputs.size() == 4 && n.inputs[3]) {
      const Value* m = n.inputs[3];
      if (!f32_static(m)) return std::nullopt;
      std::vector<int64_t> md = dims_of(m);
      if (md.size() > 4) return std::nullopt;
      md.insert(md.begin(), 4 - md.size(), 1);
      const std::vector<int64_t> s = {q[0], q[1], q[2], k[2]};
      for (size_t i = 0; i < 4; ++i) {
        if (md[i] != 1 && md[i] != s[i]) return std::nullopt;
      }
      // A last dim shorter than the keys' is padding (the keys past it masked), not a broadcast:
      // the reference kernels do that.
      if (md[3] != s[3]) return std::nullopt;
    }
    return CpuStepKind::kAttention;
  }
  if (n.op == OpKind::kAdd || n.op == OpKind::kSub || n.op == OpKind::kMul || n.op == OpKind::kDiv) {
    // One input of the output's dims, the other of the same dims, one element, or one per channel
    // (dim 1): the broadcasts oneDNN's binary kernels take (others run its reference loops, slower
    // than kiln's own); not the same value twice; Sub and Div only with the full one first.
    if (n.inputs.size() != 2 || !f32_static(n.inputs[1]) || n.inputs[0] == n.inputs[1] || r < 1 || r > 6) return std::nullopt;
    const std::vector<int64_t> y = dims_of(n.outputs[0]);
    const size_t s0 = binary_src0(n);
    if (dims_of(n.inputs[s0]) != y || (s0 == 1 && (n.op == OpKind::kSub || n.op == OpKind::kDiv))) return std::nullopt;
    std::vector<int64_t> od = dims_of(n.inputs[1 - s0]);
    if (od.size() > y.size()) return std::nullopt;
    od.insert(od.begin(), y.size() - od.size(), 1);
    bool per_channel = y.size() >= 2;
    int64_t count = 1;
    for (size_t k = 0; k < y.size(); ++k) {
      per_channel = per_channel && (k == 1 ? od[k] == y[k] : od[k] == 1);
      count *= od[k];
    }
    if (od != y && count != 1 && !per_channel) return std::nullopt;
    return CpuStepKind::kBinary;
  }
  if (n.op == OpKind::kSTFT) {
    // A real signal ([batch, length] or [batch, length, 1]) whose frame step and length are
    // constants and whose window is a constant or absent: the frames times a basis known at build.
    const std::vector<int64_t> xd = dims_of(x);
    if (!(r == 2 || (r == 3 && xd[2] == 1))) return std::nullopt;
    auto constant_int = [&](size_t i) -> std::optional<int64_t> {
      const Value* v = i < n.inputs.size() ? n.inputs[i] : nullptr;
      if (!v || !v->constant || v->constant->numel() != 1) return std::nullopt;
      if (v->constant->dtype() != DType::kInt64 && v->constant->dtype() != DType::kInt32) return std::nullopt;
      return v->constant->as_int(0);
    };
    const std::optional<int64_t> step = constant_int(1);
    const Value* w = n.inputs.size() > 2 ? n.inputs[2] : nullptr;
    if (!step || *step <= 0 || (w && (!f32_constant(w) || w->constant->rank() != 1))) return std::nullopt;
    const bool given = n.inputs.size() > 3 && n.inputs[3];
    const std::optional<int64_t> flen = given ? constant_int(3) : std::optional<int64_t>(w ? w->constant->numel() : xd[1]);
    if (!flen || *flen <= 0 || *flen > xd[1] || (w && w->constant->numel() != *flen)) return std::nullopt;
    const int64_t bins = n.attr_int("onesided", 1) != 0 ? *flen / 2 + 1 : *flen;
    if (dims_of(n.outputs[0]) != std::vector<int64_t>{xd[0], (xd[1] - *flen) / *step + 1, bins, 2}) return std::nullopt;
    // The basis is 2 x bins x frame_length floats: a frame of a whole long signal stays on the host.
    if (xd[0] == 0 || 2 * bins * *flen > (int64_t(1) << 26)) return std::nullopt;
    return CpuStepKind::kStft;
  }
  if (n.op == OpKind::kGroupNormalization || n.op == OpKind::kInstanceNormalization) {
    // Scale and bias constant, per channel (or, GroupNormalization's opset-18 form, per group).
    if (r < 2 || r > 6 || n.inputs.size() != 3 || !f32_constant(n.inputs[1]) || !f32_constant(n.inputs[2])) return std::nullopt;
    const int64_t c = dims_of(x)[1];
    const int64_t groups = n.op == OpKind::kInstanceNormalization ? c : n.attr_int("num_groups", 0);
    if (groups < 1 || c % groups != 0 || numel_of(dims_of(x)) == 0) return std::nullopt;
    for (size_t k = 1; k < 3; ++k) {
      const Tensor& t = *n.inputs[k]->constant;
      if (t.rank() != 1 || (t.numel() != c && (n.op == OpKind::kInstanceNormalization || t.numel() != groups))) {
        return std::nullopt;
      }
    }
    return CpuStepKind::kGroupNorm;
  }
  if (n.op == OpKind::kSoftmax || n.op == OpKind::kLogSoftmax) {
    const int64_t axis = n.attr_int("axis", -1);
    if (r < 1 || r > 6 || axis < -int64_t(r) || axis >= int64_t(r) || numel_of(dims_of(x)) == 0) return std::nullopt;
    return CpuStepKind::kSoftmax;
  }
  if (n.op == OpKind::kSlice) {
    if (r < 1 || r > 6 || n.inputs.size() < 3 || numel_of(dims_of(n.outputs[0])) == 0) return std::nullopt;
    for (size_t k = 1; k < n.inputs.size(); ++k) {
      const Value* v = n.inputs[k];
      if (k >= 3 && !v) continue;
      if (!v || !v->constant || (v->constant->dtype() != DType::kInt64 && v->constant->dtype() != DType::kInt32)) return std::nullopt;
      if (k == 4) {
        for (int64_t i = 0; i < v->constant->numel(); ++i) {
          if (v->constant->as_int(i) != 1) return std::nullopt;
        }
      }
    }
    return CpuStepKind::kSlice;
  }
  if (n.op == OpKind::kRMSNormalization) {
    // Over the last axis, by a constant scale of that axis (an LLM's [hidden]).
    const int64_t axis = n.attr_int("axis", -1);
    if (r < 1 || (axis != -1 && axis != int64_t(r) - 1) || n.inputs.size() != 2 || !f32_constant(n.inputs[1])) return std::nullopt;
    const std::vector<int64_t>& sd = n.inputs[1]->constant->dims();
    if (sd.empty() || sd.back() != dims_of(x).back() || numel_of(sd) != sd.back() || numel_of(dims_of(x)) == 0) return std::nullopt;
    return CpuStepKind::kRmsNorm;
  }
  if (n.op == OpKind::kResize) {
    // The spatial dims only (batch and channel kept), scales constant or absent (sizes: the output
    // dims), no antialiasing; linear with half-pixel centres (oneDNN's), or nearest by whole factors
    // with asymmetric floor (then oneDNN's rounding picks the same pixels).
    if (r < 3 || r > 5 || n.has_attr("axes") || n.attr_int("antialias", 0) != 0 || n.attr_int("exclude_outside", 0) != 0 ||
        n.attr_string("keep_aspect_ratio_policy", "stretch") != "stretch") {  // others map through one shared scale
      return std::nullopt;
    }
    const std::vector<int64_t> xd = dims_of(x), yd = dims_of(n.outputs[0]);
    if (yd[0] != xd[0] || yd[1] != xd[1] || numel_of(xd) == 0 || numel_of(yd) == 0) return std::nullopt;
    const Value* scales = n.inputs.size() > 2 ? n.inputs[2] : nullptr;
    if (scales && scales->constant && scales->constant->numel() > 0) {
      // oneDNN maps pixels back through the ratio of the dims, ONNX through the given scale: the
      // same only where the scale times the input is the output exactly.
      if (scales->constant->dtype() != DType::kFloat32 || scales->constant->numel() != int64_t(r)) return std::nullopt;
      for (size_t k = 0; k < r; ++k) {
        if (scales->constant->as_double(int64_t(k)) * double(xd[k]) != double(yd[k])) return std::nullopt;
      }
    } else if (scales && !scales->constant) {
      return std::nullopt;
    }
    const std::string mode = n.attr_string("mode", "nearest");
    const std::string ctm = n.attr_string("coordinate_transformation_mode", "half_pixel");
    if (mode == "linear") {
      if (ctm != "half_pixel" && ctm != "pytorch_half_pixel") return std::nullopt;
      for (size_t k = 2; k < r; ++k) {
        if (ctm == "pytorch_half_pixel" && yd[k] <= 1) return std::nullopt;
      }
      return CpuStepKind::kResample;
    }
    if (mode == "nearest" && ctm == "asymmetric" && n.attr_string("nearest_mode", "round_prefer_floor") == "floor") {
      for (size_t k = 2; k < r; ++k) {
        if (yd[k] % xd[k] != 0) return std::nullopt;
      }
      return CpuStepKind::kResample;
    }
    return std::nullopt;
  }
  if (n.op == OpKind::kLSTM || n.op == OpKind::kGRU) {
    // What oneDNN's LSTM and GRU compute: layout 0 ([seq, batch, input]), constant W, R and B, no
    // sequence lengths or peepholes, the default activations, no clip, uncoupled gates.
    const bool lstm = n.op == OpKind::kLSTM;
    const int64_t gates = lstm ? 4 : 3, states = lstm ? 2 : 1;
    if (r != 3 || n.inputs.size() < 3 || !f32_constant(n.inputs[1]) || !f32_constant(n.inputs[2])) return std::nullopt;
    const std::string dir = n.attr_string("direction", "forward");
    if (dir != "forward" && dir != "reverse" && dir != "bidirectional") return std::nullopt;
    const int64_t dirs = dir == "bidirectional" ? 2 : 1, h = n.attr_int("hidden_size", 0);
    const std::vector<int64_t> xd = dims_of(x);
    if (h <= 0 || numel_of(xd) == 0 || n.inputs[1]->constant->dims() != std::vector<int64_t>{dirs, gates * h, xd[2]} ||
        n.inputs[2]->constant->dims() != std::vector<int64_t>{dirs, gates * h, h}) {
      return std::nullopt;
    }
    if (n.inputs.size() > 3 && n.inputs[3] &&
        (!f32_constant(n.inputs[3]) || n.inputs[3]->constant->dims() != std::vector<int64_t>{dirs, 2 * gates * h})) {
      return std::nullopt;
    }
    if ((n.inputs.size() > 4 && n.inputs[4]) || n.inputs.size() > size_t(5 + states + (lstm ? 1 : 0)) ||
        (lstm && n.inputs.size() > 7 && n.inputs[7])) {
      return std::nullopt;
    }
    for (size_t k = 5; k < size_t(5 + states) && k < n.inputs.size(); ++k) {
      if (n.inputs[k] && (!f32_static(n.inputs[k]) || dims_of(n.inputs[k]) != std::vector<int64_t>{dirs, xd[1], h})) {
        return std::nullopt;
      }
    }
    if (n.has_attr("activations")) {
      const std::vector<std::string> a = n.attr_strings("activations");
      for (size_t k = 0; k < a.size(); ++k) {
        if (a[k] != (k % size_t(lstm ? 3 : 2) == 0 ? "Sigmoid" : "Tanh")) return std::nullopt;
      }
    }
    if (n.attr_float("clip", 0.f) != 0.f || n.attr_int("input_forget", 0) != 0 || n.attr_int("layout", 0) != 0) {
      return std::nullopt;
    }
    if (dims_of(n.outputs[0]) != std::vector<int64_t>{xd[0], dirs, xd[1], h}) return std::nullopt;
    return lstm ? CpuStepKind::kLstm : CpuStepKind::kGru;
  }
  if (n.op == OpKind::kConvTranspose) {
    // Explicit pads (no auto_pad, no output_shape); oneDNN's end padding is the node's less its
    // output_padding, which may go below 0 by less than a stride (ONNX's own bound on output_padding).
    if (r < 3 || r > 5 || n.inputs.size() < 2 || !f32_constant(n.inputs[1]) || n.inputs[1]->constant->rank() != r) {
      return std::nullopt;
    }
    if (n.inputs.size() > 2 && n.inputs[2] && !f32_constant(n.inputs[2])) return std::nullopt;
    if (n.attr_string("auto_pad", "NOTSET") != "NOTSET" || !n.attr_ints("output_shape").empty()) return std::nullopt;
    const size_t sp = r - 2;
    if (!window_attrs_fit(n, sp, /*kernel=*/false)) return std::nullopt;
    const std::vector<int64_t> xd = dims_of(x), yd = dims_of(n.outputs[0]), wd = n.inputs[1]->constant->dims();
    const std::vector<int64_t> st = n.attr_ints("strides", std::vector<int64_t>(sp, 1)),
                               dil = n.attr_ints("dilations", std::vector<int64_t>(sp, 1)),
                               pads = n.attr_ints("pads", std::vector<int64_t>(2 * sp, 0));
    if (st.size() != sp || dil.size() != sp || pads.size() != 2 * sp) return std::nullopt;
    for (size_t i = 0; i < sp; ++i) {
      if ((xd[2 + i] - 1) * st[i] + (wd[2 + i] - 1) * dil[i] + 1 - pads[i] - yd[2 + i] < 1 - st[i]) return std::nullopt;
    }
    return CpuStepKind::kDeconv;
  }
  if (n.op == OpKind::kBatchNormalization) {
    // Inference with constant f32 scale, bias, mean and variance of one per channel; no statistics out.
    if (r < 2 || r > 5 || n.inputs.size() != 5 || n.attr_int("training_mode", 0) != 0) return std::nullopt;
    for (size_t k = 1; k < n.outputs.size(); ++k) {
      if (n.outputs[k]) return std::nullopt;
    }
    const int64_t c = dims_of(x)[1];
    for (size_t k = 1; k < 5; ++k) {
      if (!f32_constant(n.inputs[k]) || n.inputs[k]->constant->numel() != c) return std::nullopt;
    }
    return CpuStepKind::kBatchNorm;
  }
  if (n.op == OpKind::kConcat) {
    // Every input f32 of the output's rank with elements (oneDNN takes no empty part).
    if (r > 6 || n.inputs.size() > 1024) return std::nullopt;
    for (const Value* v : n.inputs) {
      if (!f32_static(v) || dims_of(v).size() != r) return std::nullopt;
      for (int64_t e : dims_of(v)) {
        if (e == 0) return std::nullopt;
      }
    }
    return CpuStepKind::kConcat;
  }
  if (n.op == OpKind::kTranspose) return r >= 2 && r <= 6 ? std::optional(CpuStepKind::kTranspose) : std::nullopt;
  if (n.op == OpKind::kLayerNormalization) {
    const int64_t axis = n.attr_int("axis", -1);
    if (axis != -1 && axis != int64_t(r) - 1) return std::nullopt;
    for (size_t k = 1; k < n.outputs.size(); ++k) {
      if (n.outputs[k]) return std::nullopt;
    }
    const int64_t c = dims_of(x).back();
    if (n.inputs.size() < 2 || !f32_constant(n.inputs[1]) || n.inputs[1]->constant->numel() != c) return std::nullopt;
    if (n.inputs.size() > 2 && n.inputs[2] && (!f32_constant(n.inputs[2]) || n.inputs[2]->constant->numel() != c)) {
      return std::nullopt;
    }
    return CpuStepKind::kNorm;
  }
  const bool max_pool = n.op == OpKind::kMaxPool, avg_pool = n.op == OpKind::kAveragePool;
  if (max_pool || avg_pool || n.op == OpKind::kGlobalAveragePool || n.op == OpKind::kGlobalMaxPool) {
    if (r < 3 || r > 5) return std::nullopt;
    if ((max_pool || avg_pool) && !window_attrs_fit(n, r - 2, /*kernel=*/true)) return std::nullopt;
    if (max_pool && ((n.outputs.size() > 1 && n.outputs[1]) || n.attr_int("storage_order", 0) != 0)) return std::nullopt;
    // oneDNN's averages divide by the window inside the (explicit) padding only; the window that
    // ceil_mode adds past the end would count differently.
    if (avg_pool && n.attr_int("ceil_mode", 0) != 0) return std::nullopt;
    if (avg_pool && !n.attr_ints("dilations").empty()) {
      for (int64_t d : n.attr_ints("dilations")) {
        if (d != 1) return std::nullopt;
      }
    }
    return CpuStepKind::kPool;
  }
  if (r >= 1 && r <= 6 && numel_of(dims_of(x)) > 0) {
    if (n.op == OpKind::kFusedElementwise) {
      if (!body_chain(n).empty()) return CpuStepKind::kEltwise;
      return FusedKernel::supported(n) ? std::optional(CpuStepKind::kFused) : std::nullopt;
    }
    auto e = post_op(n, x, 1);
    if (e && e->kind != CpuPostKind::kAdd) return CpuStepKind::kEltwise;
  }
  return std::nullopt;
}

// A constant scalar input (or `dflt` when omitted); nullopt when it is not a constant.
std::optional<float> scalar_input(const Node& n, size_t i, float dflt) {
  if (i >= n.inputs.size() || !n.inputs[i]) return dflt;
  const Value* v = n.inputs[i];
  if (!v->constant || v->constant->numel() != 1) return std::nullopt;
  return float(v->constant->as_double(0));
}

// Whether `operand` can be added to a primitive's result `dst` as a oneDNN binary post-op: the same
// dims, or (right-aligned) 1 everywhere but the channel dim `channel` of dst.
bool addable(const Value* operand, const std::vector<int64_t>& dst, size_t channel) {
  if (!f32_static(operand)) return false;
  std::vector<int64_t> od = dims_of(operand);
  if (od.size() > dst.size()) return false;
  od.insert(od.begin(), dst.size() - od.size(), 1);
  if (od == dst) return true;
  for (size_t k = 0; k < dst.size(); ++k) {
    if (od[k] != 1 && !(k == channel && od[k] == dst[k])) return false;
  }
  return true;
}

// c as a post-op on `chained` (its input, the primitive's result so far), if oneDNN has one.
std::optional<CpuPostOp> post_op(const Node& c, const Value* chained, size_t channel) {
  if (c.outputs.size() != 1 || !f32_static(c.outputs[0]) || !f32_static(chained)) return std::nullopt;
  if (dims_of(c.outputs[0]) != dims_of(chained) || c.inputs.empty()) return std::nullopt;
  if (c.inputs[0] != chained && !(c.op == OpKind::kAdd && c.inputs.size() == 2 && c.inputs[1] == chained)) return std::nullopt;
  CpuPostOp p;
  auto kind = [&](CpuPostKind k, float a = 0, float b = 0) {
    p.kind = k;
    p.alpha = a;
    p.beta = b;
    return p;
  };
  switch (c.op) {
    case OpKind::kRelu: return kind(CpuPostKind::kRelu);
    case OpKind::kLeakyRelu: return kind(CpuPostKind::kLeakyRelu, c.attr_float("alpha", 0.01f));
    case OpKind::kClip: {
      auto lo = scalar_input(c, 1, -FLT_MAX), hi = scalar_input(c, 2, FLT_MAX);
      if (!lo || !hi) return std::nullopt;
      return kind(CpuPostKind::kClip, *lo, *hi);
    }
    case OpKind::kSigmoid: return kind(CpuPostKind::kSigmoid);
    case OpKind::kTanh: return kind(CpuPostKind::kTanh);
    case OpKind::kElu: return kind(CpuPostKind::kElu, c.attr_float("alpha", 1.f));
    case OpKind::kHardSigmoid: return kind(CpuPostKind::kHardSigmoid, c.attr_float("alpha", 0.2f), c.attr_float("beta", 0.5f));
    case OpKind::kHardSwish: return kind(CpuPostKind::kHardSwish);
    case OpKind::kGelu: {
      const std::string a = c.attr_string("approximate", "none");
      if (a != "none" && a != "tanh") return std::nullopt;
      return kind(a == "tanh" ? CpuPostKind::kGeluTanh : CpuPostKind::kGeluErf);
    }
    case OpKind::kSwish: return kind(CpuPostKind::kSwish, c.attr_float("alpha", 1.f));
    case OpKind::kSoftplus: return kind(CpuPostKind::kSoftplus);
    case OpKind::kMish: return kind(CpuPostKind::kMish);
    case OpKind::kPow: {
      if (c.inputs.size() != 2 || c.inputs[0] != chained) return std::nullopt;
      auto e = scalar_input(c, 1, 1.f);
      if (!e || !c.inputs[1]) return std::nullopt;
      return kind(CpuPostKind::kPow, 1.f, *e);
    }
    case OpKind::kAdd: {
      if (c.inputs.size() != 2 || c.inputs[0] == c.inputs[1]) return std::nullopt;
      const Value* other = c.inputs[0] == chained ? c.inputs[1] : c.inputs[0];
      if (!addable(other, dims_of(chained), channel)) return std::nullopt;
      return kind(CpuPostKind::kAdd);
    }
    default: return std::nullopt;
  }
}

// {Sigmoid, Mul} of Mul(x, Sigmoid(x)) when x's only readers are those two, the Sigmoid's only
// reader is the Mul, and all are f32 of one static shape; else {null, null}.
std::pair<const Node*, const Node*> silu(const Value* x, std::unordered_map<const Value*, int>& readers,
                                         const std::unordered_map<const Value*, std::vector<const Node*>>& node_readers) {
  auto it = node_readers.find(x);
  if (readers[x] != 2 || it == node_readers.end() || it->second.size() != 2) return {};
  const Node *sig = it->second[0], *mul = it->second[1];
  if (sig->op != OpKind::kSigmoid) std::swap(sig, mul);
  if (sig->op != OpKind::kSigmoid || mul->op != OpKind::kMul || sig->inputs.size() != 1 || mul->inputs.size() != 2) {
    return {};
  }
  const Value* s = sig->outputs[0];
  if (!((mul->inputs[0] == x && mul->inputs[1] == s) || (mul->inputs[1] == x && mul->inputs[0] == s))) return {};
  if (readers[s] != 1 || !f32_static(x) || !f32_static(s) || !f32_static(mul->outputs[0])) return {};
  if (dims_of(s) != dims_of(x) || dims_of(mul->outputs[0]) != dims_of(x)) return {};
  return {sig, mul};
}

}  // namespace

namespace {

// A one-input FusedElementwise body as elementwise ops in turn (empty when it is not such a chain):
// each node is a post-op-able unary op of the value so far, or Sigmoid(v) then Mul of v and it (a
// swish), and the body returns the last.
std::vector<CpuPostOp> body_chain(const Node& n) {
  const Graph* body = n.attr_graph("body");
  if (!body || n.inputs.size() != 1 || body->inputs.size() != 1 || body->outputs.size() != 1) return {};
  std::vector<CpuPostOp> ops;
  const Value* cur = body->inputs[0];
  for (size_t k = 0; k < body->nodes.size(); ++k) {
    const Node& b = *body->nodes[k];
    if (b.op == OpKind::kSigmoid && k + 1 < body->nodes.size() && !b.inputs.empty() && b.inputs[0] == cur) {
      const Node& m = *body->nodes[k + 1];
      const Value* sig = b.outputs[0];
      if (m.op == OpKind::kMul && m.inputs.size() == 2 &&
          ((m.inputs[0] == cur && m.inputs[1] == sig) || (m.inputs[0] == sig && m.inputs[1] == cur)) &&
          f32_static(m.outputs[0]) && f32_static(cur) && dims_of(m.outputs[0]) == dims_of(cur)) {
        CpuPostOp p;
        p.kind = CpuPostKind::kSwish;
        p.alpha = 1;
        ops.push_back(p);
        cur = m.outputs[0];
        ++k;
        continue;
      }
    }
    auto e = post_op(b, cur, 1);
    if (!e || e->kind == CpuPostKind::kAdd) return {};
    ops.push_back(*e);
    cur = b.outputs[0];
  }
  if (ops.empty() || body->outputs[0] != cur) return {};
  return ops;
}

}  // namespace

std::vector<CpuPostOp> eltwise_ops(const Node& n) {
  if (n.inputs.empty()) return {};
  if (n.op == OpKind::kFusedElementwise) return body_chain(n);
  auto e = post_op(n, n.inputs[0], 1);
  if (!e || e->kind == CpuPostKind::kAdd) return {};
  return {*e};
}

Expected<CpuPlan> plan_fast_cpu(const Plan& p, bool deterministic) {
  const Graph& g = *p.graph;
  // Who reads each top-level value, counting subgraph bodies' reads and graph outputs.
  std::unordered_map<const Value*, int> readers;
  std::unordered_map<const Value*, const Node*> direct_reader;
  std::unordered_map<const Value*, std::vector<const Node*>> node_readers;
  for (const auto& n : g.nodes) {
    std::vector<const Value*> read;
    values_read(g, *n, read);
    for (const Value* v : read) readers[v]++;
    for (const Value* v : n->inputs) {
      if (v) direct_reader[v] = n.get();
      if (v) node_readers[v].push_back(n.get());
    }
  }
  for (const Value* o : g.outputs) readers[o] += 2;
  std::unordered_map<const Node*, uint32_t> node_index;
  for (size_t i = 0; i < g.nodes.size(); ++i) node_index[g.nodes[i].get()] = uint32_t(i);
  std::unordered_map<const Value*, ValueRef> refs;
  for (size_t i = 0; i < g.inputs.size(); ++i) refs[g.inputs[i]] = p.inputs[i];
  for (const PlanStep& s : p.steps) {
    const Node& n = *g.nodes[s.node];
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      if (n.outputs[k]) refs[n.outputs[k]] = s.outputs[k];
    }
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      if (n.inputs[k]) refs[n.inputs[k]] = s.inputs[k];
    }
  }

  // Groups: a primitive's node and the post-ops it absorbs, emitted at the last one's step.
  std::vector<int64_t> group_of(g.nodes.size(), -1);  // node -> group
  std::vector<CpuStep> groups;
  std::vector<uint32_t> group_last;
  for (size_t i = 0; i < p.steps.size(); ++i) {
    const Node& n = *g.nodes[p.steps[i].node];
    if (group_of[p.steps[i].node] >= 0) continue;
    auto kind = primitive_kind(n);
    if (!kind) continue;
    // oneDNN's batch-normalization statistics split a group's sums across threads when there are
    // fewer groups than threads: the result depends on the thread count.
    if (deterministic && *kind == CpuStepKind::kGroupNorm) continue;
    if (*kind == CpuStepKind::kLstm || *kind == CpuStepKind::kGru) {  // it writes Y alone: Y_h and Y_c unread
      bool states_read = false;
      for (size_t k = 1; k < n.outputs.size(); ++k) states_read |= n.outputs[k] && readers[n.outputs[k]] > 0;
      if (states_read) continue;
    }
    CpuStep st;
    st.kind = *kind;
    st.index = p.steps[i].node;
    st.reads = p.steps[i].inputs;
    const size_t channel = *kind == CpuStepKind::kMatMul ? dims_of(n.outputs[0]).size() - 1 : 1;
    const Value* cur = n.outputs[0];
    uint32_t last = st.index;
    group_of[st.index] = int64_t(groups.size());
    const bool batch_norm = *kind == CpuStepKind::kBatchNorm;
    const bool eltwise_only = *kind == CpuStepKind::kStft || *kind == CpuStepKind::kEltwise ||
                              *kind == CpuStepKind::kGroupNorm;  // post-ops without operands
    const bool epilogue = *kind == CpuStepKind::kConv || *kind == CpuStepKind::kMatMul || *kind == CpuStepKind::kPool ||
                          *kind == CpuStepKind::kBinary || *kind == CpuStepKind::kDeconv || batch_norm || eltwise_only;
    while (epilogue) {
      // A batch norm takes one Relu (its fuse-relu flag), nothing else.
      if (batch_norm) {
        if (readers[cur] != 1 || !direct_reader.count(cur) || !st.post.empty()) break;
        const Node* c = direct_reader[cur];
        if (group_of[node_index.at(c)] >= 0 || c->op != OpKind::kRelu) break;
        auto po = post_op(*c, cur, channel);
        if (!po) break;
        po->node = node_index.at(c);
        st.post.push_back(*po);
        group_of[po->node] = int64_t(groups.size());
        last = po->node;
        cur = c->outputs[0];
        continue;
      }
      // SiLU as exporters write it, Mul(x, Sigmoid(x)) (EfficientNet, YOLO, UNets): one swish post-op.
      if (auto [sig, mul] = silu(cur, readers, node_readers);
          mul && group_of[node_index.at(sig)] < 0 && group_of[node_index.at(mul)] < 0) {
        CpuPostOp po;
        po.kind = CpuPostKind::kSwish;
        po.alpha = 1;
        po.node = node_index.at(mul);
        st.post.push_back(po);
        group_of[node_index.at(sig)] = group_of[po.node] = int64_t(groups.size());
        last = po.node;
        cur = mul->outputs[0];
        continue;
      }
      if (readers[cur] != 1 || !direct_reader.count(cur)) break;
      const Node* c = direct_reader[cur];
      if (group_of[node_index.at(c)] >= 0) break;  // taken by an earlier primitive as its operand's reader
      // A fused chain of unary ops (SiLU as fuse-elementwise leaves it): each of its ops a post-op.
      if (c->op == OpKind::kFusedElementwise && c->inputs.size() == 1 && c->inputs[0] == cur && f32_static(c->outputs[0]) &&
          dims_of(c->outputs[0]) == dims_of(cur)) {
        std::vector<CpuPostOp> chain = body_chain(*c);
        if (chain.empty()) break;
        for (CpuPostOp& po : chain) {
          po.node = node_index.at(c);
          st.post.push_back(po);
        }
        group_of[node_index.at(c)] = int64_t(groups.size());
        last = node_index.at(c);
        cur = c->outputs[0];
        continue;
      }
      auto po = post_op(*c, cur, channel);
      if (!po || (eltwise_only && po->kind == CpuPostKind::kAdd)) break;
      po->node = node_index.at(c);
      if (po->kind == CpuPostKind::kAdd) {
        const Value* other = c->inputs[0] == cur ? c->inputs[1] : c->inputs[0];
        po->operand = int32_t(st.reads.size());
        st.reads.push_back(refs.at(other));
      }
      st.post.push_back(*po);
      group_of[po->node] = int64_t(groups.size());
      last = po->node;
      cur = c->outputs[0];
    }
    st.out = refs.at(cur);
    groups.push_back(std::move(st));
    group_last.push_back(last);
  }

  CpuPlan cp;
  std::vector<ValueRef> out_of_step;
  for (size_t i = 0; i < p.steps.size(); ++i) {
    const uint32_t node = p.steps[i].node;
    const int64_t gi = group_of[node];
    if (gi < 0) {
      CpuStep st;
      st.kind = CpuStepKind::kHost;
      st.index = uint32_t(i);
      cp.steps.push_back(std::move(st));
    } else if (group_last[size_t(gi)] == node) {
      cp.steps.push_back(groups[size_t(gi)]);
    }
  }

  // What each step reads: a host step every value its node and its subgraph bodies read, and the
  // slots its plan step released.
  auto step_reads = [&](const CpuStep& s) {
    std::vector<uint32_t> r;
    if (s.kind == CpuStepKind::kHost) {
      const PlanStep& ps = p.steps[s.index];
      std::vector<const Value*> read;
      values_read(g, *g.nodes[ps.node], read);
      for (const Value* v : read) {
        auto it = refs.find(v);
        if (it != refs.end() && it->second.kind == ValueRef::Kind::kSlot) r.push_back(it->second.index);
      }
      r.insert(r.end(), ps.frees.begin(), ps.frees.end());  // its own outputs no step reads
    } else {
      for (const ValueRef& v : s.reads) {
        if (v.kind == ValueRef::Kind::kSlot) r.push_back(v.index);
      }
      if (s.out.kind == ValueRef::Kind::kSlot) r.push_back(s.out.index);  // released at once when unread
    }
    return r;
  };
  // Layouts: oneDNN's own only where every reader is a convolution or pooling taking it as its
  // source or as a post-op operand.
  std::vector<char> plain_needed(p.slots, 0);
  for (const ValueRef& o : p.outputs) {
    if (o.kind == ValueRef::Kind::kSlot) plain_needed[o.index] = 1;
  }
  std::vector<int64_t> last(p.slots, -1);
  for (size_t i = 0; i < cp.steps.size(); ++i) {
    const CpuStep& s = cp.steps[i];
    for (uint32_t slot : step_reads(s)) last[slot] = int64_t(i);
    if (s.kind == CpuStepKind::kHost) {
      for (uint32_t slot : step_reads(s)) plain_needed[slot] = 1;
      continue;
    }
    const bool binary = s.kind == CpuStepKind::kBinary;
    const bool takes_library = s.kind == CpuStepKind::kConv || s.kind == CpuStepKind::kPool || binary ||
                               s.kind == CpuStepKind::kConcat || s.kind == CpuStepKind::kBatchNorm ||
                               s.kind == CpuStepKind::kDeconv;
    const bool every_input = s.kind == CpuStepKind::kConcat;
    const size_t src = binary ? binary_src0(*g.nodes[s.index]) : 0;
    for (size_t k = 0; k < s.reads.size(); ++k) {
      const ValueRef& v = s.reads[k];
      const bool operand = k >= g.nodes[s.index]->inputs.size();
      if (v.kind == ValueRef::Kind::kSlot && !(takes_library && (k == src || operand || every_input))) {
        plain_needed[v.index] = 1;
      }
    }
  }
  for (CpuStep& s : cp.steps) {
    const bool library_out = s.kind == CpuStepKind::kConv || s.kind == CpuStepKind::kPool ||
                             s.kind == CpuStepKind::kBinary || s.kind == CpuStepKind::kConcat ||
                             s.kind == CpuStepKind::kBatchNorm || s.kind == CpuStepKind::kDeconv;
    if (library_out && s.out.kind == ValueRef::Kind::kSlot &&
        !plain_needed[s.out.index]) {
      s.out_layout = CpuLayout::kLibrary;
    }
  }
  for (const ValueRef& o : p.outputs) {
    if (o.kind == ValueRef::Kind::kSlot) last[o.index] = int64_t(cp.steps.size());
  }
  for (uint32_t slot = 0; slot < p.slots; ++slot) {
    if (last[slot] >= 0 && size_t(last[slot]) < cp.steps.size()) cp.steps[size_t(last[slot])].frees.push_back(slot);
  }
  return cp;
}

namespace {

void put_ref(ByteWriter& w, const ValueRef& r) {
  w.u8(uint8_t(r.kind));
  w.u32(r.index);
}

ValueRef get_ref(ByteReader& r) {
  ValueRef v;
  uint8_t k = r.get_in<uint8_t>("a value reference's kind", 0, uint8_t(ValueRef::Kind::kConstant));
  v.kind = ValueRef::Kind(k);
  v.index = r.get<uint32_t>("a value reference");
  return v;
}

}  // namespace

std::string write_cpu_plan(const CpuPlan& cp) {
  ByteWriter w;
  w.u32(uint32_t(cp.steps.size()));
  for (const CpuStep& s : cp.steps) {
    w.u8(uint8_t(s.kind));
    w.u32(s.index);
    w.u32(uint32_t(s.post.size()));
    for (const CpuPostOp& po : s.post) {
      w.u8(uint8_t(po.kind));
      w.put(po.alpha);
      w.put(po.beta);
      w.u32(po.node);
      w.put(po.operand);
    }
    w.u32(uint32_t(s.reads.size()));
    for (const ValueRef& r : s.reads) put_ref(w, r);
    put_ref(w, s.out);
    w.u8(uint8_t(s.out_layout));
    w.vec(s.frees);
  }
  return std::move(w.bytes());
}

Expected<CpuPlan> read_cpu_plan(std::string_view bytes, const Plan& p, const std::string& name, bool deterministic) {
  auto err = [&](const std::string& what) { return KILN_ERROR(kInvalidModel, "{}: CPUF section: {}", name, what); };
  ByteReader r(bytes, "CPUF section");
  CpuPlan cp;
  const uint32_t n = r.count("the step count", 16);
  for (uint32_t i = 0; i < n && r.ok(); ++i) {
    CpuStep s;
    s.kind = CpuStepKind(r.get_in<uint8_t>("a step kind", 0, uint8_t(CpuStepKind::kGru)));
    s.index = r.get<uint32_t>("a step's index");
    const uint32_t npost = r.get_in<uint32_t>("the post-op count", 0, 64);
    for (uint32_t k = 0; k < npost && r.ok(); ++k) {
      CpuPostOp po;
      po.kind = CpuPostKind(r.get_in<uint8_t>("a post-op kind", 0, kCpuPostKindLast));
      po.alpha = r.get<float>("a post-op parameter");
      po.beta = r.get<float>("a post-op parameter");
      po.node = r.get<uint32_t>("a post-op's node");
      po.operand = r.get<int32_t>("a post-op's operand");
      s.post.push_back(po);
    }
    const uint32_t nreads = r.get_in<uint32_t>("the read count", 0, 1024);
    for (uint32_t k = 0; k < nreads && r.ok(); ++k) s.reads.push_back(get_ref(r));
    s.out = get_ref(r);
    s.out_layout = CpuLayout(r.get_in<uint8_t>("a layout", 0, uint8_t(CpuLayout::kLibrary)));
    s.frees = r.vec<uint32_t>("the released slots");
    cp.steps.push_back(std::move(s));
  }
  if (!r.ok()) return err(r.failed());
  if (r.left() != 0) return err("bytes after the last step");
  // The plan is a function of the host plan: every choice in it (which nodes fuse, which layouts)
  // follows from the graph. So the section must be exactly the plan this kiln makes for this graph;
  // anything else is damage (or a file from another kiln) and would run wrong operands.
  KILN_ASSIGN_OR_RETURN(CpuPlan want, plan_fast_cpu(p, deterministic));
  if (want.steps.size() != cp.steps.size()) {
    return err(fmt::format("{} steps where this graph's plan has {}: a damaged file, or one from another kiln (rebuild it)",
                           cp.steps.size(), want.steps.size()));
  }
  for (size_t i = 0; i < cp.steps.size(); ++i) {
    if (!(cp.steps[i] == want.steps[i])) {
      return err(fmt::format("step {} ({}) is not the plan of this graph: a damaged file, or one from another kiln (rebuild it)", i,
                             cpu_step_kind_name(cp.steps[i].kind)));
    }
  }
  return cp;
}

std::string describe_cpu_step(const CpuStep& s, const Plan& p) {
  const Graph& g = *p.graph;
  if (s.kind == CpuStepKind::kHost) return std::string(op_name(g.nodes[p.steps[s.index].node]->op));
  std::string d(op_name(g.nodes[s.index]->op));
  for (const CpuPostOp& po : s.post) d += fmt::format(" + {}", op_name(g.nodes[po.node]->op));
  return d;
}

}  // namespace kiln
