#include "backends/cpu/fast_session.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <string_view>
#include <type_traits>
#include <unordered_map>

#include "backends/backend.h"
#include "backends/cpu/compute_thread.h"
#include "backends/cpu/dnnl_lib.h"
#include "backends/cpu/fast_session_impl.h"
#include "runtime/memory_planner.h"

namespace kiln {

#if KILN_HAVE_DNNL

using namespace cpu_detail;

namespace cpu_detail {

std::optional<EltwiseAlg> eltwise_alg(const CpuPostOp& op) {
  switch (op.kind) {
    case CpuPostKind::kRelu: return EltwiseAlg{dnnl_eltwise_relu, 0, 0};
    case CpuPostKind::kLeakyRelu: return EltwiseAlg{dnnl_eltwise_relu, op.alpha, 0};
    case CpuPostKind::kClip: return EltwiseAlg{dnnl_eltwise_clip_v2, op.alpha, op.beta};
    case CpuPostKind::kSigmoid: return EltwiseAlg{dnnl_eltwise_logistic, 0, 0};
    case CpuPostKind::kTanh: return EltwiseAlg{dnnl_eltwise_tanh, 0, 0};
    case CpuPostKind::kElu: return EltwiseAlg{dnnl_eltwise_elu, op.alpha, 0};
    case CpuPostKind::kHardSigmoid: return EltwiseAlg{dnnl_eltwise_hardsigmoid, op.alpha, op.beta};
    case CpuPostKind::kHardSwish: return EltwiseAlg{dnnl_eltwise_hardswish, 1.f / 6.f, 0.5f};
    case CpuPostKind::kGeluErf: return EltwiseAlg{dnnl_eltwise_gelu_erf, 0, 0};
    case CpuPostKind::kGeluTanh: return EltwiseAlg{dnnl_eltwise_gelu_tanh, 0, 0};
    case CpuPostKind::kSwish: return EltwiseAlg{dnnl_eltwise_swish, op.alpha, 0};
    case CpuPostKind::kSoftplus: return EltwiseAlg{dnnl_eltwise_soft_relu, 1.f, 0};
    case CpuPostKind::kMish: return EltwiseAlg{dnnl_eltwise_mish, 0, 0};
    case CpuPostKind::kPow: return EltwiseAlg{dnnl_eltwise_pow, op.alpha, op.beta};
    case CpuPostKind::kAdd: return std::nullopt;
  }
  return std::nullopt;
}

Status append_post_op(const DnnlLib* d, dnnl_post_ops_t po, const CpuPostOp& op, const_dnnl_memory_desc_t operand,
                      const std::string& at) {
  if (op.kind == CpuPostKind::kAdd) {
    KILN_DNNL(at, d->post_ops_append_binary(po, dnnl_binary_add, operand));
    return Status::ok();
  }
  auto e = eltwise_alg(op);
  if (!e) return KILN_ERROR(kInternal, "{}: unknown post-op", at);
  KILN_DNNL(at, d->post_ops_append_eltwise(po, e->alg, e->alpha, e->beta));
  return Status::ok();
}

}  // namespace cpu_detail

namespace {



// Resolved window of a Conv or pooling node over x (spatial dims from 2): kernel, strides,
// dilations in oneDNN's convention (0 = dense), pads before and after such that the window yields
// exactly the node's output dims (ceil_mode and SAME padding resolved).
struct Geometry {
  Dims kernel, strides, dil, pad_l, pad_r;
};
Geometry window(const Node& n, const Dims& x, const Dims& kernel, const Dims& y, bool global) {
  const size_t sp = x.size() - 2;
  Geometry g;
  g.kernel = global ? Dims(x.begin() + 2, x.end()) : kernel;
  g.strides = global ? Dims(sp, 1) : n.attr_ints("strides", Dims(sp, 1));
  Dims dil = global ? Dims(sp, 1) : n.attr_ints("dilations", Dims(sp, 1));
  Dims pads = global ? Dims(2 * sp, 0) : n.attr_ints("pads", Dims(2 * sp, 0));
  const std::string ap = global ? "NOTSET" : n.attr_string("auto_pad", "NOTSET");
  if (ap != "NOTSET") pads.assign(2 * sp, 0);
  for (size_t i = 0; i < sp; ++i) {
    const int64_t ext = (g.kernel[i] - 1) * dil[i] + 1;
    int64_t l = pads[i], r = pads[i + sp];
    if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
      const int64_t total = std::max<int64_t>(0, (y[2 + i] - 1) * g.strides[i] + ext - x[2 + i]);
      l = ap == "SAME_UPPER" ? total / 2 : total - total / 2;
      r = total - l;
    }
    // ceil_mode: the last window may start inside the end padding; widen it so oneDNN's floor
    // arithmetic gives the same count.
    r = std::max(r, (y[2 + i] - 1) * g.strides[i] + ext - x[2 + i] - l);
    g.dil.push_back(dil[i] - 1);
    g.pad_l.push_back(l);
    g.pad_r.push_back(r);
  }
  return g;
}

}  // namespace

