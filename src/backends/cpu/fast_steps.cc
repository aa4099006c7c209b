// The fast CPU runner's steps that are not one primitive with post-ops (fast_session.cc does
// those): attention as two products and a softmax, LayerNormalization, Transpose as a reorder,
// batched products of computed operands, Concat, BatchNormalization, STFT as a convolution,
// elementwise ops on their own, LSTM, group normalization, Resize, RMS normalization, Softmax and
// Slice.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <tuple>

#include "backends/cpu/fast_session_impl.h"
#include "ops/op_registry.h"

namespace kiln {

#if KILN_HAVE_DNNL

using namespace cpu_detail;

// Attention as oneDNN runs it: scores = Q K^T * scale (+ mask) in the step's own buffer, softmax
// over the keys in place, then scores V. K is read transposed through its strides, not copied.
Status CpuRunner::Impl::prepare_attention(size_t i) {
  const CpuStep& s = cp->steps[i];
  StepRun& run = runs[i];
  const Node& n = *plan->graph->nodes[s.index];
  const std::string at = n.describe();
  const Dims q = static_dims(n.inputs[0]), k = static_dims(n.inputs[1]), v = static_dims(n.inputs[2]);
  const Dims scores = {q[0], q[1], q[2], k[2]};
  run.out_dims = static_dims(n.outputs[0]);
  const float scale = n.attr_float("scale", 1.f / std::sqrt(float(q[3])));
  KILN_ASSIGN_OR_RETURN(Md q_md, make_md(at, q, dnnl_abcd));
  KILN_ASSIGN_OR_RETURN(Md s_md, make_md(at, scores, dnnl_abcd));
  KILN_ASSIGN_OR_RETURN(Md v_md, make_md(at, v, dnnl_abcd));
  KILN_ASSIGN_OR_RETURN(Md o_md, make_md(at, run.out_dims, dnnl_abcd));
  dnnl_memory_desc_t kt = nullptr;
  const Dims kt_dims = {k[0], k[1], k[3], k[2]}, kt_strides = {k[1] * k[2] * k[3], k[2] * k[3], 1, k[3]};
  KILN_DNNL(at, d->memory_desc_create_with_strides(&kt, 4, kt_dims.data(), dnnl_f32, kt_strides.data()));
  Md kt_md(d, kt);

  Md mask_md;
  const bool mask = s.reads.size() > 3 && s.reads[3].kind != ValueRef::Kind::kNone;
  if (mask) {
    Dims md = static_dims(n.inputs[3]);
    md.insert(md.begin(), 4 - md.size(), 1);
    KILN_ASSIGN_OR_RETURN(mask_md, make_md(at, md, dnnl_abcd));
  }
  // The scale, and the mask as a post-op of the product unless `separate_mask`.
  auto make_attr = [&](Attr& attrs, bool separate_mask) -> Status {
    KILN_RETURN_IF_ERROR(attrs.create(at));
    KILN_DNNL(at, d->post_ops_append_eltwise(attrs.po, dnnl_eltwise_linear, scale, 0.f));
    if (mask && !separate_mask) KILN_DNNL(at, d->post_ops_append_binary(attrs.po, dnnl_binary_add, mask_md.md));
    KILN_DNNL(at, d->primitive_attr_set_post_ops(attrs.attr, attrs.po));
    return Status::ok();
  };
  Attr fused(d), bare(d);
  KILN_RETURN_IF_ERROR(make_attr(fused, false));
  dnnl_primitive_attr_t attr = fused.attr;
  // A mask broadcast in a way the product's post-op kernels do not take (Swin's windows: [1, heads,
  // L, L] over windows x heads) sends the GEMM to oneDNN's reference loops, 100x slower; then the
  // mask is added by a binary step of its own between the product and the softmax.
  bool separate_mask = false;
  if (mask) {
    Pd probe(d);
    KILN_DNNL(at, d->matmul_primitive_desc_create(&probe.p, engine, q_md.md, kt_md.md, nullptr, s_md.md, attr));
    separate_mask = std::string_view(impl_name(d, probe.p)).starts_with("ref");
    if (separate_mask) {
      KILN_RETURN_IF_ERROR(make_attr(bare, true));
      attr = bare.attr;
    }
  }

  auto make = [&](auto&& create) -> Expected<dnnl_primitive_t> {
    dnnl_primitive_desc_t pd = nullptr;
    KILN_DNNL(at, create(&pd));
    if (impls[i].empty()) impls[i] = fmt::format("oneDNN {}", impl_name(d, pd));
    auto p = primitive(at, pd);
    d->primitive_desc_destroy(pd);
    return p;
  };
  run.scratch.resize(d->memory_desc_get_size(s_md.md));
  KILN_ASSIGN_OR_RETURN(dnnl_memory_t s_mem, memory(at, s_md.md, run.scratch.p.get()));
  // scores = Q K^T (scaled, masked)
  KILN_ASSIGN_OR_RETURN(dnnl_memory_t q_mem, memory(at, q_md.md));
  KILN_ASSIGN_OR_RETURN(dnnl_memory_t k_mem, memory(at, kt_md.md));
  auto qk = [&](dnnl_primitive_desc_t* pd) {
    return d->matmul_primitive_desc_create(pd, engine, q_md.md, kt_md.md, nullptr, s_md.md, attr);
  };
  KILN_ASSIGN_OR_RETURN(run.main.p, make(qk));
  run.main.args = {{DNNL_ARG_SRC, q_mem}, {DNNL_ARG_WEIGHTS, k_mem}, {DNNL_ARG_DST, s_mem}};
  run.bind = {{q_mem, 0}, {k_mem, 1}};
  if (mask) {
    KILN_ASSIGN_OR_RETURN(dnnl_memory_t m_mem, memory(at, mask_md.md));
    run.bind.push_back({m_mem, 3});
    if (separate_mask) {  // scores += mask, in place
      Prim add;
      auto binary = [&](dnnl_primitive_desc_t* pd) {
        return d->binary_primitive_desc_create(pd, engine, dnnl_binary_add, s_md.md, mask_md.md, s_md.md, nullptr);
      };
      KILN_ASSIGN_OR_RETURN(add.p, make(binary));
      add.args = {{DNNL_ARG_SRC_0, s_mem}, {DNNL_ARG_SRC_1, m_mem}, {DNNL_ARG_DST, s_mem}};
      run.after.push_back(add);
    } else {
      run.main.args.push_back({DNNL_ARG_ATTR_MULTIPLE_POST_OP(1) | DNNL_ARG_SRC_1, m_mem});
    }
  }
  // softmax over the keys, in place
  Prim sm;
  auto softmax = [&](dnnl_primitive_desc_t* pd) {
    return d->softmax_forward_primitive_desc_create(pd, engine, dnnl_forward_inference, dnnl_softmax_accurate, s_md.md,
                                                    s_md.md, 3, nullptr);
  };
  KILN_ASSIGN_OR_RETURN(sm.p, make(softmax));
  sm.args = {{DNNL_ARG_SRC, s_mem}, {DNNL_ARG_DST, s_mem}};
  run.after.push_back(sm);
  if (mask) {
    // A query row whose every key the mask sets to -inf gives zeros (the spec; the softmax made it
    // 0 / 0). Which rows: the mask's own rows, broadcast over the scores' [B, H, Sq].
    Dims md = static_dims(n.inputs[3]);
    md.insert(md.begin(), 4 - md.size(), 1);
    dnnl_memory_t m_mem = nullptr;
    for (const auto& [mem, read] : run.bind) {
      if (read == 3) m_mem = mem;
    }
    const Dims sd = scores;
    Prim masked_rows;
    masked_rows.host = [lib = d, m_mem, probs = reinterpret_cast<float*>(run.scratch.p.get()), sd, md]() {
      void* h = nullptr;
      lib->memory_get_data_handle(m_mem, &h);
      const float* m = static_cast<const float*>(h);
      // The mask's own rows (its last dim is Sk: fast_plan.cc), each checked once; a fully masked
      // one zeroes the score rows it broadcasts to.
      for (int64_t mb = 0; mb < md[0]; ++mb)
        for (int64_t mh = 0; mh < md[1]; ++mh)
          for (int64_t mi = 0; mi < md[2]; ++mi) {
            const float* row = m + ((mb * md[1] + mh) * md[2] + mi) * sd[3];
            bool all = true;
            for (int64_t j = 0; j < sd[3] && all; ++j) all = std::isinf(row[j]) && row[j] < 0;
            if (!all) continue;
            for (int64_t b = md[0] == 1 ? 0 : mb; b < (md[0] == 1 ? sd[0] : mb + 1); ++b)
              for (int64_t hh = md[1] == 1 ? 0 : mh; hh < (md[1] == 1 ? sd[1] : mh + 1); ++hh)
                for (int64_t i = md[2] == 1 ? 0 : mi; i < (md[2] == 1 ? sd[2] : mi + 1); ++i)
                  std::fill_n(probs + ((b * sd[1] + hh) * sd[2] + i) * sd[3], sd[3], 0.f);
          }
    };
    run.after.push_back(std::move(masked_rows));
  }
  // out = scores V
  Prim pv;
  KILN_ASSIGN_OR_RETURN(dnnl_memory_t v_mem, memory(at, v_md.md));
  KILN_ASSIGN_OR_RETURN(run.dst_mem, memory(at, o_md.md));
  auto sv = [&](dnnl_primitive_desc_t* pd) {
    return d->matmul_primitive_desc_create(pd, engine, s_md.md, v_md.md, nullptr, o_md.md, nullptr);
  };
  KILN_ASSIGN_OR_RETURN(pv.p, make(sv));
  pv.args = {{DNNL_ARG_SRC, s_mem}, {DNNL_ARG_WEIGHTS, v_mem}, {DNNL_ARG_DST, run.dst_mem}};
  run.bind.push_back({v_mem, 2});
  run.after.push_back(pv);
  return Status::ok();
}

// LayerNormalization over the last axis, scale and bias bound once.
Status CpuRunner::Impl::prepare_norm(size_t i) {
  const CpuStep& s = cp->steps[i];
  StepRun& run = runs[i];
  const Node& n = *plan->graph->nodes[s.index];
  const std::string at = n.describe();
  const Dims x = static_dims(n.inputs[0]);
  run.out_dims = x;
  KILN_ASSIGN_OR_RETURN(Md x_md, make_md(at, x, plain_tag(x.size())));
  KILN_ASSIGN_OR_RETURN(Md c_md, make_md(at, Dims{x.back()}, dnnl_a));
  const bool shift = s.reads.size() > 2 && s.reads[2].kind == ValueRef::Kind::kConstant;
  dnnl_primitive_desc_t pd = nullptr;
  KILN_DNNL(at, d->layer_normalization_forward_primitive_desc_create(
                    &pd, engine, dnnl_forward_inference, x_md.md, x_md.md, nullptr, n.attr_float("epsilon", 1e-5f),
                    unsigned(dnnl_use_scale) | (shift ? unsigned(dnnl_use_shift) : 0u), nullptr));
  impls[i] = fmt::format("oneDNN {}", impl_name(d, pd));
  auto p = primitive(at, pd);
  d->primitive_desc_destroy(pd);
  if (!p) return p.status();
  run.main.p = *p;
  KILN_ASSIGN_OR_RETURN(dnnl_memory_t x_mem, memory(at, x_md.md));
  KILN_ASSIGN_OR_RETURN(run.dst_mem, memory(at, x_md.md));
  auto constant = [&](size_t k) { return const_cast<void*>(plan->constants[s.reads[k].index]->constant->raw()); };
  KILN_ASSIGN_OR_RETURN(dnnl_memory_t scale_mem, memory(at, c_md.md, constant(1)));
  run.main.args = {{DNNL_ARG_SRC, x_mem}, {DNNL_ARG_DST, run.dst_mem}, {DNNL_ARG_SCALE, scale_mem}};
  if (shift) {
    KILN_ASSIGN_OR_RETURN(dnnl_memory_t shift_mem, memory(at, c_md.md, constant(2)));
    run.main.args.push_back({DNNL_ARG_SHIFT, shift_mem});
  }
  run.bind = {{x_mem, 0}};
  return Status::ok();
}

// Transpose as a reorder: the source row-major, the destination the same dims laid out so that
// memory holds the permuted tensor row-major (input dim perm[j] takes output dim j's stride).
Status CpuRunner::Impl::prepare_transpose(size_t i) {
  const CpuStep& s = cp->steps[i];
  StepRun& run = runs[i];
  const Node& n = *plan->graph->nodes[s.index];
  const std::string at = n.describe();
  const Dims x = static_dims(n.inputs[0]);
  run.out_dims = static_dims(n.outputs[0]);
  Dims perm = n.attr_ints("perm");
  if (perm.empty()) {
    for (size_t k = x.size(); k-- > 0;) perm.push_back(int64_t(k));
  }
  Dims out_strides(x.size(), 1), strides(x.size(), 0);
  for (size_t k = x.size() - 1; k-- > 0;) out_strides[k] = out_strides[k + 1] * run.out_dims[k + 1];
  for (size_t j = 0; j < perm.size(); ++j) strides[size_t(perm[j])] = out_strides[j];
  KILN_ASSIGN_OR_RETURN(Md src, make_md(at, x, plain_tag(x.size())));
  dnnl_memory_desc_t dst = nullptr;
  KILN_DNNL(at, d->memory_desc_create_with_strides(&dst, int(x.size()), x.data(), dnnl_f32, strides.data()));
  Md dst_md(d, dst);
  dnnl_memory_t in = nullptr;
  KILN_ASSIGN_OR_RETURN(run.main, reorder(at, src.md, dst_md.md, &in, &run.dst_mem));
  run.bind = {{in, 0}};
  impls[i] = "oneDNN reorder";
  return Status::ok();
}

// MatMul of two computed row-major operands, their dims right-aligned to one rank (oneDNN
// broadcasts batch dims of 1).
Status CpuRunner::Impl::prepare_batch_matmul(size_t i) {
  const CpuStep& s = cp->steps[i];
  StepRun& run = runs[i];
  const Node& n = *plan->graph->nodes[s.index];
  const std::string at = n.describe();
  Dims a = static_dims(n.inputs[0]), b = static_dims(n.inputs[1]);
  run.out_dims = static_dims(n.outputs[0]);
  const size_t r = run.out_dims.size();
  a.insert(a.begin(), r - a.size(), 1);
  b.insert(b.begin(), r - b.size(), 1);
  KILN_ASSIGN_OR_RETURN(Md a_md, make_md(at, a, plain_tag(r)));
  KILN_ASSIGN_OR_RETURN(Md b_md, make_md(at, b, plain_tag(r)));
  KILN_ASSIGN_OR_RETURN(Md c_md, make_md(at, run.out_dims, plain_tag(r)));
  Pd pd(d);
  KILN_DNNL(at, d->matmul_primitive_desc_create(&pd.p, engine, a_md.md, b_md.md, nullptr, c_md.md, nullptr));
  impls[i] = fmt::format("oneDNN {}", impl_name(d, pd.p));
  KILN_ASSIGN_OR_RETURN(run.main.p, primitive(at, pd.p));
  KILN_ASSIGN_OR_RETURN(dnnl_memory_t a_mem, memory(at, a_md.md));
  KILN_ASSIGN_OR_RETURN(dnnl_memory_t b_mem, memory(at, b_md.md));
  KILN_ASSIGN_OR_RETURN(run.dst_mem, memory(at, c_md.md));
  run.main.args = {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, run.dst_mem}};
  run.bind = {{a_mem, 0}, {b_mem, 1}};
  return Status::ok();
}

