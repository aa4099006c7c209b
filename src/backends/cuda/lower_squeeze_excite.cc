// Squeeze-and-excitation's gate as one kernel (kernels/squeeze_excite.cu): the spatial mean of x,
// a fully connected layer, an activation, a second layer and the gating activation, as exporters
// write it for EfficientNet, MobileNetV3, RegNetY, SE-ResNet (torchvision and timm):
//
//   GlobalAveragePool(x) | ReduceMean(x, spatial axes)    [N, C, 1, 1] (or [N, C] without keepdims)
//   [Flatten | Reshape | Squeeze to [N, C]]
//   Conv 1x1 (W1 [Cr, C, 1, 1]) | Gemm (W1 constant)       + bias
//   [Relu | SiLU (Sigmoid and Mul, or the fused form) | HardSwish | Clip | ...]
//   Conv 1x1 (W2 [C, Cr, 1, 1]) | Gemm                     + bias
//   [Sigmoid | HardSigmoid | ...]                           -> g, read by the Mul that scales x
//
// Each layer at batch 1 was a GEMM of one row, and every activation its own launch: five to seven
// launches of a few microseconds for microseconds of work. Every intermediate must be read by the
// next node alone; g may be read by anything. The match is complete before anything is claimed,
// so the lowering itself cannot decline for want of support (the chain's nodes have no steps of
// their own to fall back on).
#include "backends/cuda/lower.h"

