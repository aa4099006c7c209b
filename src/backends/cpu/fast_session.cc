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
#include "backends/cpu/dnnl_lib.h"

namespace kiln {

#if KILN_HAVE_DNNL

namespace {

// Every oneDNN call goes through here: a failure names the call and the node it was for.
#define KILN_DNNL(node, call)                                                                              \
  do {                                                                                                     \
    dnnl_status_t st_ = (call);                                                                            \
    if (st_ != dnnl_success) {                                                                             \
      return KILN_ERROR(kUnsupported, "{}: oneDNN {} failed (status {})", (node), #call, int(st_));       \
    }                                                                                                      \
  } while (0)

using Dims = std::vector<int64_t>;

dnnl_format_tag_t plain_tag(size_t rank) {
  switch (rank) {
    case 1: return dnnl_a;
    case 2: return dnnl_ab;
    case 3: return dnnl_abc;
    case 4: return dnnl_abcd;
    case 5: return dnnl_abcde;
    default: return dnnl_abcdef;
  }
}

// Owns a memory descriptor.
struct Md {
  const DnnlLib* d = nullptr;
  dnnl_memory_desc_t md = nullptr;
  Md() = default;
  Md(const DnnlLib* lib, dnnl_memory_desc_t m) : d(lib), md(m) {}
  Md(Md&& o) noexcept : d(o.d), md(o.md) { o.md = nullptr; }
  Md& operator=(Md&& o) noexcept {
    std::swap(d, o.d);
    std::swap(md, o.md);
    return *this;
  }
  ~Md() {
    if (md) d->memory_desc_destroy(md);
  }
};

// A 64-byte aligned buffer.
struct Buffer {
  std::unique_ptr<char, void (*)(void*)> p{nullptr, std::free};
  size_t size = 0;
  void resize(size_t n) {
    if (n <= size) return;
    p.reset(static_cast<char*>(std::aligned_alloc(64, (n + 63) / 64 * 64)));
    size = n;
  }
};

// A primitive attribute and the post-op list it will take, both freed with it.
struct Attr {
  const DnnlLib* d;
  dnnl_primitive_attr_t attr = nullptr;
  dnnl_post_ops_t po = nullptr;
  explicit Attr(const DnnlLib* lib) : d(lib) {}
  Attr(const Attr&) = delete;
  Attr& operator=(const Attr&) = delete;
  ~Attr() {
    if (po) d->post_ops_destroy(po);
    if (attr) d->primitive_attr_destroy(attr);
  }
  Status create(const std::string& at) {
    KILN_DNNL(at, d->primitive_attr_create(&attr));
    KILN_DNNL(at, d->post_ops_create(&po));
    return Status::ok();
  }
};

// A primitive with the memories it executes on (handles bound per run).
struct Prim {
  dnnl_primitive_t p = nullptr;
  std::vector<std::pair<int, dnnl_memory_t>> args;  // (DNNL_ARG_*, memory)
};

}  // namespace

struct CpuRunner::Impl {
  const DnnlLib* d = nullptr;
  std::shared_ptr<const Plan> plan;
  std::shared_ptr<const CpuPlan> cp;
  dnnl_engine_t engine = nullptr;
  dnnl_stream_t stream = nullptr;
  std::vector<std::string> impls;
  std::vector<dnnl_memory_t> memories;
  std::vector<dnnl_primitive_t> primitives;
  std::vector<Buffer> weights;  // reordered weights, owned

  // Per step: an optional reorder of the source into `src_scratch`, the primitive, an optional
  // reorder of its result into the plain output.
  struct StepRun {
    Prim src_reorder, main, dst_reorder;
    std::vector<Prim> before;  // run before `main` (operands reordered into its layout)
    std::vector<Prim> after;   // run after `main` (attention's softmax and second matmul)
    std::deque<Buffer> operand_scratch;  // where `before` writes
    Buffer scratch;           // the step's own intermediate (attention's scores)
    dnnl_memory_t src_user = nullptr, src_mem = nullptr, dst_mem = nullptr, dst_user = nullptr;
    dnnl_memory_t src_reorder_out = nullptr, dst_reorder_in = nullptr;
    size_t out_bytes = 0;                     // a kLibrary output's size
    std::vector<int64_t> out_dims;
    // (memory, index into reads) bound to each read's buffer; weights/bias are bound once.
    std::vector<std::pair<dnnl_memory_t, size_t>> bind;
  };
  std::vector<StepRun> runs;
  // Per step, the buffer its result went to last run: written again when nothing else holds it
  // (a returned output, or a view a host step made of it, keeps it; the step then takes a new one).
  std::vector<std::shared_ptr<Buffer>> out_cache;
  // Where each top-level value lives, for subgraph bodies of host steps (by pointer).
  std::unordered_map<const Value*, ValueRef> by_value;
  std::vector<const dnnl_memory_desc_t*> slot_md;  // per slot: the library layout it is written in
  std::deque<Md> mds;                               // owned descriptors slot_md points into
  Buffer src_scratch, dst_scratch;