Status CpuRunner::Impl::prepare() {
  KILN_DNNL("oneDNN", d->engine_create(&engine, dnnl_cpu, 0));
  KILN_DNNL("oneDNN", d->stream_create(&stream, engine, dnnl_stream_default_flags));
  slot_md.assign(plan->slots, nullptr);
  out_cache.resize(cp->steps.size());
  const Graph& g = *plan->graph;
  for (size_t i = 0; i < g.inputs.size(); ++i) by_value[g.inputs[i]] = plan->inputs[i];
  for (const PlanStep& s : plan->steps) {
    const Node& n = *g.nodes[s.node];
    for (size_t k = 0; k < n.outputs.size(); ++k) by_value[n.outputs[k]] = s.outputs[k];
  }
  runs.resize(cp->steps.size());
  impls.resize(cp->steps.size());
  for (size_t i = 0; i < cp->steps.size(); ++i) KILN_RETURN_IF_ERROR(prepare_step(i));
  plan_arena();
  return Status::ok();
}

size_t CpuRunner::Impl::out_bytes(size_t i) const {
  const StepRun& run = runs[i];
  return cp->steps[i].out_layout == CpuLayout::kLibrary ? run.out_bytes : size_t(numel(run.out_dims)) * sizeof(float);
}

// The oneDNN steps' results share one arena by their lifetimes (runtime/memory_planner.h), from
// the step that writes each to the step that releases its slot: the activations a step reads were
// written moments before and are still in cache, where a buffer per step made every step write to
// memory no other step had touched this run. Results never released (the graph's outputs, handed
// to the caller) keep buffers of their own; a host step's result that views arena memory is copied
// out of it when made (run()), so nothing outlives its bytes.
void CpuRunner::Impl::plan_arena() {
  std::vector<int64_t> released(plan->slots, -1);
  for (size_t i = 0; i < cp->steps.size(); ++i) {
    for (uint32_t f : cp->steps[i].frees) released[f] = int64_t(i);
  }
  std::vector<BufferRequest> requests;
  std::vector<size_t> owner;
  arena_offset.assign(cp->steps.size(), kNoArena);
  for (size_t i = 0; i < cp->steps.size(); ++i) {
    const CpuStep& s = cp->steps[i];
    if (s.kind == CpuStepKind::kHost || s.out.kind != ValueRef::Kind::kSlot || released[s.out.index] < 0) continue;
    requests.push_back({out_bytes(i), int(i), int(released[s.out.index])});
    owner.push_back(i);
  }
  if (requests.empty()) return;
  const MemoryPlan mp = plan_memory(requests, 64);
  arena = std::make_shared<Buffer>();
  arena->resize(mp.peak);
  for (size_t r = 0; r < owner.size(); ++r) arena_offset[owner[r]] = mp.offsets[r];
}

Status CpuRunner::Impl::copy_out_of_arena(Tensor& t) const {
  if (!arena || t.nbytes() == 0 || t.dtype() == DType::kString) return Status::ok();
  const char* p = static_cast<const char*>(t.raw());
  if (p < arena->p.get() || p >= arena->p.get() + arena->size) return Status::ok();
  KILN_ASSIGN_OR_RETURN(Tensor c, Tensor::create(t.dtype(), t.dims()));
  std::memcpy(c.raw(), t.raw(), t.nbytes());
  t = std::move(c);
  return Status::ok();
}

