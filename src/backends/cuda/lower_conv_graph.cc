// A 2-D convolution and its epilogue as one cuDNN operation graph (the backend API):
//   y = act(conv(x, w) + bias + z)      act: none, ReLU or swish (SiLU, as exporters write x * sigmoid(x))
// in NHWC at fp16/bf16 with f32 accumulation. cuDNN's runtime-fusion engines compile a kernel for
// the whole graph when the plan is finalized, Hopper kernels that the legacy API's fixed algorithms
// do not reach; and the legacy fused call has no swish, so YOLO's and EfficientNet's convolutions
// otherwise pay a separate SiLU pass. lower_conv.cc asks pick_graph_conv for the fastest engine of
// cuDNN's heuristic list, timed as a forward runs it (tuning.h), and takes it where it beats the
// legacy algorithm plus any separate pass. Finalizing compiles (a few hundred milliseconds per
// distinct convolution), at build and again when an engine file is loaded.
//
// An engine is recorded as cuDNN's global engine index and its knob choices ("7:2=1,5=0"): the step
// rebuilds the operation graph from the convolution's dims and finalizes that configuration.
#include <cudnn.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <mutex>

#include "backends/cuda/lower.h"
#include "backends/cuda/timing_cache.h"
#include "backends/cuda/tuning.h"

namespace kiln::cuda {

namespace {

// One backend descriptor, destroyed with the last reference.
struct Desc {
  cudnnBackendDescriptor_t d = nullptr;
  Desc() = default;
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  ~Desc() {
    if (d) cudnnBackendDestroyDescriptor(d);
  }
};
using DescPtr = std::shared_ptr<Desc>;

Status dnn_status(cudnnStatus_t s, const char* what) {
  if (s == CUDNN_STATUS_SUCCESS) return Status::ok();
  return KILN_ERROR(kUnsupported, "cuDNN graph: {}: {}", what, cudnnGetErrorString(s));
}

Expected<DescPtr> make(cudnnBackendDescriptorType_t t) {
  auto p = std::make_shared<Desc>();
  KILN_RETURN_IF_ERROR(dnn_status(cudnnBackendCreateDescriptor(t, &p->d), "create descriptor"));
  return p;
}

Status set(const DescPtr& d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t n, const void* v) {
  return dnn_status(cudnnBackendSetAttribute(d->d, a, t, n, v), "set attribute");
}

Status finalize(const DescPtr& d, const char* what) { return dnn_status(cudnnBackendFinalize(d->d), what); }

cudnnDataType_t data_type(k::DT dt) { return dt == k::DT::kBF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF; }

// Tensor uids in the graph and in the step's variant pack.
enum Uid : int64_t { kX = 1, kW, kB, kZ, kY, kConvOut = 101, kBiasOut, kResOut };

// A tensor of logical dims [n, c, h, w] stored NHWC (c fastest).
Expected<DescPtr> tensor(int64_t uid, const std::array<int64_t, 4>& d, cudnnDataType_t dt, bool is_virtual) {
  KILN_ASSIGN_OR_RETURN(DescPtr t, make(CUDNN_BACKEND_TENSOR_DESCRIPTOR));
  const int64_t dims[4] = {d[0], d[1], d[2], d[3]};
  const int64_t strides[4] = {d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]};
  const int64_t align = 16;
  const bool v = is_virtual;
  KILN_RETURN_IF_ERROR(set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt));
  KILN_RETURN_IF_ERROR(set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims));
  KILN_RETURN_IF_ERROR(set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides));
  KILN_RETURN_IF_ERROR(set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
  KILN_RETURN_IF_ERROR(set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align));
  KILN_RETURN_IF_ERROR(set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v));
  KILN_RETURN_IF_ERROR(finalize(t, "tensor"));
  return t;
}