  ~Impl() {
    if (!d) return;
    for (dnnl_primitive_t p : primitives) d->primitive_destroy(p);
    for (dnnl_memory_t m : memories) d->memory_destroy(m);
    if (stream) d->stream_destroy(stream);
    if (engine) d->engine_destroy(engine);
  }

  Expected<Md> make_md(const std::string& at, const Dims& dims, dnnl_format_tag_t tag) {
    dnnl_memory_desc_t md = nullptr;
    KILN_DNNL(at, d->memory_desc_create_with_tag(&md, int(dims.size()), dims.data(), dnnl_f32, tag));
    return Md(d, md);
  }
  Expected<dnnl_memory_t> memory(const std::string& at, const_dnnl_memory_desc_t md, void* handle = DNNL_MEMORY_NONE) {
    dnnl_memory_t m = nullptr;
    KILN_DNNL(at, d->memory_create(&m, md, engine, handle));
    memories.push_back(m);
    return m;
  }
  Expected<dnnl_primitive_t> primitive(const std::string& at, const_dnnl_primitive_desc_t pd) {
    dnnl_primitive_t p = nullptr;
    KILN_DNNL(at, d->primitive_create(&p, pd));
    primitives.push_back(p);
    return p;
  }
  // A reorder primitive from `from` to `to` (memories created here, handles bound later).
  Expected<Prim> reorder(const std::string& at, const_dnnl_memory_desc_t from, const_dnnl_memory_desc_t to,
                         dnnl_memory_t* in, dnnl_memory_t* out) {
    dnnl_primitive_desc_t pd = nullptr;
    KILN_DNNL(at, d->reorder_primitive_desc_create(&pd, from, engine, to, engine, nullptr));
    auto prim = primitive(at, pd);
    d->primitive_desc_destroy(pd);
    if (!prim) return prim.status();
    KILN_ASSIGN_OR_RETURN(*in, memory(at, from));
    KILN_ASSIGN_OR_RETURN(*out, memory(at, to));
    Prim r;
    r.p = *prim;
    r.args = {{DNNL_ARG_FROM, *in}, {DNNL_ARG_TO, *out}};
    return r;
  }
  // A constant weight reordered once from its plain layout into `want`.
  Expected<dnnl_memory_t> weight(const std::string& at, const Tensor& t, const_dnnl_memory_desc_t plain,
                                 const_dnnl_memory_desc_t want) {
    Buffer b;
    b.resize(d->memory_desc_get_size(want));
    dnnl_memory_t in = nullptr, out = nullptr;
    KILN_ASSIGN_OR_RETURN(Prim r, reorder(at, plain, want, &in, &out));
    KILN_DNNL(at, d->memory_set_data_handle(in, const_cast<void*>(t.raw())));
    KILN_DNNL(at, d->memory_set_data_handle(out, b.p.get()));
    std::vector<dnnl_exec_arg_t> args;
    for (auto& [k, m] : r.args) args.push_back({k, m});
    KILN_DNNL(at, d->primitive_execute(r.p, stream, int(args.size()), args.data()));
    KILN_DNNL(at, d->stream_wait(stream));
    weights.push_back(std::move(b));
    return out;
  }