Status CpuRunner::Impl::prepare_step(size_t i) {
  const CpuStep& s = cp->steps[i];
  const Graph& g = *plan->graph;
  StepRun& run = runs[i];
  if (s.kind == CpuStepKind::kHost) {
    impls[i] = "reference kernel";
    return Status::ok();
  }
  if (s.kind == CpuStepKind::kAttention) return prepare_attention(i);
  if (s.kind == CpuStepKind::kNorm) return prepare_norm(i);
  if (s.kind == CpuStepKind::kTranspose) return prepare_transpose(i);
  if (s.kind == CpuStepKind::kBatchMatMul) return prepare_batch_matmul(i);
  if (s.kind == CpuStepKind::kConcat) return prepare_concat(i);
  if (s.kind == CpuStepKind::kBatchNorm) return prepare_batch_norm(i);
  if (s.kind == CpuStepKind::kStft) return prepare_stft(i);
  if (s.kind == CpuStepKind::kEltwise) return prepare_eltwise(i);
  if (s.kind == CpuStepKind::kLstm || s.kind == CpuStepKind::kGru) return prepare_rnn(i);
  if (s.kind == CpuStepKind::kGroupNorm) return prepare_group_norm(i);
  if (s.kind == CpuStepKind::kResample) return prepare_resample(i);
  if (s.kind == CpuStepKind::kRmsNorm) return prepare_rms_norm(i);
  if (s.kind == CpuStepKind::kSoftmax) return prepare_softmax(i);
  if (s.kind == CpuStepKind::kSlice) return prepare_slice(i);
  if (s.kind == CpuStepKind::kFused) {
    const Node& fn = *g.nodes[s.index];
    KILN_ASSIGN_OR_RETURN(FusedKernel k, FusedKernel::compile(fn));
    run.loop = [k = std::move(k)](const std::vector<const float*>& reads, float* out) { k.run(reads, out); };
    run.out_dims = static_dims(fn.outputs[0]);
    impls[i] = "kiln's fused loop";
    return Status::ok();
  }
  const Node& n = *g.nodes[s.index];
  const std::string at = n.describe();
  auto constant = [&](size_t k) -> const Tensor& { return *plan->constants[s.reads[k].index]->constant; };
  auto is_const = [&](size_t k) { return k < s.reads.size() && s.reads[k].kind == ValueRef::Kind::kConstant; };
  // A node input (a Conv's bias, a Gemm's C), not a post-op operand that follows the inputs in reads.
  auto has_input = [&](size_t k) { return k < n.inputs.size() && n.inputs[k] != nullptr; };
  auto library_md = [&](size_t k) -> const_dnnl_memory_desc_t {
    return s.reads[k].kind == ValueRef::Kind::kSlot ? (slot_md[s.reads[k].index] ? *slot_md[s.reads[k].index] : nullptr)
                                                    : nullptr;
  };
  const Value* out_value = s.post.empty() ? n.outputs[0] : g.nodes[s.post.back().node]->outputs[0];
  const bool binary = s.kind == CpuStepKind::kBinary;
  const size_t sr = binary ? binary_src0(n) : 0;  // the read that is the primitive's source
  Dims x = static_dims(n.inputs[sr]), y = static_dims(out_value);
  run.out_dims = y;

  // The operands' descriptors: a library-layout slot keeps its producer's; a plain one is
  // row-major (a MatMul's rows flattened to 2-D).
  const bool matmul = s.kind == CpuStepKind::kMatMul;
  Dims src_dims = x, dst_dims = y;
  if (matmul) {
    const int64_t k = x.back(), cols = y.back();
    src_dims = {numel(x) / k, k};
    dst_dims = {numel(y) / cols, cols};
  }
  KILN_ASSIGN_OR_RETURN(Md src_plain, make_md(at, src_dims, plain_tag(src_dims.size())));
  KILN_ASSIGN_OR_RETURN(Md dst_plain, make_md(at, dst_dims, plain_tag(dst_dims.size())));
  const_dnnl_memory_desc_t src_have = library_md(sr) ? library_md(sr) : src_plain.md;

  // Post-ops, their operands' descriptors bound at run time. An operand of the result's full shape
  // may instead be described as `full` (the layout the primitive writes): it is then reordered into
  // that layout before each run (`from` keeps the layout it is in).
  std::deque<Md> operand_mds;
  struct OperandArg {
    int arg;                        // DNNL_ARG_*
    size_t read;                    // index into reads
    const_dnnl_memory_desc_t md;
    const_dnnl_memory_desc_t from;  // non-null: reordered from this layout into md first
  };
  std::vector<OperandArg> operand_args;
  // A MatMul's first Add of a constant row is its bias: added inside the GEMM, not after it.
  size_t first_post = 0;
  const Tensor* row_bias = nullptr;
  if (matmul && n.op == OpKind::kMatMul && !s.post.empty() && s.post[0].kind == CpuPostKind::kAdd &&
      is_const(size_t(s.post[0].operand)) && constant(size_t(s.post[0].operand)).numel() == y.back()) {
    row_bias = &constant(size_t(s.post[0].operand));
    first_post = 1;
  }
  auto make_attr = [&](Attr& attrs, const_dnnl_memory_desc_t full) -> Expected<bool> {
    KILN_RETURN_IF_ERROR(attrs.create(at));
    operand_args.clear();
    bool reordered = false;
    for (size_t k = first_post; k < s.post.size(); ++k) {
      const CpuPostOp& op = s.post[k];
      const_dnnl_memory_desc_t omd = nullptr, from = nullptr;
      if (op.kind == CpuPostKind::kAdd) {
        const size_t r = size_t(op.operand);
        omd = library_md(r);
        bool full_shape = omd != nullptr;  // a library-layout operand is a result of the same shape
        if (!omd) {
          const Value* ov = g.nodes[op.node]->inputs[0] == (k == 0 ? n.outputs[0] : g.nodes[s.post[k - 1].node]->outputs[0])
                                ? g.nodes[op.node]->inputs[1]
                                : g.nodes[op.node]->inputs[0];
          Dims od = static_dims(ov);
          od.insert(od.begin(), y.size() - od.size(), 1);
          if (matmul) od = numel(od) == numel(y) ? dst_dims : Dims{1, dst_dims[1]};
          KILN_ASSIGN_OR_RETURN(Md m, make_md(at, od, plain_tag(od.size())));
          omd = m.md;
          operand_mds.push_back(std::move(m));
          full_shape = numel(od) == numel(y);
        }
        if (full && !matmul && full_shape && !d->memory_desc_equal(omd, full)) {
          from = omd;
          omd = full;
          reordered = true;
        }
        operand_args.push_back({DNNL_ARG_ATTR_MULTIPLE_POST_OP(int(k - first_post)) | DNNL_ARG_SRC_1, r, omd, from});
      }
      KILN_RETURN_IF_ERROR(append_post_op(d, attrs.po, op, omd, at));
    }
    KILN_DNNL(at, d->primitive_attr_set_post_ops(attrs.attr, attrs.po));
    return reordered;
  };

  // The primitive, asked for oneDNN's preferred weight and result layouts.
  KILN_ASSIGN_OR_RETURN(Md dst_any, make_md(at, dst_dims, s.out_layout == CpuLayout::kLibrary || !matmul ? dnnl_format_tag_any
                                                                                                          : plain_tag(dst_dims.size())));
  KILN_ASSIGN_OR_RETURN(Md src_any, make_md(at, src_dims, dnnl_format_tag_any));
  Md wplain, wany, bplain, src1;
  const Tensor* wt = nullptr;
  const Tensor* bt = nullptr;
  std::function<dnnl_status_t(dnnl_primitive_desc_t*, const_dnnl_memory_desc_t, const_dnnl_primitive_attr_t)> create;
  if (s.kind == CpuStepKind::kConv) {
    const Tensor& w = constant(1);
    wt = &w;
    const int64_t group = n.attr_int("group", 1);
    Dims wd = w.dims();
    if (group > 1) {
      wd[0] /= group;
      wd.insert(wd.begin(), group);
    }
    KILN_ASSIGN_OR_RETURN(wplain, make_md(at, wd, plain_tag(wd.size())));
    KILN_ASSIGN_OR_RETURN(wany, make_md(at, wd, dnnl_format_tag_any));
    if (has_input(2) && is_const(2)) {
      bt = &constant(2);
      KILN_ASSIGN_OR_RETURN(bplain, make_md(at, Dims{y[1]}, dnnl_a));
    }
    create = [&, geo = window(n, x, Dims(w.dims().begin() + 2, w.dims().end()), y, false)](
                 dnnl_primitive_desc_t* pd, const_dnnl_memory_desc_t src, const_dnnl_primitive_attr_t a) {
      return d->convolution_forward_primitive_desc_create(pd, engine, dnnl_forward_inference, dnnl_convolution_direct, src,
                                                          wany.md, bt ? bplain.md : nullptr, dst_any.md, geo.strides.data(),
                                                          geo.dil.data(), geo.pad_l.data(), geo.pad_r.data(), a);
    };
  } else if (s.kind == CpuStepKind::kDeconv) {
    // ONNX's weight is [C_in, C_out / group, k...]; oneDNN's [group, C_out / group, C_in / group, k...]
    // (no group dim when 1): the same bytes described through strides, reordered once.
    const Tensor& w = constant(1);
    wt = &w;
    const int64_t group = n.attr_int("group", 1);
    const Dims ws = w.dims();
    Dims st(ws.size(), 1);
    for (size_t k = ws.size() - 1; k-- > 0;) st[k] = st[k + 1] * ws[k + 1];
    Dims wd = {ws[1] * group, ws[0]}, wstr = {st[1], st[0]};
    if (group > 1) wd = {group, ws[1], ws[0] / group}, wstr = {ws[0] / group * st[0], st[1], st[0]};
    for (size_t k = 2; k < ws.size(); ++k) {
      wd.push_back(ws[k]);
      wstr.push_back(st[k]);
    }
    dnnl_memory_desc_t wmd = nullptr;
    KILN_DNNL(at, d->memory_desc_create_with_strides(&wmd, int(wd.size()), wd.data(), dnnl_f32, wstr.data()));
    wplain = Md(d, wmd);
    KILN_ASSIGN_OR_RETURN(wany, make_md(at, wd, dnnl_format_tag_any));
    if (has_input(2) && is_const(2)) {
      bt = &constant(2);
      KILN_ASSIGN_OR_RETURN(bplain, make_md(at, Dims{y[1]}, dnnl_a));
    }
    Geometry geo = window(n, x, Dims(ws.begin() + 2, ws.end()), x, false);
    for (size_t k = 0; k < geo.pad_r.size(); ++k) {  // the end padding that yields y's dims (output_padding)
      geo.pad_r[k] = (x[2 + k] - 1) * geo.strides[k] + (ws[2 + k] - 1) * (geo.dil[k] + 1) + 1 - geo.pad_l[k] - y[2 + k];
    }
    create = [&, geo](dnnl_primitive_desc_t* pd, const_dnnl_memory_desc_t src, const_dnnl_primitive_attr_t a) {
      return d->deconvolution_forward_primitive_desc_create(pd, engine, dnnl_forward_inference,
                                                            dnnl_deconvolution_direct, src, wany.md,
                                                            bt ? bplain.md : nullptr, dst_any.md, geo.strides.data(),
                                                            geo.dil.data(), geo.pad_l.data(), geo.pad_r.data(), a);
    };
  } else if (matmul) {
    const Tensor& w = constant(1);
    wt = &w;
    const bool trans_b = n.op == OpKind::kGemm && n.attr_int("transB", 0) != 0;
    const int64_t k = src_dims[1], cols = dst_dims[1];
    dnnl_memory_desc_t wmd = nullptr;
    const Dims wd = {k, cols}, wstrides = trans_b ? Dims{1, k} : Dims{cols, 1};
    KILN_DNNL(at, d->memory_desc_create_with_strides(&wmd, 2, wd.data(), dnnl_f32, wstrides.data()));
    wplain = Md(d, wmd);
    // Weights with K contiguous (B transposed): oneDNN's f32 GEMM runs wide layers (N = 4K) about
    // 1.7x faster than on N-contiguous weights, which "any" picks (bench/RESULTS.md, "twenty-fourth
    // session").
    // A single row (a batch-1 classifier, a decoder step) is a matrix-vector product that streams
    // the weights once: there oneDNN's own blocked layout ("any") is the faster one (ResNet-50's
    // 2048x1000 layer 0.47 -> 0.34 ms, "thirty-second session").
    KILN_ASSIGN_OR_RETURN(wany, make_md(at, wd, src_dims[0] == 1 ? dnnl_format_tag_any : dnnl_ba));
    if (n.op == OpKind::kGemm && has_input(2) && is_const(2)) bt = &constant(2);
    if (row_bias) bt = row_bias;
    if (bt) {
      KILN_ASSIGN_OR_RETURN(bplain, make_md(at, Dims{1, cols}, dnnl_ab));
    }
    create = [&](dnnl_primitive_desc_t* pd, const_dnnl_memory_desc_t, const_dnnl_primitive_attr_t a) {
      return d->matmul_primitive_desc_create(pd, engine, src_plain.md, wany.md, bt ? bplain.md : nullptr, dst_any.md, a);
    };
  } else if (binary) {
    // The other input, row-major, its dims right-aligned to the source's (1s broadcast).
    Dims od = static_dims(n.inputs[1 - sr]);
    od.insert(od.begin(), x.size() - od.size(), 1);
    KILN_ASSIGN_OR_RETURN(src1, make_md(at, od, plain_tag(od.size())));
    const dnnl_alg_kind_t alg = n.op == OpKind::kAdd   ? dnnl_binary_add
                                : n.op == OpKind::kSub ? dnnl_binary_sub
                                : n.op == OpKind::kMul ? dnnl_binary_mul
                                                       : dnnl_binary_div;
    create = [&, alg](dnnl_primitive_desc_t* pd, const_dnnl_memory_desc_t src, const_dnnl_primitive_attr_t a) {
      return d->binary_primitive_desc_create(pd, engine, alg, src, src1.md, dst_any.md, a);
    };
  } else {
    const bool global = n.op == OpKind::kGlobalAveragePool || n.op == OpKind::kGlobalMaxPool;
    const bool max = n.op == OpKind::kMaxPool || n.op == OpKind::kGlobalMaxPool;
    dnnl_alg_kind_t alg = max ? dnnl_pooling_max
                              : (n.attr_int("count_include_pad", 0) ? dnnl_pooling_avg_include_padding
                                                                    : dnnl_pooling_avg_exclude_padding);
    create = [&, alg, geo = window(n, x, n.attr_ints("kernel_shape"), y, global)](
                 dnnl_primitive_desc_t* pd, const_dnnl_memory_desc_t src, const_dnnl_primitive_attr_t a) {
      return d->pooling_forward_primitive_desc_create(pd, engine, dnnl_forward_inference, alg, src, dst_any.md,
                                                      geo.strides.data(), geo.kernel.data(), geo.dil.data(),
                                                      geo.pad_l.data(), geo.pad_r.data(), a);
    };
  }
  auto is_ref = [&](const Pd& pd) { return std::string_view(impl_name(d, pd.p)).starts_with("ref"); };
  Pd pd(d);
  {
    Attr attrs(d);
    KILN_ASSIGN_OR_RETURN(bool unused, make_attr(attrs, nullptr));
    (void)unused;
    if (create(&pd.p, src_have, attrs.attr) != dnnl_success) {
      KILN_DNNL(at, create(&pd.p, src_any.md, attrs.attr));
    }
    // A convolution handed a row-major source takes oneDNN's im2col GEMM (x64:gemm:jit), several
    // times slower than its blocked kernels for a depthwise 7x7 or a 3x3 (ConvNeXt, a YOLO neck
    // behind Slices); the blocked kernel with the source reordered first is taken instead.
    const bool conv = s.kind == CpuStepKind::kConv || s.kind == CpuStepKind::kDeconv;
    if (conv && std::string_view(impl_name(d, pd.p)).find("gemm") != std::string_view::npos) {
      Pd blocked(d);
      if (create(&blocked.p, src_any.md, attrs.attr) == dnnl_success &&
          std::string_view(impl_name(d, blocked.p)).find("gemm") == std::string_view::npos && !is_ref(blocked)) {
        std::swap(pd.p, blocked.p);
      }
    }
  }
  // oneDNN falls back to its reference implementation (naive loops, 100x slower or worse) when no
  // fast kernel takes the combination, typically a residual operand in row-major order beside a
  // blocked result, or a source layout it was handed. Then: the layout its fast kernels write for
  // this step (a probe without post-ops), row-major full-shape operands reordered into it, and the
  // source in whatever layout the primitive asks for.
  if (is_ref(pd) && !matmul) {
    Pd probe(d);
    Attr bare(d);
    KILN_RETURN_IF_ERROR(bare.create(at));
    if (create(&probe.p, src_any.md, bare.attr) == dnnl_success && !is_ref(probe)) {
      dnnl_memory_desc_t full = nullptr;
      KILN_DNNL(at, d->memory_desc_clone(&full, d->primitive_desc_query_md(probe.p, dnnl_query_dst_md, 0)));
      operand_mds.emplace_back(d, full);
      Attr attrs(d);
      KILN_ASSIGN_OR_RETURN(bool reordered, make_attr(attrs, full));
      Pd retry(d);
      if (create(&retry.p, src_any.md, attrs.attr) == dnnl_success && !is_ref(retry)) {
        std::swap(pd.p, retry.p);
      } else if (reordered) {
        Attr again(d);  // the operands as they were
        KILN_ASSIGN_OR_RETURN(bool unused, make_attr(again, nullptr));
        (void)unused;
      }
    }
  }
  impls[i] = fmt::format("oneDNN {}", impl_name(d, pd.p));
  KILN_ASSIGN_OR_RETURN(run.main.p, primitive(at, pd.p));

  // Source: bound directly when the primitive reads the layout the value is in, else reordered.
  const_dnnl_memory_desc_t src_want = d->primitive_desc_query_md(pd.p, dnnl_query_src_md, 0);
  if (d->memory_desc_equal(src_want, src_have)) {
    KILN_ASSIGN_OR_RETURN(run.src_mem, memory(at, src_want));
    run.bind.push_back({run.src_mem, sr});
  } else {
    KILN_ASSIGN_OR_RETURN(run.src_reorder, reorder(at, src_have, src_want, &run.src_user, &run.src_reorder_out));
    run.bind.push_back({run.src_user, sr});
    run.src_mem = run.src_reorder_out;
    src_scratch.resize(d->memory_desc_get_size(src_want));
  }
  run.main.args.push_back({DNNL_ARG_SRC, run.src_mem});
  if (wt) {
    const_dnnl_memory_desc_t wwant = d->primitive_desc_query_md(pd.p, dnnl_query_weights_md, 0);
    KILN_ASSIGN_OR_RETURN(dnnl_memory_t wm, weight(at, *wt, wplain.md, wwant));
    run.main.args.push_back({DNNL_ARG_WEIGHTS, wm});
  }
  if (bt) {
    KILN_ASSIGN_OR_RETURN(dnnl_memory_t bm, memory(at, bplain.md, const_cast<void*>(bt->raw())));
    run.main.args.push_back({DNNL_ARG_BIAS, bm});
  }
  if (binary) {
    KILN_ASSIGN_OR_RETURN(dnnl_memory_t m, memory(at, src1.md));
    run.main.args.push_back({DNNL_ARG_SRC_1, m});
    run.bind.push_back({m, 1 - sr});
  }
  for (const OperandArg& oa : operand_args) {
    if (oa.from) {  // reordered into the primitive's layout, in a buffer of the step's own
      dnnl_memory_t in = nullptr, out = nullptr;
      KILN_ASSIGN_OR_RETURN(Prim r, reorder(at, oa.from, oa.md, &in, &out));
      Buffer& b = run.operand_scratch.emplace_back();
      b.resize(d->memory_desc_get_size(oa.md));
      KILN_DNNL(at, d->memory_set_data_handle(out, b.p.get()));
      run.before.push_back(std::move(r));
      run.bind.push_back({in, oa.read});
      run.main.args.push_back({oa.arg, out});
      continue;
    }
    KILN_ASSIGN_OR_RETURN(dnnl_memory_t om, memory(at, oa.md));
    run.main.args.push_back({oa.arg, om});
    run.bind.push_back({om, oa.read});
  }
  // Result: in the primitive's layout when the plan keeps it (later steps read that descriptor),
  // else reordered to row-major when the primitive chose another.
  const_dnnl_memory_desc_t dst_got = d->primitive_desc_query_md(pd.p, dnnl_query_dst_md, 0);
  KILN_ASSIGN_OR_RETURN(run.dst_mem, memory(at, dst_got));
  run.main.args.push_back({DNNL_ARG_DST, run.dst_mem});
  return place_result(at, s, run, dst_got, dst_plain.md);
}