// A pointwise operation y = mode(x [, b]).
Expected<DescPtr> pointwise(cudnnPointwiseMode_t mode, const DescPtr& x, const DescPtr& b, const DescPtr& y) {
  KILN_ASSIGN_OR_RETURN(DescPtr pw, make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR));
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  KILN_RETURN_IF_ERROR(set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode));
  KILN_RETURN_IF_ERROR(set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &f32));
  if (mode == CUDNN_POINTWISE_SWISH_FWD) {
    const double beta = 1.0;
    KILN_RETURN_IF_ERROR(set(pw, CUDNN_ATTR_POINTWISE_SWISH_BETA, CUDNN_TYPE_DOUBLE, 1, &beta));
  }
  KILN_RETURN_IF_ERROR(finalize(pw, "pointwise descriptor"));
  KILN_ASSIGN_OR_RETURN(DescPtr op, make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR));
  KILN_RETURN_IF_ERROR(set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw->d));
  KILN_RETURN_IF_ERROR(set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x->d));
  if (b) KILN_RETURN_IF_ERROR(set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b->d));
  KILN_RETURN_IF_ERROR(set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y->d));
  KILN_RETURN_IF_ERROR(finalize(op, "pointwise operation"));
  return op;
}

// The operation graph of c, and every descriptor it holds.
struct OpGraph {
  std::vector<DescPtr> held;
  DescPtr graph;
};

Expected<OpGraph> op_graph(cudnnHandle_t h, const GraphConv& c) {
  OpGraph g;
  const cudnnDataType_t dt = data_type(c.dt), f32 = CUDNN_DATA_FLOAT;
  // The conv writes y itself when nothing follows it; otherwise each stage a virtual f32 tensor.
  const int stages = int(c.bias) + int(c.residual) + int(c.act != 0);
  KILN_ASSIGN_OR_RETURN(DescPtr x, tensor(kX, c.x, dt, false));
  KILN_ASSIGN_OR_RETURN(DescPtr w, tensor(kW, c.w, dt, false));
  KILN_ASSIGN_OR_RETURN(DescPtr y, tensor(kY, c.y, dt, false));
  g.held = {x, w, y};
  DescPtr cur = y;
  if (stages > 0) {
    KILN_ASSIGN_OR_RETURN(cur, tensor(kConvOut, c.y, f32, true));
  }
  g.held.push_back(cur);

  KILN_ASSIGN_OR_RETURN(DescPtr conv, make(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR));
  const int64_t spatial = 2;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  KILN_RETURN_IF_ERROR(set(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32));
  KILN_RETURN_IF_ERROR(set(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode));
  KILN_RETURN_IF_ERROR(set(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial));
  KILN_RETURN_IF_ERROR(set(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, c.dil.data()));
  KILN_RETURN_IF_ERROR(set(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, c.stride.data()));
  KILN_RETURN_IF_ERROR(set(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, c.pre.data()));
  KILN_RETURN_IF_ERROR(set(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, c.post.data()));
  KILN_RETURN_IF_ERROR(finalize(conv, "convolution"));
  KILN_ASSIGN_OR_RETURN(DescPtr op, make(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR));
  const float alpha = 1.0f, beta = 0.0f;
  KILN_RETURN_IF_ERROR(set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x->d));
  KILN_RETURN_IF_ERROR(set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w->d));
  KILN_RETURN_IF_ERROR(set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cur->d));
  KILN_RETURN_IF_ERROR(set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv->d));
  KILN_RETURN_IF_ERROR(set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha));
  KILN_RETURN_IF_ERROR(set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta));
  KILN_RETURN_IF_ERROR(finalize(op, "convolution operation"));
  g.held.push_back(conv);
  std::vector<cudnnBackendDescriptor_t> ops = {op->d};
  g.held.push_back(op);

  // Each epilogue stage reads the previous one; the last writes y.
  int left = stages;
  auto stage = [&](cudnnPointwiseMode_t m, const DescPtr& b, int64_t uid) -> Status {
    DescPtr out = y;
    if (--left > 0) {
      KILN_ASSIGN_OR_RETURN(out, tensor(uid, c.y, f32, true));
    }
    KILN_ASSIGN_OR_RETURN(DescPtr p, pointwise(m, cur, b, out));
    ops.push_back(p->d);
    g.held.push_back(p);
    g.held.push_back(out);
    cur = out;
    return Status::ok();
  };
  if (c.bias) {
    KILN_ASSIGN_OR_RETURN(DescPtr b, tensor(kB, {1, c.y[1], 1, 1}, dt, false));
    g.held.push_back(b);
    KILN_RETURN_IF_ERROR(stage(CUDNN_POINTWISE_ADD, b, kBiasOut));
  }
  if (c.residual) {
    KILN_ASSIGN_OR_RETURN(DescPtr z, tensor(kZ, c.y, dt, false));
    g.held.push_back(z);
    KILN_RETURN_IF_ERROR(stage(CUDNN_POINTWISE_ADD, z, kResOut));
  }
  if (c.act != 0) {
    KILN_RETURN_IF_ERROR(stage(c.act == 1 ? CUDNN_POINTWISE_RELU_FWD : CUDNN_POINTWISE_SWISH_FWD, nullptr, 0));
  }
  KILN_ASSIGN_OR_RETURN(g.graph, make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR));
  KILN_RETURN_IF_ERROR(set(g.graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(ops.size()), ops.data()));
  KILN_RETURN_IF_ERROR(set(g.graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h));
  KILN_RETURN_IF_ERROR(finalize(g.graph, "operation graph"));
  return g;
}