// STFT as one strided 1-D convolution: the signal [batch, 1, length] by 2 x bins filters of the
// frame's length, `step` apart (oneDNN takes no overlapping rows, so not a product of framed rows).
// Filter 2k is w[t] cos(2 pi k t / n), filter 2k + 1 is -w[t] sin(2 pi k t / n), built here once
// and reordered into the layout the convolution wants; its result, written channels-last
// ([batch, frames, 2 x bins]), is the output's [batch, frames, bins, 2] as it stands.
Status CpuRunner::Impl::prepare_stft(size_t i) {
  const CpuStep& s = cp->steps[i];
  StepRun& run = runs[i];
  const Node& n = *plan->graph->nodes[s.index];
  const std::string at = n.describe();
  const Dims x = static_dims(n.inputs[0]);
  run.out_dims = static_dims(n.outputs[0]);
  const int64_t batch = x[0], len = x[1], frames = run.out_dims[1], bins = run.out_dims[2];
  const int64_t step = n.inputs[1]->constant->as_int(0);
  const Tensor* window = n.inputs.size() > 2 && n.inputs[2] ? &*n.inputs[2]->constant : nullptr;
  const int64_t flen = n.inputs.size() > 3 && n.inputs[3] ? n.inputs[3]->constant->as_int(0) : window ? window->numel() : len;
  KILN_ASSIGN_OR_RETURN(Tensor basis, Tensor::create(DType::kFloat32, {2 * bins, 1, flen}));
  float* b = basis.data<float>();
  for (int64_t t = 0; t < flen; ++t) {
    const double w = window ? double(window->data<float>()[t]) : 1.0;
    for (int64_t k = 0; k < bins; ++k) {
      const double a = 2 * std::numbers::pi * double((k * t) % flen) / double(flen);  // exact angle for large k*t
      b[(2 * k) * flen + t] = float(w * std::cos(a));
      b[(2 * k + 1) * flen + t] = float(-w * std::sin(a));
    }
  }
  KILN_ASSIGN_OR_RETURN(Md src_md, make_md(at, {batch, 1, len}, dnnl_abc));
  KILN_ASSIGN_OR_RETURN(Md w_plain, make_md(at, {2 * bins, 1, flen}, dnnl_abc));
  KILN_ASSIGN_OR_RETURN(Md w_any, make_md(at, {2 * bins, 1, flen}, dnnl_format_tag_any));
  KILN_ASSIGN_OR_RETURN(Md dst_md, make_md(at, {batch, 2 * bins, frames}, dnnl_format_tag_any));
  KILN_ASSIGN_OR_RETURN(Md dst_plain, make_md(at, {batch, 2 * bins, frames}, dnnl_acb));
  const Dims strides = {step}, dil = {0}, pad = {0}, pad_r = {(frames - 1) * step + flen - len};
  Attr attrs(d);  // its elementwise epilogue (a power spectrum's Pow)
  KILN_RETURN_IF_ERROR(eltwise_attr(attrs, s.post, at));
  Pd pd(d);
  KILN_DNNL(at, d->convolution_forward_primitive_desc_create(&pd.p, engine, dnnl_forward_inference, dnnl_convolution_direct,
                                                             src_md.md, w_any.md, nullptr, dst_md.md, strides.data(),
                                                             dil.data(), pad.data(), pad_r.data(), attrs.attr));
  impls[i] = fmt::format("oneDNN {} (a strided convolution by the DFT basis)", impl_name(d, pd.p));
  KILN_ASSIGN_OR_RETURN(run.main.p, primitive(at, pd.p));
  const_dnnl_memory_desc_t w_want = d->primitive_desc_query_md(pd.p, dnnl_query_weights_md, 0);
  KILN_ASSIGN_OR_RETURN(dnnl_memory_t w_mem, weight(at, basis, w_plain.md, w_want));
  KILN_ASSIGN_OR_RETURN(dnnl_memory_t src_mem, memory(at, src_md.md));
  const_dnnl_memory_desc_t got = d->primitive_desc_query_md(pd.p, dnnl_query_dst_md, 0);
  KILN_ASSIGN_OR_RETURN(run.dst_mem, memory(at, got));
  KILN_RETURN_IF_ERROR(place_result(at, s, run, got, dst_plain.md));
  run.main.args = {{DNNL_ARG_SRC, src_mem}, {DNNL_ARG_WEIGHTS, w_mem}, {DNNL_ARG_DST, run.dst_mem}};
  run.bind = {{src_mem, 0}};
  return Status::ok();
}