namespace kiln::cuda {

namespace {

// What one activation node (or the Sigmoid-and-Mul pair of SiLU) after value v applies.
struct ActMatch {
  k::Unary op = k::Unary::kIdentity;
  k::UnaryParams p;
  std::vector<const Node*> nodes;
  const Value* out = nullptr;
};

bool same_dims(const Value* a, const Value* b) {
  return a->type.shape && b->type.shape && a->type.shape->static_dims() &&
         a->type.shape->static_dims() == b->type.shape->static_dims();
}

// The activation reading v (v's only reader, or SiLU's two), if the kernel applies it.
std::optional<ActMatch> match_act(const Lowering& L, const Value* v) {
  const std::vector<const Node*>& rd = L.readers(v);
  if (L.is_graph_output(v)) return std::nullopt;
  ActMatch m;
  if (rd.size() == 2) {  // SiLU as exporters write it: Mul(v, Sigmoid(v))
    const Node* sig = rd[0]->op == OpKind::kSigmoid ? rd[0] : rd[1];
    const Node* mul = sig == rd[0] ? rd[1] : rd[0];
    if (sig->op != OpKind::kSigmoid || mul->op != OpKind::kMul || mul->inputs.size() != 2 ||
        L.only_consumer(sig->outputs[0]) != mul) {
      return std::nullopt;
    }
    const Value *a = mul->inputs[0], *b = mul->inputs[1], *s = sig->outputs[0];
    if (!((a == v && b == s) || (a == s && b == v)) || !same_dims(v, mul->outputs[0])) return std::nullopt;
    m.op = k::Unary::kSilu;
    m.nodes = {sig, mul};
    m.out = mul->outputs[0];
    return m;
  }
  if (rd.size() != 1) return std::nullopt;
  const Node& n = *rd[0];
  if (n.inputs.empty() || n.inputs[0] != v || n.outputs.size() != 1 || !same_dims(v, n.outputs[0])) return std::nullopt;
  switch (n.op) {
    case OpKind::kRelu: m.op = k::Unary::kRelu; break;
    case OpKind::kSigmoid: m.op = k::Unary::kSigmoid; break;
    case OpKind::kTanh: m.op = k::Unary::kTanh; break;
    case OpKind::kHardSwish: m.op = k::Unary::kHardSwish; break;
    case OpKind::kHardSigmoid:
      m.op = k::Unary::kHardSigmoid;
      m.p.a = n.attr_float("alpha", 0.2f);
      m.p.b = n.attr_float("beta", 0.5f);
      break;
    case OpKind::kLeakyRelu:
      m.op = k::Unary::kLeakyRelu;
      m.p.a = n.attr_float("alpha", 0.01f);
      break;
    case OpKind::kGelu:
      m.op = n.attr_string("approximate", "none") == "tanh" ? k::Unary::kGeluTanh : k::Unary::kGeluErf;
      break;
    case OpKind::kClip: {
      m.op = k::Unary::kClip;
      m.p.a = -INFINITY;
      m.p.b = INFINITY;
      for (size_t i = 1; i < 3; ++i) {
        if (!n.has_input(i)) continue;
        const Tensor* c = L.constant(n.inputs[i]);
        if (!c || c->numel() != 1) return std::nullopt;
        (i == 1 ? m.p.a : m.p.b) = float(c->as_double(0));
      }
      break;
    }
    case OpKind::kFusedElementwise:
      if (!is_silu(n)) return std::nullopt;
      m.op = k::Unary::kSilu;
      break;
    default: return std::nullopt;
  }
  m.nodes = {&n};
  m.out = n.outputs[0];
  return m;
}

// A fully connected layer reading v ([N, cin] or [N, cin, 1...]) as a host f32 [cout, cin] weight
// and [cout] bias (empty: none): a 1x1 Conv or a Gemm with constant operands.
struct FcMatch {
  const Node* node = nullptr;
  Tensor w, b;
  int64_t cout = 0;
};

// Small layers only: the kernel's layers are a group of lanes per output row between grid
// barriers, which beats the library GEMMs' launches up to about 64k multiply-adds a layer and loses
// past ~100k (bench/RESULTS.md, forty-second session: MobileNetV3's 960 x 240 layers, 4 x 672 x 168).
constexpr int64_t kMaxMacs = 64 * 1024;

// Checked before the weights are converted: every classifier head (pool, Flatten, Gemm) is a
// candidate, and declined by its size.
std::optional<FcMatch> match_fc(const Lowering& L, const Value* v, int64_t n_img, int64_t cin, int64_t max_cout) {
  const Node* fc = L.only_consumer(v);
  if (!fc || fc->inputs.empty() || fc->inputs[0] != v || fc->outputs.size() != 1) return std::nullopt;
  const auto in = v->type.shape ? v->type.shape->static_dims() : std::nullopt;
  const auto out = fc->outputs[0]->type.shape ? fc->outputs[0]->type.shape->static_dims() : std::nullopt;
  if (!in || !out || out->size() != in->size() || (*out)[0] != n_img) return std::nullopt;
  const Tensor* w = fc->inputs.size() > 1 ? L.constant(fc->inputs[1]) : nullptr;
  const Tensor* b = fc->has_input(2) ? L.constant(fc->inputs[2]) : nullptr;
  if (!w || (fc->has_input(2) && !b)) return std::nullopt;
  FcMatch m;
  m.node = fc;
  m.cout = (*out)[1];
  if (m.cout < 1 || m.cout > max_cout || n_img * cin * m.cout > kMaxMacs) return std::nullopt;
  double alpha = 1, beta = 1;
  bool trans = false;  // w stored [cin, cout]
  if (fc->op == OpKind::kConv) {
    // 1x1 over a 1x1 map without padding (strides could leave a padded output of one pixel).
    const std::string pad = fc->attr_string("auto_pad", "NOTSET");
    const std::vector<int64_t> pads = fc->attr_ints("pads", {});
    if ((pad != "NOTSET" && pad != "VALID") || std::any_of(pads.begin(), pads.end(), [](int64_t p) { return p != 0; })) {
      return std::nullopt;
    }
    if (fc->attr_int("group", 1) != 1 || w->rank() != in->size() || w->dim(0) != m.cout || w->dim(1) != cin) return std::nullopt;
    for (size_t i = 2; i < in->size(); ++i) {
      if ((*in)[i] != 1 || (*out)[i] != 1 || w->dim(i) != 1) return std::nullopt;
    }
    if (b && b->numel() != m.cout) return std::nullopt;
  } else if (fc->op == OpKind::kGemm) {
    if (in->size() != 2 || fc->attr_int("transA", 0) != 0 || w->rank() != 2) return std::nullopt;
    trans = fc->attr_int("transB", 0) == 0;
    if (w->dim(trans ? 0 : 1) != cin || w->dim(trans ? 1 : 0) != m.cout) return std::nullopt;
    // C of [cout] or [1, cout]: one bias row for every image.
    if (b && (b->numel() != m.cout || (b->rank() == 2 && b->dim(0) != 1) || b->rank() > 2)) return std::nullopt;
    alpha = fc->attr_float("alpha", 1.0f);
    beta = fc->attr_float("beta", 1.0f);
  } else {
    return std::nullopt;
  }
  m.w = Tensor::create(DType::kFloat32, {m.cout, cin}).value();
  float* wd = m.w.data<float>();
  for (int64_t o = 0; o < m.cout; ++o) {
    for (int64_t i = 0; i < cin; ++i) wd[o * cin + i] = float(alpha * w->as_double(trans ? i * m.cout + o : o * cin + i));
  }
  if (b) {
    m.b = Tensor::create(DType::kFloat32, {m.cout}).value();
    for (int64_t o = 0; o < m.cout; ++o) m.b.data<float>()[o] = float(beta * b->as_double(o));
  }
  return m;
}

// The spatial mean of x: GlobalAveragePool, or ReduceMean over exactly axes 2.. of x.
bool is_spatial_mean(const Lowering& L, const Node& n, size_t rank) {
  if (n.op == OpKind::kGlobalAveragePool) return true;
  if (n.op != OpKind::kReduceMean) return false;
  std::vector<int64_t> axes = n.attr_ints("axes", {});
  if (n.has_input(1)) {
    const Tensor* a = L.constant(n.inputs[1]);
    if (!a) return false;
    axes = a->to_int_vector();
  }
  std::vector<bool> red(rank, false);
  for (int64_t a : axes) {
    const int64_t k = a < 0 ? a + int64_t(rank) : a;
    if (k < 0 || k >= int64_t(rank)) return false;
    red[size_t(k)] = true;
  }
  for (size_t i = 0; i < rank; ++i) {
    if (red[i] != (i >= 2)) return false;
  }
  return true;
}

bool is_view(OpKind op) {
  return op == OpKind::kFlatten || op == OpKind::kReshape || op == OpKind::kSqueeze || op == OpKind::kIdentity;
}

std::optional<SqueezeExcite> match(const Lowering& L, const Node& pool) {
  const Value* x = pool.inputs.empty() ? nullptr : pool.inputs[0];
  if (!x || !x->type.is_tensor() || !x->type.shape || !x->type.shape->static_dims() || pool.outputs.size() != 1) {
    return std::nullopt;
  }
  const std::vector<int64_t> xd = *x->type.shape->static_dims();
  if (xd.size() < 3 || !is_spatial_mean(L, pool, xd.size())) return std::nullopt;
  const auto dt = L.device_dt(x->type.dtype);
  if (!dt || (*dt != k::DT::kF32 && *dt != k::DT::kF16 && *dt != k::DT::kBF16)) return std::nullopt;
  SqueezeExcite m;
  m.x = x;
  m.n = xd[0];
  m.c = xd[1];
  m.spatial = prod_of(xd, 2, xd.size());
  // Small batches only: the one kernel saves the chain's launches, which is what a batch of a few
  // images pays for; past that the libraries' GEMMs and the split reductions do the work faster
  // (bench/RESULTS.md, forty-second session: EfficientNet-B0 and MobileNetV3 at batch 128).
  constexpr int64_t kMaxImages = 8;
  if (m.n < 1 || m.n > kMaxImages || m.c < 1 || m.c > k::kSqueezeExciteMaxC || m.spatial < 1 ||
      m.spatial > (INT32_MAX / 2) / m.c) {
    return std::nullopt;
  }
  m.nodes = {&pool};
  const Value* v = pool.outputs[0];
  if (L.is_graph_output(v)) return std::nullopt;
  if (const Node* view = L.only_consumer(v); view && is_view(view->op) && view->inputs[0] == v) {
    const Value* o = view->outputs[0];
    if (!o->type.shape || o->type.shape->static_dims() != std::optional(std::vector<int64_t>{m.n, m.c})) return std::nullopt;
    m.nodes.push_back(view);
    v = o;
  }
  // A layer's output, then the activation after it if there is one: v moves to what the chain
  // computes last.
  auto layer = [&](const FcMatch& fc, k::Unary& op, k::UnaryParams& p) {
    m.nodes.push_back(fc.node);
    v = fc.node->outputs[0];
    if (auto a = match_act(L, v)) {
      op = a->op;
      p = a->p;
      m.nodes.insert(m.nodes.end(), a->nodes.begin(), a->nodes.end());
      v = a->out;
    }
  };
  auto fc1 = match_fc(L, v, m.n, m.c, k::kSqueezeExciteMaxCr);
  if (!fc1) return std::nullopt;
  layer(*fc1, m.act1, m.p1);
  auto fc2 = match_fc(L, v, m.n, fc1->cout, m.c);
  if (!fc2 || fc2->cout != m.c) return std::nullopt;
  layer(*fc2, m.act2, m.p2);
  // The gate in the build's dtype of x (the kernel writes what it reads).
  if (L.device_dt(v->type.dtype) != dt) return std::nullopt;
  // And a launch that fits this GPU in either layout (x's is chosen when x is lowered, later).
  k::SqueezeExciteArgs a;
  a.dt = *dt;
  a.n = m.n;
  a.c = m.c;
  a.spatial = m.spatial;
  a.cr = fc1->cout;
  a.act1 = m.act1;
  a.act2 = m.act2;
  for (bool last : {false, true}) {
    a.channels_last = last;
    if (k::squeeze_excite_blocks(a, k::squeeze_excite_splits(m.c, m.spatial, last)) < 1) return std::nullopt;
  }
  m.cr = fc1->cout;
  m.w1 = std::move(fc1->w);
  m.b1 = std::move(fc1->b);
  m.w2 = std::move(fc2->w);
  m.b2 = std::move(fc2->b);
  m.out = v;
  return m;
}

}  // namespace

// The kernel's step: x (NHWC or row-major) into the gate's buffer.
Status lower_squeeze_excite(Lowering& L, const Node& root, const SqueezeExcite& m) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.value(m.x));  // NHWC: rank 4, [N, H*W, C] in memory
  const k::DT dt = x->dt;
  KILN_ASSIGN_OR_RETURN(Ref w1, L.upload(m.w1, dt));
  KILN_ASSIGN_OR_RETURN(Ref w2, L.upload(m.w2, dt));
  Ref b1{}, b2{};
  if (m.b1.numel() > 0) {
    KILN_ASSIGN_OR_RETURN(b1, L.upload(m.b1, dt));
  }
  if (m.b2.numel() > 0) {
    KILN_ASSIGN_OR_RETURN(b2, L.upload(m.b2, dt));
  }
  const DevValue& g = L.define(m.out, Layout::kRowMajor, dt);
  const int splits = k::squeeze_excite_splits(m.c, m.spatial, x->layout == Layout::kNHWC);
  const int part = L.scratch(k::squeeze_excite_scratch_bytes(m.n, m.c, m.cr, splits));
  ByteWriter w;
  w.put(int32_t(dt));
  w.u8(x->layout == Layout::kNHWC ? 1 : 0);
  w.i64(m.n);
  w.i64(m.c);
  w.i64(m.spatial);
  w.i64(m.cr);
  put(w, x->ref);
  put(w, w1);
  put(w, b1);
  put(w, w2);
  put(w, b2);
  put(w, g.ref);
  put(w, Ref{false, part});
  for (auto [op, p] : {std::pair{m.act1, m.p1}, std::pair{m.act2, m.p2}}) {
    w.put(int32_t(op));
    w.put(p.a);
    w.put(p.b);
  }
  w.put(int32_t(splits));
  L.emit(&root, fmt::format("kernel squeeze_excite (mean over {} pixels, {} -> {} -> {} channels, {} runs of pixels an image)",
                            m.spatial, m.c, m.cr, m.c, splits),
         {read_id(x)}, {g.ref.id, part}, StepOp::kSqueezeExcite, std::move(w));
  return Status::ok();
}