// An engine configuration as "<global index>:<knob type>=<value>,...".
Expected<std::string> describe_config(const DescPtr& cfg) {
  KILN_ASSIGN_OR_RETURN(DescPtr eng, make(CUDNN_BACKEND_ENGINE_DESCRIPTOR));
  int64_t got = 0;
  KILN_RETURN_IF_ERROR(dnn_status(cudnnBackendGetAttribute(cfg->d, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                                           1, &got, &eng->d), "engine of a configuration"));
  int64_t index = -1;
  KILN_RETURN_IF_ERROR(dnn_status(cudnnBackendGetAttribute(eng->d, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &got,
                                                           &index), "engine index"));
  constexpr int kMaxKnobs = 64;
  std::vector<DescPtr> knobs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int i = 0; i < kMaxKnobs; ++i) {
    KILN_ASSIGN_OR_RETURN(DescPtr k, make(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR));
    raw.push_back(k->d);
    knobs.push_back(std::move(k));
  }
  int64_t n = 0;
  KILN_RETURN_IF_ERROR(dnn_status(cudnnBackendGetAttribute(cfg->d, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES,
                                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, kMaxKnobs, &n, raw.data()),
                                  "knob choices"));
  std::string out = fmt::format("{}:", index);
  for (int64_t i = 0; i < std::min<int64_t>(n, kMaxKnobs); ++i) {
    cudnnBackendKnobType_t type{};
    int64_t value = 0;
    KILN_RETURN_IF_ERROR(dnn_status(cudnnBackendGetAttribute(raw[size_t(i)], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE,
                                                             CUDNN_TYPE_KNOB_TYPE, 1, &got, &type), "knob type"));
    KILN_RETURN_IF_ERROR(dnn_status(cudnnBackendGetAttribute(raw[size_t(i)], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE,
                                                             CUDNN_TYPE_INT64, 1, &got, &value), "knob value"));
    out += fmt::format("{}{}={}", i ? "," : "", int(type), value);
  }
  return out;
}

// The configuration `text` (describe_config) of graph g's engine, built again.
Expected<DescPtr> config_of(const OpGraph& g, const std::string& text, std::vector<DescPtr>& held) {
  long long index = -1;
  if (std::sscanf(text.c_str(), "%lld:", &index) != 1 || index < 0 || text.find(':') == std::string::npos) {
    return KILN_ERROR(kInvalidModel, "cuDNN graph: malformed engine configuration '{}'", text);
  }
  KILN_ASSIGN_OR_RETURN(DescPtr eng, make(CUDNN_BACKEND_ENGINE_DESCRIPTOR));
  KILN_RETURN_IF_ERROR(set(eng, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g.graph->d));
  const int64_t gi = index;
  KILN_RETURN_IF_ERROR(set(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &gi));
  KILN_RETURN_IF_ERROR(finalize(eng, "engine"));
  held.push_back(eng);
  std::vector<cudnnBackendDescriptor_t> raw;
  std::string rest = text.substr(text.find(':') + 1);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string item = rest.substr(0, comma);
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
    int type = 0;
    long long value = 0;
    if (std::sscanf(item.c_str(), "%d=%lld", &type, &value) != 2) {
      return KILN_ERROR(kInvalidModel, "cuDNN graph: malformed knob '{}' in '{}'", item, text);
    }
    KILN_ASSIGN_OR_RETURN(DescPtr k, make(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR));
    const auto kt = cudnnBackendKnobType_t(type);
    const int64_t v = value;
    KILN_RETURN_IF_ERROR(set(k, CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &kt));
    KILN_RETURN_IF_ERROR(set(k, CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &v));
    KILN_RETURN_IF_ERROR(finalize(k, "knob choice"));
    raw.push_back(k->d);
    held.push_back(k);
  }
  KILN_ASSIGN_OR_RETURN(DescPtr cfg, make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
  KILN_RETURN_IF_ERROR(set(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &eng->d));
  if (!raw.empty()) {
    KILN_RETURN_IF_ERROR(set(cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(raw.size()), raw.data()));
  }
  KILN_RETURN_IF_ERROR(finalize(cfg, "engine configuration"));
  return cfg;
}