// A unary elementwise op on its own (after a host step, or reading a graph input), or a fused chain
// of them: oneDNN's eltwise over the row-major tensor, the chain's other ops and the elementwise ops
// after it as its post-ops.
Status CpuRunner::Impl::prepare_eltwise(size_t i) {
  const CpuStep& s = cp->steps[i];
  StepRun& run = runs[i];
  const Node& n = *plan->graph->nodes[s.index];
  const std::string at = n.describe();
  run.out_dims = static_dims(n.inputs[0]);
  const std::vector<CpuPostOp> ops = eltwise_ops(n);  // the first is the primitive's, the rest its post-ops
  const std::optional<EltwiseAlg> e = ops.empty() ? std::nullopt : eltwise_alg(ops[0]);
  if (!e) return KILN_ERROR(kInternal, "{}: not an elementwise op oneDNN runs", at);
  KILN_ASSIGN_OR_RETURN(Md md, make_md(at, run.out_dims, plain_tag(run.out_dims.size())));
  std::vector<CpuPostOp> post(ops.begin() + 1, ops.end());
  post.insert(post.end(), s.post.begin(), s.post.end());
  Attr attrs(d);
  KILN_RETURN_IF_ERROR(eltwise_attr(attrs, post, at));
  Pd pd(d);
  KILN_DNNL(at, d->eltwise_forward_primitive_desc_create(&pd.p, engine, dnnl_forward_inference, e->alg, md.md, md.md, e->alpha,
                                                         e->beta, attrs.attr));
  return one_source_step(i, pd.p, md.md, md.md, at);
}