int64_t held_bytes(const DevicePlan& p, Ref r) { return r.weight ? -1 : int64_t(p.buffer_bytes[size_t(r.id)]); }

namespace {

Expected<StepFn> bind_squeeze_excite(Params& in, BindCtx& ctx) {
  k::SqueezeExciteArgs a;
  a.dt = in.dt();
  a.channels_last = in.flag();
  a.n = in.i64();
  a.c = in.i64();
  a.spatial = in.i64();
  a.cr = in.i64();
  const Ref x = in.ref(), w1 = in.ref(), b1 = in.opt_ref(), w2 = in.ref(), b2 = in.opt_ref(), g = in.ref(), part = in.ref();
  a.act1 = in.en(k::Unary::kAtanh);
  a.p1.a = in.f32();
  a.p1.b = in.f32();
  a.act2 = in.en(k::Unary::kAtanh);
  a.p2.a = in.f32();
  a.p2.b = in.f32();
  const int splits = in.i32();
  KILN_RETURN_IF_ERROR(in.done());
  // The blocks for this GPU (the plan may have been built on another); 0 for parameters the kernel
  // refuses. Then every arena buffer must hold what the kernel reads or writes.
  const int blocks = k::squeeze_excite_blocks(a, splits);
  bool ok = blocks >= 1 && !g.weight && !part.weight;
  const int64_t e = k::dt_size(a.dt);
  auto holds = [&](Ref r, int64_t bytes) { const int64_t h = held_bytes(ctx.plan, r); ok = ok && (h < 0 || h >= bytes); };
  if (ok) {
    holds(x, a.n * a.c * a.spatial * e);
    holds(g, a.n * a.c * e);
    holds(part, int64_t(k::squeeze_excite_scratch_bytes(a.n, a.c, a.cr, splits)));
  }
  if (!ok) return KILN_ERROR(kInvalidModel, "{}: malformed squeeze-excite parameters", in.step().label);
  return StepFn([=](const RunCtx& c) {
    k::SqueezeExciteArgs r = a;
    r.x = c.ptr(x);
    r.w1 = c.ptr(w1);
    r.b1 = b1.id >= 0 ? c.ptr(b1) : nullptr;
    r.w2 = c.ptr(w2);
    r.b2 = b2.id >= 0 ? c.ptr(b2) : nullptr;
    r.g = c.ptr(g);
    r.part = static_cast<float*>(c.ptr(part));
    return cuda_status(k::squeeze_excite(r, splits, blocks, c.stream), "squeeze_excite");
  });
}

}  // namespace

void find_squeeze_excite(Lowering& L) {
  for (const auto& up : L.graph().nodes) {
    const Node& pool = *up;
    if ((pool.op != OpKind::kGlobalAveragePool && pool.op != OpKind::kReduceMean) || L.is_fused(&pool)) continue;
    auto m = match(L, pool);
    if (!m) continue;
    bool clash = false;  // a node another pattern claimed
    for (const Node* f : m->nodes) clash = clash || L.is_fused(f) || L.replacements.count(f);
    if (clash) continue;
    const Node* root = m->nodes.back();
    for (const Node* f : m->nodes) {
      if (f != root) L.mark_fused(f, root);
    }
    Replacement rep;
    rep.squeeze_excite = std::make_shared<SqueezeExcite>(std::move(*m));
    L.replacements[root] = std::move(rep);
  }
}

void register_squeeze_excite_binder(std::map<StepOp, BindFn>& t) { t[StepOp::kSqueezeExcite] = bind_squeeze_excite; }

}  // namespace kiln::cuda