// A finalized execution plan of configuration cfg and its workspace bytes.
Expected<std::pair<DescPtr, int64_t>> plan_of(cudnnHandle_t h, const DescPtr& cfg) {
  KILN_ASSIGN_OR_RETURN(DescPtr plan, make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR));
  KILN_RETURN_IF_ERROR(set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h));
  KILN_RETURN_IF_ERROR(set(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg->d));
  KILN_RETURN_IF_ERROR(finalize(plan, "execution plan"));
  int64_t ws = 0, got = 0;
  KILN_RETURN_IF_ERROR(dnn_status(cudnnBackendGetAttribute(plan->d, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                                                           1, &got, &ws), "workspace size"));
  return std::make_pair(plan, ws);
}

// Runs plan on its handle's stream with the given pointers (null ones are left out).
cudnnStatus_t execute(cudnnHandle_t h, const DescPtr& plan, void* x, void* w, void* b, void* z, void* y, void* ws) {
  cudnnBackendDescriptor_t vp = nullptr;
  cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  void* ptrs[5];
  int64_t uids[5];
  int64_t n = 0;
  for (auto [uid, p] : {std::pair<int64_t, void*>{kX, x}, {kW, w}, {kB, b}, {kZ, z}, {kY, y}}) {
    if (!p) continue;
    uids[n] = uid;
    ptrs[n++] = p;
  }
  if ((s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs)) ==
          CUDNN_STATUS_SUCCESS &&
      (s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids)) ==
          CUDNN_STATUS_SUCCESS &&
      (s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws)) ==
          CUDNN_STATUS_SUCCESS &&
      (s = cudnnBackendFinalize(vp)) == CUDNN_STATUS_SUCCESS) {
    s = cudnnBackendExecute(h, plan->d, vp);
  }
  cudnnBackendDestroyDescriptor(vp);
  return s;
}

size_t bytes_of(const std::array<int64_t, 4>& d, k::DT dt) { return size_t(d[0] * d[1] * d[2] * d[3]) * size_t(k::dt_size(dt)); }

// The engines cuDNN's heuristics rank first for graph g, at most `count` that finalize within the
// workspace: (configuration text, plan).
std::vector<std::pair<std::string, DescPtr>> candidates(cudnnHandle_t h, const OpGraph& g, size_t workspace, int count) {
  std::vector<std::pair<std::string, DescPtr>> out;
  auto heur = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  if (!heur) return out;
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  if (!set(*heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g.graph->d) ||
      !set(*heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode) || !finalize(*heur, "heuristics")) {
    return out;
  }
  int64_t total = 0;
  if (cudnnBackendGetAttribute((*heur)->d, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &total, nullptr) !=
      CUDNN_STATUS_SUCCESS) {
    return out;
  }
  total = std::min<int64_t>(total, 16);
  std::vector<DescPtr> cfgs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < total; ++i) {
    auto c = make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    if (!c) return out;
    raw.push_back((*c)->d);
    cfgs.push_back(*c);
  }
  int64_t got = 0;
  if (total == 0 || cudnnBackendGetAttribute((*heur)->d, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, total,
                                             &got, raw.data()) != CUDNN_STATUS_SUCCESS) {
    return out;
  }
  for (int64_t i = 0; i < got && int(out.size()) < count; ++i) {
    auto text = describe_config(cfgs[size_t(i)]);
    auto plan = text ? plan_of(h, cfgs[size_t(i)]) : Expected<std::pair<DescPtr, int64_t>>(text.status());
    if (!plan || size_t(plan->second) > workspace) continue;
    out.emplace_back(*text, plan->first);
  }
  cudaGetLastError();
  return out;
}