// ONNX LSTM and GRU as oneDNN's: W, R and B rearranged once into its layout and gate order (LSTM
// i, f, c~, o from ONNX's i, o, f, c; GRU u, r, o is ONNX's z, r, h) with the biases summed (a
// linear-before-reset GRU keeps R's h bias as oneDNN's fourth), and reordered into the layouts it
// prefers; X read where it lies as [seq, batch, input], the initial states too ([dirs, batch,
// hidden] is oneDNN's [1, dirs, batch, hidden]). A bidirectional result, which oneDNN writes per
// step as [seq, batch, 2 x hidden], is reordered into ONNX's [seq, 2, batch, hidden].
Status CpuRunner::Impl::prepare_rnn(size_t i) {
  const CpuStep& s = cp->steps[i];
  StepRun& run = runs[i];
  const Node& n = *plan->graph->nodes[s.index];
  const std::string at = n.describe();
  const bool lstm = n.op == OpKind::kLSTM, lbr = !lstm && n.attr_int("linear_before_reset", 0) != 0;
  const int64_t gates = lstm ? 4 : 3, bias_gates = lstm || lbr ? 4 : 3;
  const Dims x = static_dims(n.inputs[0]);
  const int64_t steps = x[0], batch = x[1], in = x[2], h = n.attr_int("hidden_size", 0);
  const std::string dir = n.attr_string("direction", "forward");
  const int64_t dirs = dir == "bidirectional" ? 2 : 1;
  run.out_dims = {steps, dirs, batch, h};
  const Tensor& w = *n.inputs[1]->constant;
  const Tensor& r = *n.inputs[2]->constant;
  const Tensor* b = n.inputs.size() > 3 && n.inputs[3] ? &*n.inputs[3]->constant : nullptr;
  constexpr int64_t kLstmGate[4] = {0, 2, 3, 1};  // oneDNN's LSTM gate g is ONNX's gate kLstmGate[g]
  auto onnx_gate = [&](int64_t g) { return lstm ? kLstmGate[g] : g; };
  KILN_ASSIGN_OR_RETURN(Tensor wl, Tensor::create(DType::kFloat32, {1, dirs, in, gates, h}));
  KILN_ASSIGN_OR_RETURN(Tensor wi, Tensor::create(DType::kFloat32, {1, dirs, h, gates, h}));
  KILN_ASSIGN_OR_RETURN(Tensor bias, Tensor::create(DType::kFloat32, {1, dirs, bias_gates, h}));
  const float* wp = w.data<float>();
  const float* rp = r.data<float>();
  float* bp = bias.data<float>();
  for (int64_t d = 0; d < dirs; ++d) {
    const float* wb = b ? b->data<float>() + d * 2 * gates * h : nullptr;  // W's biases, then R's
    const float* rb = wb ? wb + gates * h : nullptr;
    for (int64_t g = 0; g < gates; ++g) {
      for (int64_t o = 0; o < h; ++o) {
        const int64_t row = onnx_gate(g) * h + o;  // the gate row in W, R and each half of B
        for (int64_t k = 0; k < in; ++k) wl.data<float>()[((d * in + k) * gates + g) * h + o] = wp[(d * gates * h + row) * in + k];
        for (int64_t k = 0; k < h; ++k) wi.data<float>()[((d * h + k) * gates + g) * h + o] = rp[(d * gates * h + row) * h + k];
        // A linear-before-reset GRU adds R's h bias inside the reset product: oneDNN's fourth bias.
        const bool split = lbr && g == 2;
        bp[(d * bias_gates + g) * h + o] = wb ? wb[row] + (split ? 0.f : rb[row]) : 0.f;
        if (split) bp[(d * bias_gates + 3) * h + o] = rb ? rb[row] : 0.f;
      }
    }
  }
  const bool h0 = s.reads.size() > 5 && s.reads[5].kind != ValueRef::Kind::kNone;
  const bool c0 = lstm && s.reads.size() > 6 && s.reads[6].kind != ValueRef::Kind::kNone;
  KILN_ASSIGN_OR_RETURN(Md src_md, make_md(at, x, dnnl_abc));
  KILN_ASSIGN_OR_RETURN(Md state_md, make_md(at, {1, dirs, batch, h}, dnnl_abcd));
  KILN_ASSIGN_OR_RETURN(Md wl_plain, make_md(at, {1, dirs, in, gates, h}, dnnl_abcde));
  KILN_ASSIGN_OR_RETURN(Md wi_plain, make_md(at, {1, dirs, h, gates, h}, dnnl_abcde));
  KILN_ASSIGN_OR_RETURN(Md wl_any, make_md(at, {1, dirs, in, gates, h}, dnnl_format_tag_any));
  KILN_ASSIGN_OR_RETURN(Md wi_any, make_md(at, {1, dirs, h, gates, h}, dnnl_format_tag_any));
  KILN_ASSIGN_OR_RETURN(Md bias_md, make_md(at, {1, dirs, bias_gates, h}, dnnl_abcd));
  KILN_ASSIGN_OR_RETURN(Md dst_md, make_md(at, {steps, batch, dirs * h}, dnnl_abc));
  const dnnl_rnn_direction_t direction = dir == "bidirectional" ? dnnl_bidirectional_concat
                                         : dir == "reverse"     ? dnnl_unidirectional_right2left
                                                                : dnnl_unidirectional_left2right;
  const_dnnl_memory_desc_t hmd = h0 ? state_md.md : nullptr;
  Pd pd(d);
  if (lstm) {
    KILN_DNNL(at, d->lstm_forward_primitive_desc_create(&pd.p, engine, dnnl_forward_inference, direction, src_md.md, hmd,
                                                        c0 ? state_md.md : nullptr, wl_any.md, wi_any.md, nullptr, nullptr,
                                                        bias_md.md, dst_md.md, nullptr, nullptr, 0, nullptr));
  } else if (lbr) {
    KILN_DNNL(at, d->lbr_gru_forward_primitive_desc_create(&pd.p, engine, dnnl_forward_inference, direction, src_md.md, hmd,
                                                           wl_any.md, wi_any.md, bias_md.md, dst_md.md, nullptr, 0, nullptr));
  } else {
    KILN_DNNL(at, d->gru_forward_primitive_desc_create(&pd.p, engine, dnnl_forward_inference, direction, src_md.md, hmd,
                                                       wl_any.md, wi_any.md, bias_md.md, dst_md.md, nullptr, 0, nullptr));
  }
  impls[i] = fmt::format("oneDNN {}", impl_name(d, pd.p));
  KILN_ASSIGN_OR_RETURN(run.main.p, primitive(at, pd.p));
  auto want = [&](int arg) { return d->primitive_desc_query_md(pd.p, dnnl_query_exec_arg_md, arg); };
  KILN_ASSIGN_OR_RETURN(dnnl_memory_t wl_mem, weight(at, wl, wl_plain.md, want(DNNL_ARG_WEIGHTS_LAYER)));
  KILN_ASSIGN_OR_RETURN(dnnl_memory_t wi_mem, weight(at, wi, wi_plain.md, want(DNNL_ARG_WEIGHTS_ITER)));
  KILN_ASSIGN_OR_RETURN(dnnl_memory_t bias_mem, weight(at, bias, bias_md.md, want(DNNL_ARG_BIAS)));
  KILN_ASSIGN_OR_RETURN(dnnl_memory_t src_mem, memory(at, src_md.md));
  KILN_ASSIGN_OR_RETURN(run.dst_mem, memory(at, dst_md.md));
  run.main.args = {{DNNL_ARG_SRC_LAYER, src_mem}, {DNNL_ARG_WEIGHTS_LAYER, wl_mem}, {DNNL_ARG_WEIGHTS_ITER, wi_mem},
                   {DNNL_ARG_BIAS, bias_mem}, {DNNL_ARG_DST_LAYER, run.dst_mem}};
  run.bind = {{src_mem, 0}};
  for (auto [used, arg, read] : {std::tuple{h0, DNNL_ARG_SRC_ITER, size_t(5)}, std::tuple{c0, DNNL_ARG_SRC_ITER_C, size_t(6)}}) {
    if (!used) continue;
    KILN_ASSIGN_OR_RETURN(dnnl_memory_t m, memory(at, state_md.md));
    run.main.args.push_back({arg, m});
    run.bind.push_back({m, read});
  }
  if (dirs == 2) {
    // [seq, batch, 2, hidden] as oneDNN wrote it, into [seq, 2, batch, hidden].
    KILN_ASSIGN_OR_RETURN(Md from, make_md(at, {steps, batch, 2, h}, dnnl_abcd));
    dnnl_memory_desc_t to = nullptr;
    const Dims dims = {steps, batch, 2, h}, strides = {2 * batch * h, h, batch * h, 1};
    KILN_DNNL(at, d->memory_desc_create_with_strides(&to, 4, dims.data(), dnnl_f32, strides.data()));
    Md to_md(d, to);
    KILN_ASSIGN_OR_RETURN(run.dst_reorder, reorder(at, from.md, to_md.md, &run.dst_reorder_in, &run.dst_user));
    dst_scratch.resize(size_t(steps * batch * 2 * h) * sizeof(float));
  }
  return Status::ok();
}