  Status prepare();
  Status prepare_step(size_t i);
  Status prepare_attention(size_t i);
  Status prepare_norm(size_t i);
  Status prepare_transpose(size_t i);
  Status prepare_batch_matmul(size_t i);
  Status prepare_concat(size_t i);
  Status prepare_batch_norm(size_t i);
  Expected<std::vector<Data>> run(std::vector<Data> inputs, std::vector<double>* step_ms);
};

namespace {

const char* impl_name(const DnnlLib* d, const_dnnl_primitive_desc_t pd) {
  const char* s = nullptr;
  if (d->primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &s) != dnnl_success || !s) return "?";
  return s;
}

Status append_post_op(const DnnlLib* d, dnnl_post_ops_t po, const CpuPostOp& op, const_dnnl_memory_desc_t operand,
                      const std::string& at) {
  auto elt = [&](dnnl_alg_kind_t alg, float a, float b) -> Status {
    KILN_DNNL(at, d->post_ops_append_eltwise(po, alg, a, b));
    return Status::ok();
  };
  switch (op.kind) {
    case CpuPostKind::kRelu: return elt(dnnl_eltwise_relu, 0, 0);
    case CpuPostKind::kLeakyRelu: return elt(dnnl_eltwise_relu, op.alpha, 0);
    case CpuPostKind::kClip: return elt(dnnl_eltwise_clip_v2, op.alpha, op.beta);
    case CpuPostKind::kSigmoid: return elt(dnnl_eltwise_logistic, 0, 0);
    case CpuPostKind::kTanh: return elt(dnnl_eltwise_tanh, 0, 0);
    case CpuPostKind::kElu: return elt(dnnl_eltwise_elu, op.alpha, 0);
    case CpuPostKind::kHardSigmoid: return elt(dnnl_eltwise_hardsigmoid, op.alpha, op.beta);
    case CpuPostKind::kHardSwish: return elt(dnnl_eltwise_hardswish, 1.f / 6.f, 0.5f);
    case CpuPostKind::kGeluErf: return elt(dnnl_eltwise_gelu_erf, 0, 0);
    case CpuPostKind::kGeluTanh: return elt(dnnl_eltwise_gelu_tanh, 0, 0);
    case CpuPostKind::kSwish: return elt(dnnl_eltwise_swish, op.alpha, 0);
    case CpuPostKind::kSoftplus: return elt(dnnl_eltwise_soft_relu, 1.f, 0);
    case CpuPostKind::kMish: return elt(dnnl_eltwise_mish, 0, 0);
    case CpuPostKind::kAdd:
      KILN_DNNL(at, d->post_ops_append_binary(po, dnnl_binary_add, operand));
      return Status::ok();
  }
  return KILN_ERROR(kInternal, "{}: unknown post-op", at);
}

Dims static_dims(const Value* v) { return *v->type.shape->static_dims(); }
int64_t numel(const Dims& d) {
  int64_t n = 1;
  for (int64_t x : d) n *= x;
  return n;
}

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
    KILN_ASSIGN_OR_RETURN(wany, make_md(at, wd, dnnl_ba));
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
  struct Pd {
    const DnnlLib* d;
    dnnl_primitive_desc_t p = nullptr;
    ~Pd() {
      if (p) d->primitive_desc_destroy(p);
    }
  };
  auto is_ref = [&](const Pd& pd) { return std::string_view(impl_name(d, pd.p)).starts_with("ref"); };
  Pd pd{d};
  {
    Attr attrs(d);
    KILN_ASSIGN_OR_RETURN(bool unused, make_attr(attrs, nullptr));
    (void)unused;
    if (create(&pd.p, src_have, attrs.attr) != dnnl_success) {
      KILN_DNNL(at, create(&pd.p, src_any.md, attrs.attr));
    }
  }
  // oneDNN falls back to its reference implementation (naive loops, 100x slower or worse) when no
  // fast kernel takes the combination, typically a residual operand in row-major order beside a
  // blocked result, or a source layout it was handed. Then: the layout its fast kernels write for
  // this step (a probe without post-ops), row-major full-shape operands reordered into it, and the
  // source in whatever layout the primitive asks for.
  if (is_ref(pd) && !matmul) {
    Pd probe{d};
    Attr bare(d);
    KILN_RETURN_IF_ERROR(bare.create(at));
    if (create(&probe.p, src_any.md, bare.attr) == dnnl_success && !is_ref(probe)) {
      dnnl_memory_desc_t full = nullptr;
      KILN_DNNL(at, d->memory_desc_clone(&full, d->primitive_desc_query_md(probe.p, dnnl_query_dst_md, 0)));
      operand_mds.emplace_back(d, full);
      Attr attrs(d);
      KILN_ASSIGN_OR_RETURN(bool reordered, make_attr(attrs, full));
      Pd retry{d};
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
  if (s.out_layout == CpuLayout::kLibrary) {
    dnnl_memory_desc_t keep = nullptr;
    KILN_DNNL(at, d->memory_desc_clone(&keep, dst_got));
    mds.emplace_back(d, keep);
    slot_md[s.out.index] = &mds.back().md;
    run.out_bytes = d->memory_desc_get_size(dst_got);
  } else if (!d->memory_desc_equal(dst_got, dst_plain.md)) {
    KILN_ASSIGN_OR_RETURN(run.dst_reorder, reorder(at, dst_got, dst_plain.md, &run.dst_reorder_in, &run.dst_user));
    dst_scratch.resize(d->memory_desc_get_size(dst_got));
  }
  return Status::ok();
}

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
    dnnl_primitive_desc_t probe = nullptr;
    KILN_DNNL(at, d->matmul_primitive_desc_create(&probe, engine, q_md.md, kt_md.md, nullptr, s_md.md, attr));
    separate_mask = std::string_view(impl_name(d, probe)).starts_with("ref");
    d->primitive_desc_destroy(probe);
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
  dnnl_primitive_desc_t pd = nullptr;
  KILN_DNNL(at, d->matmul_primitive_desc_create(&pd, engine, a_md.md, b_md.md, nullptr, c_md.md, nullptr));
  impls[i] = fmt::format("oneDNN {}", impl_name(d, pd));
  auto prim = primitive(at, pd);
  d->primitive_desc_destroy(pd);
  KILN_ASSIGN_OR_RETURN(run.main.p, std::move(prim));
  KILN_ASSIGN_OR_RETURN(dnnl_memory_t a_mem, memory(at, a_md.md));
  KILN_ASSIGN_OR_RETURN(dnnl_memory_t b_mem, memory(at, b_md.md));
  KILN_ASSIGN_OR_RETURN(run.dst_mem, memory(at, c_md.md));
  run.main.args = {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, run.dst_mem}};
  run.bind = {{a_mem, 0}, {b_mem, 1}};
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
  dnnl_primitive_desc_t raw = nullptr;
  KILN_DNNL(at, d->concat_primitive_desc_create(&raw, engine, dst.md, int(srcs.size()), int(axis), srcs.data(), nullptr));
  std::unique_ptr<std::remove_pointer_t<dnnl_primitive_desc_t>, std::function<void(dnnl_primitive_desc_t)>> pd(
      raw, [this](dnnl_primitive_desc_t p) { d->primitive_desc_destroy(p); });
  impls[i] = fmt::format("oneDNN {}", impl_name(d, pd.get()));
  KILN_ASSIGN_OR_RETURN(run.main.p, primitive(at, pd.get()));
  const_dnnl_memory_desc_t got = d->primitive_desc_query_md(pd.get(), dnnl_query_dst_md, 0);
  KILN_ASSIGN_OR_RETURN(run.dst_mem, memory(at, got));
  if (library) {  // later steps read this descriptor
    dnnl_memory_desc_t keep = nullptr;
    KILN_DNNL(at, d->memory_desc_clone(&keep, got));
    mds.emplace_back(d, keep);
    slot_md[s.out.index] = &mds.back().md;
    run.out_bytes = d->memory_desc_get_size(got);
  }
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
  dnnl_primitive_desc_t raw = nullptr;
  KILN_DNNL(at, d->batch_normalization_forward_primitive_desc_create(&raw, engine, dnnl_forward_inference, src, src,
                                                                     n.attr_float("epsilon", 1e-5f), flags, nullptr));
  std::unique_ptr<std::remove_pointer_t<dnnl_primitive_desc_t>, std::function<void(dnnl_primitive_desc_t)>> pd(
      raw, [this](dnnl_primitive_desc_t p) { d->primitive_desc_destroy(p); });
  impls[i] = fmt::format("oneDNN {}", impl_name(d, pd.get()));
  KILN_ASSIGN_OR_RETURN(run.main.p, primitive(at, pd.get()));
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
  if (s.out_layout == CpuLayout::kLibrary) {
    dnnl_memory_desc_t keep = nullptr;
    KILN_DNNL(at, d->memory_desc_clone(&keep, src));
    mds.emplace_back(d, keep);
    slot_md[s.out.index] = &mds.back().md;
    run.out_bytes = d->memory_desc_get_size(src);
  } else if (!d->memory_desc_equal(src, plain.md)) {
    KILN_ASSIGN_OR_RETURN(run.dst_reorder, reorder(at, src, plain.md, &run.dst_reorder_in, &run.dst_user));
    dst_scratch.resize(d->memory_desc_get_size(src));
  }
  return Status::ok();
}

namespace {

Status execute(const DnnlLib* d, dnnl_stream_t stream, const Prim& p, const std::string& at) {
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
      const size_t out_bytes = library ? run.out_bytes : size_t(numel(run.out_dims)) * sizeof(float);
      std::shared_ptr<Buffer>& buf = out_cache[i];
      if (!buf || buf.use_count() != 1 || buf->size < out_bytes) {
        buf = std::make_shared<Buffer>();
        buf->resize(out_bytes);
      }
      Tensor out = Tensor::view(library ? DType::kUInt8 : DType::kFloat32, out_dims, buf, buf->p.get());
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
  KILN_RETURN_IF_ERROR(impl->prepare());
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
  return impl_->run(std::move(inputs), step_ms);
}
const std::vector<std::string>& CpuRunner::impls() const { return impl_->impls; }
size_t CpuRunner::weight_bytes() const {
  size_t b = 0;
#if KILN_HAVE_DNNL
  for (const auto& w : impl_->weights) b += w.size;
#endif
  return b;
}

}  // namespace kiln