std::string encode(const GraphConvChoice& c) { return fmt::format("{};{}", c.engine, c.ms); }

std::optional<GraphConvChoice> decode(const std::string& v) {
  const size_t semi = v.rfind(';');
  if (semi == std::string::npos) return std::nullopt;
  GraphConvChoice c;
  c.engine = v.substr(0, semi);
  c.ms = std::strtof(v.c_str() + semi + 1, nullptr);
  return c;
}

}  // namespace

std::string GraphConv::key(size_t workspace) const {
  // What must match exactly (channels, filter, padding, stride, dilation, epilogue, the workspace an
  // engine may take), then the dims a nearest match may differ in (batch and image size).
  return fmt::format("dt{} b{} r{} a{} c{} k{}x{}x{} p{},{},{},{} s{},{} d{},{} ws{} @ {}x{}x{}", int(dt), int(bias),
                     int(residual), act, x[1], w[0], w[2], w[3], pre[0], pre[1], post[0], post[1], stride[0], stride[1],
                     dil[0], dil[1], workspace, x[0], x[2], x[3]);
}

Expected<std::optional<GraphConvChoice>> pick_graph_conv(Lowering& L, const GraphConv& c) {
  TimingCache* cache = L.options().autotune ? L.options().timing_cache.get() : nullptr;
  const std::string key = c.key(L.options().workspace_bytes);
  if (cache) {
    std::optional<std::string> v = cache->get("graphconv", key);
    if (!v && !L.options().time_misses) v = cache->nearest("graphconv", key);
    if (v) return *v == "none" ? std::nullopt : decode(*v);
  }
  // Nothing timed (no autotuning, or a dynamic engine's shape plan the build did not time): the
  // legacy path, whose heuristic choice needs no compilation.
  if (!L.options().autotune || !L.options().time_misses) return std::optional<GraphConvChoice>();
  KILN_ASSIGN_OR_RETURN(OpGraph g, op_graph(L.dnn, c));
  constexpr int kCandidates = 2;  // finalizing compiles: each costs a few hundred milliseconds
  auto cands = candidates(L.dnn, g, L.options().workspace_bytes, kCandidates);
  std::optional<GraphConvChoice> best;
  if (!cands.empty()) {
    RotatingCopies w(bytes_of(c.w, c.dt)), x(bytes_of(c.x, c.dt), false), y(bytes_of(c.y, c.dt), false),
        z(c.residual ? bytes_of(c.y, c.dt) : 256, false), b(256 + size_t(c.y[1]) * 4, false);
    if (w.ok() && x.ok() && y.ok() && z.ok() && b.ok()) {
      for (const auto& [text, plan] : cands) {
        const float ms = time_in_graph(w.launches(), [&](int i, cudaStream_t s) {
          return cudnnSetStream(L.dnn, s) == CUDNN_STATUS_SUCCESS &&
                 execute(L.dnn, plan, x.copy(0), w.copy(i), c.bias ? b.copy(0) : nullptr,
                         c.residual ? z.copy(0) : nullptr, y.copy(0), L.build_workspace) == CUDNN_STATUS_SUCCESS;
        });
        if (ms > 0 && (!best || ms < best->ms)) best = GraphConvChoice{text, ms};
      }
    }
    cudnnSetStream(L.dnn, nullptr);
    KILN_RETURN_IF_ERROR(finish_timing("cuDNN graph convolution engines"));
  }
  if (cache) cache->put("graphconv", key, best ? encode(*best) : "none");
  return best;
}

void emit_graph_conv(Lowering& L, const Node& n, const GraphConv& c, const GraphConvChoice& ch, const std::string& impl,
                     Ref x, Ref w, Ref b, Ref z, Ref y, std::vector<int> reads) {
  ByteWriter p;
  p.put(int32_t(c.dt));
  for (const auto* a : {&c.x, &c.w, &c.y}) {
    for (int64_t v : *a) p.i64(v);
  }
  for (const auto* a : {&c.pre, &c.post, &c.stride, &c.dil}) {
    for (int64_t v : *a) p.i64(v);
  }
  p.u8(c.bias);
  p.u8(c.residual);
  p.put(int32_t(c.act));
  p.str(ch.engine);
  put(p, x);
  put(p, w);
  put(p, b);
  put(p, z);
  put(p, y);
  L.emit(&n, impl, std::move(reads), {y.id}, StepOp::kCudnnGraphConv, std::move(p));
}