// Concat: each input read in the layout its producer wrote, the result in the layout oneDNN picks
// for them when the plan keeps it (else row-major).
Status CpuRunner::Impl::prepare_concat(size_t i) {
  const CpuStep& s = cp->steps[i];
  StepRun& run = runs[i];
  const Node& n = *plan->graph->nodes[s.index];
  const std::string at = n.describe();
  run.out_dims = static_dims(n.outputs[0]);
  const int64_t rank = int64_t(run.out_dims.size());
  int64_t axis = n.attr_int("axis", 0);
  if (axis < 0) axis += rank;
  std::deque<Md> plain;
  std::vector<const_dnnl_memory_desc_t> srcs;
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    const ValueRef& r = s.reads[k];
    if (r.kind == ValueRef::Kind::kSlot && slot_md[r.index]) {
      srcs.push_back(*slot_md[r.index]);
      continue;
    }
    const Dims x = static_dims(n.inputs[k]);
    KILN_ASSIGN_OR_RETURN(Md m, make_md(at, x, plain_tag(x.size())));
    plain.push_back(std::move(m));
    srcs.push_back(plain.back().md);
  }
  const bool library = s.out_layout == CpuLayout::kLibrary;
  KILN_ASSIGN_OR_RETURN(Md dst, make_md(at, run.out_dims, library ? dnnl_format_tag_any : plain_tag(size_t(rank))));
  Pd pd(d);
  KILN_DNNL(at, d->concat_primitive_desc_create(&pd.p, engine, dst.md, int(srcs.size()), int(axis), srcs.data(), nullptr));
  impls[i] = fmt::format("oneDNN {}", impl_name(d, pd.p));
  KILN_ASSIGN_OR_RETURN(run.main.p, primitive(at, pd.p));
  const_dnnl_memory_desc_t got = d->primitive_desc_query_md(pd.p, dnnl_query_dst_md, 0);
  KILN_ASSIGN_OR_RETURN(run.dst_mem, memory(at, got));
  KILN_RETURN_IF_ERROR(place_result(at, s, run, got, dst.md));  // row-major was asked for unless kept
  for (size_t k = 0; k < srcs.size(); ++k) {
    KILN_ASSIGN_OR_RETURN(dnnl_memory_t m, memory(at, srcs[k]));
    run.main.args.push_back({DNNL_ARG_MULTIPLE_SRC + int(k), m});
    run.bind.push_back({m, k});
  }
  run.main.args.push_back({DNNL_ARG_DST, run.dst_mem});
  return Status::ok();
}