namespace {

Status execute(const DnnlLib* d, dnnl_stream_t stream, const Prim& p, const std::string& at) {
  if (p.host) {  // after the primitives before it (the stream is in order, CPU primitives synchronous)
    KILN_DNNL(at, d->stream_wait(stream));
    p.host();
    return Status::ok();
  }
  dnnl_exec_arg_t fixed[16];
  std::vector<dnnl_exec_arg_t> many;  // a Concat of more than 15 inputs
  if (p.args.size() > 16) many.resize(p.args.size());
  dnnl_exec_arg_t* args = many.empty() ? fixed : many.data();
  int n = 0;
  for (const auto& [k, m] : p.args) args[n++] = {k, m};
  KILN_DNNL(at, d->primitive_execute(p.p, stream, n, args));
  return Status::ok();
}

}  // namespace

Expected<std::vector<Data>> CpuRunner::Impl::run(std::vector<Data> inputs, std::vector<double>* step_ms) {
  const Plan& p = *plan;
  const Graph& g = *p.graph;
  KILN_RETURN_IF_ERROR(check_inputs(g, inputs));
  std::vector<Data> slots(p.slots);
  std::vector<Data> constants;
  constants.reserve(p.constants.size());
  for (const Value* c : p.constants) constants.emplace_back(*c->constant);
  auto at = [&](const ValueRef& r) -> const Data* {
    switch (r.kind) {
      case ValueRef::Kind::kNone: return nullptr;
      case ValueRef::Kind::kSlot: return &slots[r.index];
      case ValueRef::Kind::kConstant: return &constants[r.index];
    }
    return nullptr;
  };
  for (size_t i = 0; i < p.inputs.size(); ++i) {
    if (p.inputs[i].kind == ValueRef::Kind::kSlot && i < inputs.size()) slots[p.inputs[i].index] = std::move(inputs[i]);
  }
  ValueLookup outer = [&](const Value* v) -> const Data* {
    auto it = by_value.find(v);
    return it != by_value.end() ? at(it->second) : nullptr;
  };
  if (step_ms) step_ms->assign(cp->steps.size(), 0.0);
  for (size_t i = 0; i < cp->steps.size(); ++i) {
    const CpuStep& s = cp->steps[i];
    auto t0 = std::chrono::steady_clock::now();
    if (s.kind == CpuStepKind::kHost) {
      const PlanStep& ps = p.steps[s.index];
      std::vector<const Data*> ins;
      for (const ValueRef& r : ps.inputs) ins.push_back(at(r));
      KILN_ASSIGN_OR_RETURN(std::vector<Data> outs, run_node_on_cpu(*g.nodes[ps.node], std::move(ins), outer));
      for (size_t k = 0; k < ps.outputs.size(); ++k) {
        // A view of an arena result (a Reshape, an If returning an outer value) would outlive it.
        if (outs[k].is_tensor()) KILN_RETURN_IF_ERROR(copy_out_of_arena(outs[k].tensor));
        for (Tensor& t : outs[k].sequence) KILN_RETURN_IF_ERROR(copy_out_of_arena(t));
        if (ps.outputs[k].kind == ValueRef::Kind::kSlot) slots[ps.outputs[k].index] = std::move(outs[k]);
      }
    } else {
      const StepRun& run = runs[i];
      const std::string& where = impls[i];
      for (const auto& [mem, r] : run.bind) {
        const Data* v = at(s.reads[r]);
        if (!v || !v->is_tensor()) return KILN_ERROR(kInternal, "step {}: an operand is missing", i);
        KILN_DNNL(where, d->memory_set_data_handle(mem, const_cast<void*>(v->tensor.raw())));
      }
      const bool library = s.out_layout == CpuLayout::kLibrary;
      const Dims out_dims = library ? Dims{int64_t(run.out_bytes)} : run.out_dims;
      const DType out_type = library ? DType::kUInt8 : DType::kFloat32;
      Tensor out;
      if (arena_offset[i] != kNoArena) {
        out = Tensor::view(out_type, out_dims, arena, arena->p.get() + arena_offset[i]);
      } else {
        std::shared_ptr<Buffer>& buf = out_cache[i];
        if (!buf || buf.use_count() != 1 || buf->size < out_bytes(i)) {
          buf = std::make_shared<Buffer>();
          buf->resize(out_bytes(i));
        }
        out = Tensor::view(out_type, out_dims, buf, buf->p.get());
      }
      if (run.loop) {  // kiln's own loop over the reads' row-major buffers
        std::vector<const float*> ins;
        for (const ValueRef& r : s.reads) {
          const Data* v = at(r);
          if (!v || !v->is_tensor()) return KILN_ERROR(kInternal, "step {}: an operand is missing", i);
          ins.push_back(static_cast<const float*>(v->tensor.raw()));
        }
        run.loop(ins, static_cast<float*>(out.raw()));
      } else {
        if (run.src_reorder.p) {
          KILN_DNNL(where, d->memory_set_data_handle(run.src_reorder_out, src_scratch.p.get()));
          KILN_RETURN_IF_ERROR(execute(d, stream, run.src_reorder, where));
        }
        for (const Prim& b : run.before) KILN_RETURN_IF_ERROR(execute(d, stream, b, where));
        if (run.dst_reorder.p) {
          KILN_DNNL(where, d->memory_set_data_handle(run.dst_mem, dst_scratch.p.get()));
          KILN_DNNL(where, d->memory_set_data_handle(run.dst_reorder_in, dst_scratch.p.get()));
          KILN_DNNL(where, d->memory_set_data_handle(run.dst_user, out.raw()));
        } else {
          KILN_DNNL(where, d->memory_set_data_handle(run.dst_mem, out.raw()));
        }
        KILN_RETURN_IF_ERROR(execute(d, stream, run.main, where));
        for (const Prim& a : run.after) KILN_RETURN_IF_ERROR(execute(d, stream, a, where));
        if (run.dst_reorder.p) KILN_RETURN_IF_ERROR(execute(d, stream, run.dst_reorder, where));
        KILN_DNNL(where, d->stream_wait(stream));
      }
      slots[s.out.index] = Data(std::move(out));
    }
    for (uint32_t f : s.frees) slots[f] = Data();
    if (step_ms) (*step_ms)[i] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  std::vector<Data> outs;
  for (const ValueRef& r : p.outputs) outs.push_back(*at(r));
  return outs;
}

bool fast_cpu_available(std::string* what) {
  std::string why;
  const DnnlLib* d = dnnl_lib(&why);
  if (what) *what = d ? fmt::format("oneDNN {} ({})", d->version_text, d->path) : why;
  return d != nullptr;
}

Expected<std::unique_ptr<CpuRunner>> CpuRunner::create(std::shared_ptr<const Plan> plan, std::shared_ptr<const CpuPlan> cp) {
  std::string why;
  const DnnlLib* d = dnnl_lib(&why);
  if (!d) return KILN_ERROR(kUnsupported, "{}", why);
  auto impl = std::make_unique<Impl>();
  impl->d = d;
  impl->plan = std::move(plan);
  impl->cp = std::move(cp);
  try {
    KILN_RETURN_IF_ERROR(on_compute_thread<Status>([&] { return impl->prepare(); }));
  } catch (const std::bad_alloc&) {
    return KILN_ERROR(kOutOfMemory, "the fast CPU backend: out of host memory for the engine's weights and activations");
  }
  return std::unique_ptr<CpuRunner>(new CpuRunner(std::move(impl)));
}

#else  // no oneDNN headers: the runner cannot exist

struct CpuRunner::Impl {
  std::vector<std::string> impls;
  std::vector<int> weights;
  Expected<std::vector<Data>> run(std::vector<Data>, std::vector<double>*) {
    return KILN_ERROR(kUnsupported, "this kiln was built without oneDNN");
  }
};

bool fast_cpu_available(std::string* what) { return dnnl_lib(what) != nullptr; }

Expected<std::unique_ptr<CpuRunner>> CpuRunner::create(std::shared_ptr<const Plan>, std::shared_ptr<const CpuPlan>) {
  std::string why;
  dnnl_lib(&why);
  return KILN_ERROR(kUnsupported, "{}", why);
}

#endif

CpuRunner::CpuRunner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CpuRunner::~CpuRunner() = default;
Expected<std::vector<Data>> CpuRunner::run(std::vector<Data> inputs, std::vector<double>* step_ms) {
  try {
    return on_compute_thread<Expected<std::vector<Data>>>([&] { return impl_->run(std::move(inputs), step_ms); });
  } catch (const std::bad_alloc&) {
    return KILN_ERROR(kOutOfMemory, "the fast CPU backend: out of host memory for a run's results");
  }
}
const std::vector<std::string>& CpuRunner::impls() const { return impl_->impls; }
size_t CpuRunner::weight_bytes() const {
  size_t b = 0;
#if KILN_HAVE_DNNL
  for (const auto& w : impl_->weights) b += w.size;
#endif
  return b;
}
size_t CpuRunner::arena_bytes() const {
#if KILN_HAVE_DNNL
  if (impl_->arena) return impl_->arena->size;
#endif
  return 0;
}

}  // namespace kiln