namespace {

Expected<StepFn> bind_graph_conv(Params& in, BindCtx& bc) {
  GraphConv c;
  c.dt = in.dt();
  for (auto* a : {&c.x, &c.w, &c.y}) {
    for (int64_t& v : *a) v = in.i64();
  }
  for (auto* a : {&c.pre, &c.post, &c.stride, &c.dil}) {
    for (int64_t& v : *a) v = in.i64();
  }
  c.bias = in.flag();
  c.residual = in.flag();
  c.act = in.i32();
  const std::string engine(in.bytes());
  const Ref xr = in.ref(), wr = in.ref(), br = in.opt_ref(), zr = in.opt_ref(), yr = in.ref();
  KILN_RETURN_IF_ERROR(in.done());
  bool ok = (c.dt == k::DT::kF16 || c.dt == k::DT::kBF16) && c.act >= 0 && c.act <= 2 && c.bias == (br.id >= 0) &&
            c.residual == (zr.id >= 0) && c.x[1] == c.w[1] && c.y[1] == c.w[0] && c.x[0] == c.y[0];
  for (const auto* a : {&c.x, &c.w, &c.y}) {
    for (int64_t v : *a) ok = ok && v >= 1 && v <= INT32_MAX;
  }
  for (const auto* a : {&c.stride, &c.dil}) {
    for (int64_t v : *a) ok = ok && v >= 1 && v <= INT32_MAX;
  }
  for (const auto* a : {&c.pre, &c.post}) {
    for (int64_t v : *a) ok = ok && v >= 0 && v <= INT32_MAX;
  }
  for (const auto* a : {&c.x, &c.w, &c.y}) {  // the descriptors' strides are products of three dims
    ok = ok && checked_numel(std::vector<int64_t>(a->begin(), a->end())).has_value();
  }
  if (!ok) return KILN_ERROR(kInvalidModel, "step '{}': malformed graph convolution parameters", in.step().label);
  auto fail = [&](const Status& s) {
    return KILN_ERROR(kInvalidModel, "step '{}': cuDNN does not build the engine's convolution here: {}", in.step().label,
                      s.message());
  };
  auto g = op_graph(bc.dnn, c);
  if (!g) return fail(g.status());
  auto held = std::make_shared<std::vector<DescPtr>>(g->held);
  held->push_back(g->graph);
  auto cfg = config_of(*g, engine, *held);
  if (!cfg) return fail(cfg.status());
  auto plan = plan_of(bc.dnn, *cfg);
  if (!plan) return fail(plan.status());
  if (size_t(plan->second) > bc.opt.workspace_bytes) {
    return KILN_ERROR(kInvalidModel, "step '{}': its cuDNN engine needs {} bytes of workspace, more than the {} allowed",
                      in.step().label, plan->second, bc.opt.workspace_bytes);
  }
  held->push_back(*cfg);
  bc.keep_alive.push_back(held);
  const DescPtr pl = plan->first;
  bc.keep_alive.push_back(pl);
  // The engine's sessions share the plan, and may run on threads of their own: cuDNN does not promise
  // that one execution plan runs from several threads at once. Under CUDA graphs it runs only while a
  // session captures, so the lock costs nothing per forward.
  auto mu = std::make_shared<std::mutex>();
  return StepFn([=](const RunCtx& r) -> Status {
    std::lock_guard<std::mutex> lock(*mu);
    const cudnnStatus_t s = execute(r.dnn, pl, r.ptr(xr), r.ptr(wr), br.id >= 0 ? r.ptr(br) : nullptr,
                                    zr.id >= 0 ? r.ptr(zr) : nullptr, r.ptr(yr), r.workspace);
    if (s != CUDNN_STATUS_SUCCESS) return KILN_ERROR(kInternal, "cuDNN graph convolution: {}", cudnnGetErrorString(s));
    return Status::ok();
  });
}

}  // namespace

void register_graph_conv_binder(std::map<StepOp, BindFn>& t) { t[StepOp::kCudnnGraphConv] = bind_graph_conv; }

}  // namespace kiln::cuda