// BatchNormalization with the constant statistics (and a Relu as oneDNN's fuse-relu flag): the
// result in the source's layout, reordered to row-major when the plan needs that.
Status CpuRunner::Impl::prepare_batch_norm(size_t i) {
  const CpuStep& s = cp->steps[i];
  StepRun& run = runs[i];
  const Node& n = *plan->graph->nodes[s.index];
  const std::string at = n.describe();
  const Dims x = static_dims(n.inputs[0]);
  run.out_dims = x;
  KILN_ASSIGN_OR_RETURN(Md plain, make_md(at, x, plain_tag(x.size())));
  const_dnnl_memory_desc_t src = s.reads[0].kind == ValueRef::Kind::kSlot && slot_md[s.reads[0].index]
                                     ? *slot_md[s.reads[0].index]
                                     : plain.md;
  unsigned flags = dnnl_use_global_stats | dnnl_use_scale | dnnl_use_shift;
  if (!s.post.empty()) flags |= dnnl_fuse_norm_relu;  // the plan allows only a Relu
  Pd pd(d);
  KILN_DNNL(at, d->batch_normalization_forward_primitive_desc_create(&pd.p, engine, dnnl_forward_inference, src, src,
                                                                     n.attr_float("epsilon", 1e-5f), flags, nullptr));
  impls[i] = fmt::format("oneDNN {}", impl_name(d, pd.p));
  KILN_ASSIGN_OR_RETURN(run.main.p, primitive(at, pd.p));
  KILN_ASSIGN_OR_RETURN(run.src_mem, memory(at, src));
  KILN_ASSIGN_OR_RETURN(run.dst_mem, memory(at, src));
  run.main.args = {{DNNL_ARG_SRC, run.src_mem}, {DNNL_ARG_DST, run.dst_mem}};
  run.bind = {{run.src_mem, 0}};
  KILN_ASSIGN_OR_RETURN(Md channel, make_md(at, Dims{x[1]}, dnnl_a));
  const int args[] = {DNNL_ARG_SCALE, DNNL_ARG_SHIFT, DNNL_ARG_MEAN, DNNL_ARG_VARIANCE};
  for (size_t k = 1; k < 5; ++k) {
    const Tensor& t = *plan->constants[s.reads[k].index]->constant;
    KILN_ASSIGN_OR_RETURN(dnnl_memory_t m, memory(at, channel.md, const_cast<void*>(t.raw())));
    run.main.args.push_back({args[k - 1], m});
  }
  return place_result(at, s, run, src, plain.md);
}

// GroupNormalization (InstanceNormalization: a group per channel) in two primitives: oneDNN's batch
// norm over the input viewed as [1, batch x groups, group's elements] computes each group's
// statistics and normalizes (no scale or shift), into the step's scratch; then a binary multiply by
// the per-channel scale, with the per-channel bias added and the elementwise ops after the node
// (SiLU) as post-ops, writes the result.
Status CpuRunner::Impl::prepare_group_norm(size_t i) {
  const CpuStep& s = cp->steps[i];
  StepRun& run = runs[i];
  const Node& n = *plan->graph->nodes[s.index];
  const std::string at = n.describe();
  const Dims x = static_dims(n.inputs[0]);
  run.out_dims = x;
  const int64_t c = x[1], total = numel(x);
  const int64_t groups = n.op == OpKind::kInstanceNormalization ? c : n.attr_int("num_groups", 0);
  const int64_t per_group = total / x[0] / groups;
  // Scale and bias per channel (a per-group one repeated over its channels).
  for (size_t k = 1; k < 3; ++k) {
    const Tensor& t = *n.inputs[k]->constant;
    Buffer b;
    b.resize(size_t(c) * sizeof(float));
    float* p = reinterpret_cast<float*>(b.p.get());
    for (int64_t ch = 0; ch < c; ++ch) p[ch] = t.data<float>()[t.numel() == c ? ch : ch / (c / groups)];
    weights.push_back(std::move(b));
  }
  float* scale = reinterpret_cast<float*>(weights[weights.size() - 2].p.get());
  float* bias = reinterpret_cast<float*>(weights.back().p.get());
  KILN_ASSIGN_OR_RETURN(Md grouped, make_md(at, {1, x[0] * groups, per_group}, dnnl_abc));
  Pd bn(d);
  KILN_DNNL(at, d->batch_normalization_forward_primitive_desc_create(&bn.p, engine, dnnl_forward_inference, grouped.md,
                                                                     grouped.md, n.attr_float("epsilon", 1e-5f),
                                                                     dnnl_normalization_flags_none, nullptr));
  KILN_ASSIGN_OR_RETURN(run.main.p, primitive(at, bn.p));
  run.scratch.resize(size_t(total) * sizeof(float));
  KILN_ASSIGN_OR_RETURN(dnnl_memory_t src_mem, memory(at, grouped.md));
  KILN_ASSIGN_OR_RETURN(dnnl_memory_t normed, memory(at, grouped.md, run.scratch.p.get()));
  run.main.args = {{DNNL_ARG_SRC, src_mem}, {DNNL_ARG_DST, normed}};
  run.bind = {{src_mem, 0}};

  Dims per_channel(x.size(), 1);
  per_channel[1] = c;
  KILN_ASSIGN_OR_RETURN(Md full, make_md(at, x, plain_tag(x.size())));
  KILN_ASSIGN_OR_RETURN(Md channel, make_md(at, per_channel, plain_tag(x.size())));
  Attr attrs(d);
  KILN_RETURN_IF_ERROR(attrs.create(at));
  KILN_DNNL(at, d->post_ops_append_binary(attrs.po, dnnl_binary_add, channel.md));
  for (const CpuPostOp& op : s.post) KILN_RETURN_IF_ERROR(append_post_op(d, attrs.po, op, nullptr, at));
  KILN_DNNL(at, d->primitive_attr_set_post_ops(attrs.attr, attrs.po));
  Pd affine(d);
  KILN_DNNL(at, d->binary_primitive_desc_create(&affine.p, engine, dnnl_binary_mul, full.md, channel.md, full.md, attrs.attr));
  impls[i] = fmt::format("oneDNN {} + {}", impl_name(d, bn.p), impl_name(d, affine.p));
  Prim a;
  KILN_ASSIGN_OR_RETURN(a.p, primitive(at, affine.p));
  KILN_ASSIGN_OR_RETURN(dnnl_memory_t normed_full, memory(at, full.md, run.scratch.p.get()));
  KILN_ASSIGN_OR_RETURN(dnnl_memory_t scale_mem, memory(at, channel.md, scale));
  KILN_ASSIGN_OR_RETURN(dnnl_memory_t bias_mem, memory(at, channel.md, bias));
  KILN_ASSIGN_OR_RETURN(run.dst_mem, memory(at, full.md));
  a.args = {{DNNL_ARG_SRC_0, normed_full}, {DNNL_ARG_SRC_1, scale_mem},
            {DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, bias_mem}, {DNNL_ARG_DST, run.dst_mem}};
  run.after.push_back(std::move(a));
  return Status::ok();
}

// Resize as oneDNN resampling over the spatial dims, which maps pixels back through the ratio of
// the dims (the plan takes only scales that equal it).
Status CpuRunner::Impl::prepare_resample(size_t i) {
  const CpuStep& s = cp->steps[i];
  StepRun& run = runs[i];
  const Node& n = *plan->graph->nodes[s.index];
  const std::string at = n.describe();
  const Dims x = static_dims(n.inputs[0]);
  run.out_dims = static_dims(n.outputs[0]);
  const dnnl_alg_kind_t alg = n.attr_string("mode", "nearest") == "linear" ? dnnl_resampling_linear : dnnl_resampling_nearest;
  KILN_ASSIGN_OR_RETURN(Md src_md, make_md(at, x, plain_tag(x.size())));
  KILN_ASSIGN_OR_RETURN(Md dst_md, make_md(at, run.out_dims, plain_tag(x.size())));
  Pd pd(d);
  KILN_DNNL(at, d->resampling_forward_primitive_desc_create(&pd.p, engine, dnnl_forward_inference, alg, nullptr, src_md.md,
                                                            dst_md.md, nullptr));
  return one_source_step(i, pd.p, src_md.md, dst_md.md, at);
}

// RMSNormalization over the last axis as kiln's own loop (oneDNN 3.2 has no RMS norm): per row the
// sum of squares in double, then each element times the row's inverse root mean square and the
// scale; rows spread over the threads.
Status CpuRunner::Impl::prepare_rms_norm(size_t i) {
  const CpuStep& s = cp->steps[i];
  StepRun& run = runs[i];
  const Node& n = *plan->graph->nodes[s.index];
  run.out_dims = static_dims(n.inputs[0]);
  const int64_t cols = run.out_dims.back(), rows = numel(run.out_dims) / cols;
  const double eps = n.attr_float("epsilon", 1e-5f);
  impls[i] = "kiln's row loop";
  run.loop = [cols, rows, eps](const std::vector<const float*>& reads, float* out) {
    const float* x = reads[0];
    const float* scale = reads[1];
    parallel_for(rows, std::max<int64_t>(1, 8192 / cols), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* row = x + r * cols;
        double sq = 0;
        for (int64_t j = 0; j < cols; ++j) sq += double(row[j]) * double(row[j]);
        const float inv = float(1 / std::sqrt(sq / double(cols) + eps));
        float* y = out + r * cols;
        for (int64_t j = 0; j < cols; ++j) y[j] = row[j] * inv * scale[j];
      }
    });
  };
  return Status::ok();
}

// Softmax / LogSoftmax on its own (attention's is part of kAttention): oneDNN's over the axis.
Status CpuRunner::Impl::prepare_softmax(size_t i) {
  const CpuStep& s = cp->steps[i];
  StepRun& run = runs[i];
  const Node& n = *plan->graph->nodes[s.index];
  const std::string at = n.describe();
  run.out_dims = static_dims(n.inputs[0]);
  int64_t axis = n.attr_int("axis", -1);
  if (axis < 0) axis += int64_t(run.out_dims.size());
  KILN_ASSIGN_OR_RETURN(Md md, make_md(at, run.out_dims, plain_tag(run.out_dims.size())));
  Pd pd(d);
  KILN_DNNL(at, d->softmax_forward_primitive_desc_create(&pd.p, engine, dnnl_forward_inference,
                                                         n.op == OpKind::kLogSoftmax ? dnnl_softmax_log : dnnl_softmax_accurate,
                                                         md.md, md.md, int(axis), nullptr));
  return one_source_step(i, pd.p, md.md, md.md, at);
}

// Slice with steps of 1: a reorder from the input's sub-block (a oneDNN sub-memory descriptor: the
// output's dims at the clamped starts) into the row-major output.
Status CpuRunner::Impl::prepare_slice(size_t i) {
  const CpuStep& s = cp->steps[i];
  StepRun& run = runs[i];
  const Node& n = *plan->graph->nodes[s.index];
  const std::string at = n.describe();
  const Dims x = static_dims(n.inputs[0]);
  run.out_dims = static_dims(n.outputs[0]);
  const int64_t rank = int64_t(x.size());
  const Tensor& starts = *n.inputs[1]->constant;
  const Tensor* axes = n.inputs.size() > 3 && n.inputs[3] ? &*n.inputs[3]->constant : nullptr;
  Dims offsets(x.size(), 0);
  for (int64_t k = 0; k < starts.numel(); ++k) {
    int64_t ax = axes ? axes->as_int(k) : k;
    if (ax < 0) ax += rank;
    if (ax < 0 || ax >= rank) return KILN_ERROR(kInternal, "{}: axis out of range", at);
    int64_t start = starts.as_int(k);
    if (start < 0) start += x[size_t(ax)];
    offsets[size_t(ax)] = std::clamp<int64_t>(start, 0, x[size_t(ax)]);  // ONNX's clamping (slice.cc)
  }
  KILN_ASSIGN_OR_RETURN(Md whole, make_md(at, x, plain_tag(x.size())));
  dnnl_memory_desc_t sub = nullptr;
  KILN_DNNL(at, d->memory_desc_create_submemory(&sub, whole.md, run.out_dims.data(), offsets.data()));
  Md sub_md(d, sub);
  KILN_ASSIGN_OR_RETURN(Md dst, make_md(at, run.out_dims, plain_tag(x.size())));
  dnnl_memory_t src_mem = nullptr;
  KILN_ASSIGN_OR_RETURN(run.main, reorder(at, sub_md.md, dst.md, &src_mem, &run.dst_mem));
  impls[i] = "oneDNN reorder (a sub-block)";
  run.bind = {{src_mem, 0}};
  return Status::ok();
}

#endif  // KILN_HAVE_DNNL

}  // namespace kiln
