// 2-D convolution through cuDNN (pooling: lower_pool.cc). Half-precision builds run it NHWC (cuDNN's tensor
// core layout; weights are stored KRSC), fp32 builds NCHW. A Conv whose output feeds only an Add
// and/or a Relu becomes one cudnnConvolutionBiasActivationForward:
//   y = relu(conv(x, w) + z + bias)      (ResNet's conv3 + residual + ReLU in one call)
// Algorithms are chosen at build time by timing them (cudnnFindConvolutionForwardAlgorithmEx).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "backends/cuda/lower.h"
#include "backends/cuda/timing_cache.h"
#include "backends/cuda/tuning.h"

namespace kiln::cuda {

namespace {


cudnnDataType_t dnn_type(k::DT d) {
  switch (d) {
    case k::DT::kF16: return CUDNN_DATA_HALF;
    case k::DT::kBF16: return CUDNN_DATA_BFLOAT16;
    default: return CUDNN_DATA_FLOAT;
  }
}

Status destroy_tensor(cudnnTensorDescriptor_t d) { return cuda_status(cudnnDestroyTensorDescriptor(d), "destroy"); }
Status destroy_filter(cudnnFilterDescriptor_t d) { return cuda_status(cudnnDestroyFilterDescriptor(d), "destroy"); }
Status destroy_conv(cudnnConvolutionDescriptor_t d) { return cuda_status(cudnnDestroyConvolutionDescriptor(d), "destroy"); }
Status destroy_act(cudnnActivationDescriptor_t d) { return cuda_status(cudnnDestroyActivationDescriptor(d), "destroy"); }
using Keep = std::vector<std::shared_ptr<void>>;

Expected<cudnnTensorDescriptor_t> tensor_desc(Keep& keep, const std::vector<int64_t>& d, k::DT dt, Layout lay) {
  cudnnTensorDescriptor_t t = nullptr;
  KILN_CUDA_TRY(cudnnCreateTensorDescriptor(&t));
  hold(keep, t, destroy_tensor);
  KILN_CUDA_TRY(cudnnSetTensor4dDescriptor(t, lay == Layout::kNHWC ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, dnn_type(dt),
                                           int(d[0]), int(d[1]), int(d[2]), int(d[3])));
  return t;
}



// cuDNN pads symmetrically. TensorFlow-style SAME padding (one more row/column at the end) gets
// the extra zeros from an explicit copy into a zero-filled, larger buffer; the convolution then
// pads the symmetric part itself. Returns the padded value (or x itself when nothing is extra).
Expected<const DevValue*> pad_extra(Lowering& L, const Node& n, const DevValue* x, int64_t eh, int64_t ew) {
  if (eh == 0 && ew == 0) return x;
  auto* p = new DevValue(*x);
  L.keep_alive.emplace_back(p, [](void* q) { delete static_cast<DevValue*>(q); });
  p->dims[2] += eh;
  p->dims[3] += ew;
  p->ref = Ref{false, L.scratch(p->bytes())};
  std::vector<int64_t> ds = p->strides();  // logical strides of the padded buffer
  emit_copy_nd(L, &n, "kernel copy_nd (pad for asymmetric padding)", k::dt_size(x->dt), x->ref, 0,
               nd(x->dims, x->strides()), p->ref, 0, nd(x->dims, ds), p->bytes());
  return static_cast<const DevValue*>(p);
}

// KCRS -> KRSC for NHWC filters.
Expected<Tensor> to_krsc(const Tensor& w) {
  KILN_ASSIGN_OR_RETURN(Tensor f, convert_tensor(w, DType::kFloat32));
  int64_t K = w.dim(0), C = w.dim(1), R = w.dim(2), S = w.dim(3);
  KILN_ASSIGN_OR_RETURN(Tensor o, Tensor::create(DType::kFloat32, {K, R, S, C}));
  const float* in = f.data<float>();
  float* out = o.data<float>();
  for (int64_t k = 0; k < K; ++k)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t r = 0; r < R; ++r)
        for (int64_t s = 0; s < S; ++s) out[((k * R + r) * S + s) * C + c] = in[((k * C + c) * R + r) * S + s];
  return o;
}

// Convolutions over few channels (an RGB image). cuDNN's NHWC tensor-core kernels want C % 8 == 0;
// at C = 3 it falls back to slow ones (ResNet-50's 7x7/2 stem was a third of the forward at batch
// 256: bench/RESULTS.md, "(fourth session) — ResNet-50 stem space-to-depth; first max-autotune run
// (issue 4)"). The input is transformed once into NHWC with 8 or 16 channels
// (k::space_to_depth_nhwc) and the filter to match, so the sums are the same:
//  - stride 2 and 4*C <= 16: each 2x2 block of pixels folds into channels (space-to-depth) and the
//    convolution becomes stride 1 over 4*C channels with a filter of about half the size; tap
//    (ry, dy) of the new filter is tap r = 2*ry + dy - off of the old, where the transform shifts
//    the image by top = pad + off (off = pad % 2, so that blocks start on even rows);
//  - otherwise the channels are padded to 8.
// The padding moves into the transform (zeros outside the image): the convolution runs unpadded.
// Kept only where cuDNN's timings say the transformed convolution wins (see lower_conv).
struct SmallC {
  int64_t block = 1, top = 0, left = 0, cp = 8;
  int64_t r = 0, s = 0;          // filter size over the transformed input
  int64_t ho = 0, wo = 0;        // transformed image size
  int64_t stride_h = 1, stride_w = 1;
  int64_t off_h = 0, off_w = 0;  // old tap r = block * ry + dy - off_h
};

std::optional<SmallC> small_channel_plan(const Tensor& w, const std::array<int64_t, 4>& p4, const std::vector<int64_t>& st,
                                         const std::vector<int64_t>& dil, int64_t H, int64_t W, int64_t P, int64_t Q) {
  int64_t C = w.dim(1), R = w.dim(2), S = w.dim(3);
  if (C >= 8 || dil[0] != 1 || dil[1] != 1) return std::nullopt;
  SmallC p;
  if (st[0] == 2 && st[1] == 2 && 4 * C <= 16 && R >= 2 && S >= 2) {
    p.block = 2;
    p.off_h = p4[0] % 2;
    p.off_w = p4[1] % 2;
    p.top = p4[0] + p.off_h;
    p.left = p4[1] + p.off_w;
    p.r = (R - 1 + p.off_h) / 2 + 1;
    p.s = (S - 1 + p.off_w) / 2 + 1;
    p.cp = 4 * C <= 8 ? 8 : 16;
    p.ho = P + p.r - 1;
    p.wo = Q + p.s - 1;
  } else {
    p.top = p4[0];
    p.left = p4[1];
    p.r = R;
    p.s = S;
    p.stride_h = st[0];
    p.stride_w = st[1];
    p.ho = H + p4[0] + p4[2];
    p.wo = W + p4[1] + p4[3];
  }
  return p;
}

// The filter over the transformed input, KRSC: [K, p.r, p.s, p.cp].
Expected<Tensor> small_channel_filter(const Tensor& w, const SmallC& p) {
  KILN_ASSIGN_OR_RETURN(Tensor f, convert_tensor(w, DType::kFloat32));
  int64_t K = w.dim(0), C = w.dim(1), R = w.dim(2), S = w.dim(3), b = p.block;
  KILN_ASSIGN_OR_RETURN(Tensor o, Tensor::create(DType::kFloat32, {K, p.r, p.s, p.cp}));  // zero-filled
  const float* in = f.data<float>();
  float* out = o.data<float>();
  for (int64_t k = 0; k < K; ++k)
    for (int64_t ry = 0; ry < p.r; ++ry)
      for (int64_t rx = 0; rx < p.s; ++rx)
        for (int64_t dy = 0; dy < b; ++dy)
          for (int64_t dx = 0; dx < b; ++dx) {
            int64_t r = b * ry + dy - p.off_h, s = b * rx + dx - p.off_w;
            if (r < 0 || r >= R || s < 0 || s >= S) continue;
            for (int64_t c = 0; c < C; ++c)
              out[((k * p.r + ry) * p.s + rx) * p.cp + (dy * b + dx) * C + c] = in[((k * C + c) * R + r) * S + s];
          }
  return o;
}

Expected<const DevValue*> space_to_depth(Lowering& L, const Node& n, const Value* xv, const SmallC& pl) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.value(xv));
  if (x->dims.size() != 4 || k::dt_size(x->dt) != 2) return KILN_ERROR(kInternal, "{}: space-to-depth of {}", n.describe(), xv->name);
  const k::DT out_dt = x->dt;
  // A graph input staged in f32 (the model's image) is read as the host wrote it and converted
  // here; its cast step then has no reader left and is dropped (engine.cc).
  auto staged = L.staged_inputs.find(xv);
  const DevValue* src = staged != L.staged_inputs.end() && staged->second.dt == k::DT::kF32 ? &staged->second : x;
  auto* p = new DevValue(*x);
  L.keep_alive.emplace_back(p, [](void* q) { delete static_cast<DevValue*>(q); });
  p->layout = Layout::kNHWC;
  p->dims = {x->dims[0], pl.cp, pl.ho, pl.wo};
  p->ref = Ref{false, L.scratch(p->bytes())};
  std::vector<int64_t> xs = src->strides();  // logical [n, c, h, w] order
  k::SpaceToDepthShape sh{x->dims[0], x->dims[1], x->dims[2], x->dims[3], xs[0], xs[1], xs[2], xs[3],
                          pl.block, pl.top, pl.left, pl.ho, pl.wo, pl.cp};
  const k::DT in_dt = src->dt;
  ByteWriter w;
  put(w, src->ref);
  w.put(int32_t(in_dt));
  put(w, p->ref);
  w.put(int32_t(out_dt));
  for (int64_t v : {sh.n, sh.c, sh.h, sh.w, sh.sn, sh.sc, sh.sh, sh.sw, sh.block, sh.top, sh.left, sh.ho, sh.wo, sh.cp}) w.i64(v);
  L.emit(&n, fmt::format("kernel space_to_depth_nhwc ({} -> {} channels, block {}{})", sh.c, sh.cp, sh.block,
                         in_dt != out_dt ? ", from the f32 input" : ""),
         {read_id(src)}, {p->ref.id}, StepOp::kSpaceToDepth, std::move(w));
  return static_cast<const DevValue*>(p);
}

struct DevBuf {
  void* p = nullptr;
  ~DevBuf() { if (p) cudaFree(p); }
};

// The cuDNN descriptors of one 2-D convolution: x [n, c, h, w] and y in layout lay, filter
// [k, c, r, s] (KRSC in memory when NHWC), symmetric pads.
struct AlgoChoice {
  cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
  float ms = -1;          // timed, or -1 when chosen by heuristic
  float precomp_ms = -1;  // IMPLICIT_PRECOMP_GEMM's time (the fused identity path needs it)
  std::vector<cudnnConvolutionFwdAlgo_t> ranked;  // every usable algorithm, best first
};

// Find's ranking comes from a run or two of each algorithm in isolation, and it is not stable for
// small convolutions: now and then a ResNet-50 b1 build took IMPLICIT_GEMM for layer2.0's 3x3/2
// convolution, and that build's forward was far slower. Where x and y together are at most
// kRetimeBytes, the two best by Find and IMPLICIT_PRECOMP_GEMM (which the fused identity path
// needs) are timed again as the forward runs them (tuning.h: launches back to back in a graph, the
// weight cold); those times decide, and b1 builds no longer differ. Larger convolutions keep Find's
// choice: re-timing them all made ResNet-50's b256 build several times longer for the same forward
// time. (Gating on Find's own time instead missed: half the b1 builds were slow again, Find's times
// for those convolutions being what is unreliable.) bench/RESULTS.md, "ResNet-50: input image read
// by space-to-depth, kiln's max pooling, conv algorithms re-timed (c955006, 9be7bf1, 285d861)".
constexpr size_t kRetimeBytes = size_t(64) << 20;
// A failed scratch allocation keeps Find's choice; an error only when timing broke the context.
Status retime(Lowering& L, cudnnTensorDescriptor_t xd, void* x, cudnnFilterDescriptor_t wd, size_t wb,
              cudnnConvolutionDescriptor_t cd, cudnnTensorDescriptor_t yd, void* y, AlgoChoice& r) {
  std::vector<cudnnConvolutionFwdAlgo_t> cands(r.ranked.begin(), r.ranked.begin() + std::min<size_t>(2, r.ranked.size()));
  const auto precomp = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
  if (r.precomp_ms >= 0 && std::find(cands.begin(), cands.end(), precomp) == cands.end()) cands.push_back(precomp);
  RotatingCopies w(wb);  // filled with 0x3c bytes, as Find's filter
  if (!w.ok()) return Status::ok();
  std::vector<std::pair<float, cudnnConvolutionFwdAlgo_t>> timed;
  for (cudnnConvolutionFwdAlgo_t a : cands) {
    size_t ws = 0;
    if (cudnnGetConvolutionForwardWorkspaceSize(L.dnn, xd, wd, cd, yd, a, &ws) != CUDNN_STATUS_SUCCESS ||
        ws > L.options().workspace_bytes) {
      continue;
    }
    const float one = 1.0f, zero = 0.0f;
    const float ms = time_in_graph(w.launches(), [&](int i, cudaStream_t s) {
      return cudnnSetStream(L.dnn, s) == CUDNN_STATUS_SUCCESS &&
             cudnnConvolutionForward(L.dnn, &one, xd, x, wd, w.copy(i), cd, a, L.build_workspace, ws, &zero, yd, y) ==
                 CUDNN_STATUS_SUCCESS;
    });
    if (ms > 0) timed.emplace_back(ms, a);
  }
  cudnnSetStream(L.dnn, nullptr);
  KILN_RETURN_IF_ERROR(finish_timing("cuDNN convolution algorithms"));
  if (timed.empty()) return Status::ok();
  std::sort(timed.begin(), timed.end(), [](const auto& p, const auto& q) { return p.first < q.first; });
  r.algo = timed[0].second;
  r.ms = timed[0].first;
  r.precomp_ms = -1;
  for (const auto& [ms, a] : timed) {
    if (a == precomp) r.precomp_ms = ms;
  }
  // The re-timed algorithms first, fastest first; the rest in Find's order.
  std::vector<cudnnConvolutionFwdAlgo_t> ranked;
  for (const auto& t : timed) ranked.push_back(t.second);
  for (cudnnConvolutionFwdAlgo_t a : r.ranked) {
    if (std::find(ranked.begin(), ranked.end(), a) == ranked.end()) ranked.push_back(a);
  }
  r.ranked = std::move(ranked);
  return Status::ok();
}

// The timing cache's value for a choice: "algo ms precomp_ms ranked0,ranked1,...".
std::string encode_choice(const AlgoChoice& r) {
  std::string ranked;
  for (auto a : r.ranked) ranked += (ranked.empty() ? "" : ",") + std::to_string(int(a));
  return fmt::format("{} {} {} {}", int(r.algo), r.ms, r.precomp_ms, ranked);
}

std::optional<AlgoChoice> decode_choice(const std::string& v) {
  AlgoChoice r;
  int algo = 0;
  char ranked[256] = {};
  if (std::sscanf(v.c_str(), "%d %f %f %255s", &algo, &r.ms, &r.precomp_ms, ranked) != 4) return std::nullopt;
  r.algo = cudnnConvolutionFwdAlgo_t(algo);
  for (const char* p = ranked; *p;) {
    r.ranked.push_back(cudnnConvolutionFwdAlgo_t(std::atoi(p)));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  if (r.ranked.empty() || r.ranked[0] != r.algo) return std::nullopt;
  return r;
}

Expected<AlgoChoice> time_algos(Lowering& L, cudnnTensorDescriptor_t xd, cudnnFilterDescriptor_t wd,
                                cudnnConvolutionDescriptor_t cd, cudnnTensorDescriptor_t yd, size_t xb, size_t wb,
                                size_t yb);

// The algorithm for a convolution: from the timing cache when it has this signature (and cuDNN
// still sizes the choice's workspace within ours), else timed (time_algos) and added to it.
Expected<AlgoChoice> pick_algo(Lowering& L, const ConvDescs& d) {
  TimingCache* cache = L.options().autotune ? L.options().timing_cache.get() : nullptr;
  if (cache) {
    std::optional<std::string> v = cache->get("conv", d.key);
    if (!v && !L.options().time_misses) v = cache->nearest("conv", d.key);
    if (v) {
      std::optional<AlgoChoice> c = decode_choice(*v);
      size_t ws = 0;
      if (c && cudnnGetConvolutionForwardWorkspaceSize(L.dnn, d.x, d.w, d.c, d.y, c->algo, &ws) == CUDNN_STATUS_SUCCESS &&
          ws <= L.options().workspace_bytes) {
        return *c;
      }
    }
  }
  KILN_ASSIGN_OR_RETURN(AlgoChoice r, time_algos(L, d.x, d.w, d.c, d.y, d.xb, d.wb, d.yb));
  if (cache && L.options().time_misses) cache->put("conv", d.key, encode_choice(r));
  return r;
}

// Times the forward algorithms on scratch buffers; falls back to the heuristic on failure.
Expected<AlgoChoice> time_algos(Lowering& L, cudnnTensorDescriptor_t xd, cudnnFilterDescriptor_t wd,
                                cudnnConvolutionDescriptor_t cd, cudnnTensorDescriptor_t yd, size_t xb, size_t wb,
                                size_t yb) {
  constexpr int kMax = 10;
  cudnnConvolutionFwdAlgoPerf_t perf[kMax];
  int got = 0;
  AlgoChoice r;
  bool chosen = false;
  if (L.options().autotune && L.options().time_misses) {
    DevBuf x, w, y;
    if (cudaMalloc(&x.p, xb) == cudaSuccess && cudaMalloc(&w.p, wb) == cudaSuccess && cudaMalloc(&y.p, yb) == cudaSuccess &&
        cudaMemset(x.p, 0x3c, xb) == cudaSuccess && cudaMemset(w.p, 0x3c, wb) == cudaSuccess &&
        cudnnFindConvolutionForwardAlgorithmEx(L.dnn, xd, x.p, wd, w.p, cd, yd, y.p, kMax, &got, perf, L.build_workspace,
                                               L.options().workspace_bytes) == CUDNN_STATUS_SUCCESS) {
      for (int i = 0; i < got; ++i) {
        if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > L.options().workspace_bytes) continue;
        r.ranked.push_back(perf[i].algo);
        if (!chosen) {
          r.algo = perf[i].algo;
          r.ms = perf[i].time;
          chosen = true;
        }
        if (perf[i].algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM) r.precomp_ms = perf[i].time;
      }
      if (chosen) {
        if (xb + yb <= kRetimeBytes) KILN_RETURN_IF_ERROR(retime(L, xd, x.p, wd, wb, cd, yd, y.p, r));
        return r;
      }
    }
    cudaGetLastError();
  }
  KILN_CUDA_TRY(cudnnGetConvolutionForwardAlgorithm_v7(L.dnn, xd, wd, cd, yd, kMax, &got, perf));
  for (int i = 0; i < got; ++i) {
    if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= L.options().workspace_bytes) {
      r.ranked.push_back(perf[i].algo);
    }
  }
  if (r.ranked.empty()) KILN_UNSUPPORTED("cuDNN has no convolution algorithm for this configuration");
  r.algo = r.ranked[0];
  return r;
}

// The descriptors of one convolution (held in `keep`); precision and workspace enter the cache key.
Expected<ConvDescs> conv_descs(Keep& keep, Precision prec, size_t workspace, k::DT dt, Layout lay,
                               const std::vector<int64_t>& xdims, const std::array<int64_t, 4>& wdims,
                               std::array<int, 2> pads, std::array<int, 2> stride, std::array<int, 2> dil, int64_t group,
                               const std::vector<int64_t>& ydims) {
  ConvDescs d;
  d.key = fmt::format("w{} p{},{} s{},{} d{},{} g{} dt{} {} prec{} ws{} @ x{} y{}", dims_to_string({wdims.begin(), wdims.end()}),
                      pads[0], pads[1], stride[0], stride[1], dil[0], dil[1], group, int(dt),
                      lay == Layout::kNHWC ? "nhwc" : "nchw", int(prec), workspace, dims_to_string(xdims), dims_to_string(ydims));
  KILN_ASSIGN_OR_RETURN(d.x, tensor_desc(keep, xdims, dt, lay));
  KILN_ASSIGN_OR_RETURN(d.y, tensor_desc(keep, ydims, dt, lay));
  KILN_CUDA_TRY(cudnnCreateFilterDescriptor(&d.w));
  hold(keep, d.w, destroy_filter);
  KILN_CUDA_TRY(cudnnSetFilter4dDescriptor(d.w, dnn_type(dt), lay == Layout::kNHWC ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                           int(wdims[0]), int(wdims[1]), int(wdims[2]), int(wdims[3])));
  KILN_CUDA_TRY(cudnnCreateConvolutionDescriptor(&d.c));
  hold(keep, d.c, destroy_conv);
  KILN_CUDA_TRY(cudnnSetConvolution2dDescriptor(d.c, pads[0], pads[1], stride[0], stride[1], dil[0], dil[1],
                                                CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  KILN_CUDA_TRY(cudnnSetConvolutionGroupCount(d.c, int(group)));
  cudnnMathType_t math = dt != k::DT::kF32 ? CUDNN_TENSOR_OP_MATH
                         : prec == Precision::kTf32 ? CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION
                                                    : CUDNN_FMA_MATH;
  KILN_CUDA_TRY(cudnnSetConvolutionMathType(d.c, math));
  auto count = [](const auto& dims) {
    int64_t c = 1;
    for (int64_t v : dims) c *= v;
    return size_t(c);
  };
  size_t eb = size_t(k::dt_size(dt));
  d.xb = count(xdims) * eb;
  d.wb = count(wdims) * eb;
  d.yb = count(ydims) * eb;
  return d;
}

Expected<ConvDescs> conv_descs(Lowering& L, k::DT dt, Layout lay, const std::vector<int64_t>& xdims,
                               const std::array<int64_t, 4>& wdims, std::array<int, 2> pads, std::array<int, 2> stride,
                               std::array<int, 2> dil, int64_t group, const std::vector<int64_t>& ydims) {
  return conv_descs(L.keep_alive, L.options().precision, L.options().workspace_bytes, dt, lay, xdims, wdims, pads, stride,
                    dil, group, ydims);
}

// Whether a small-channel transform (SmallC) is worth it: cuDNN times the convolution both ways,
// the transform and the layout change the original would need counted as passes over memory. A
// graph input the host staged in f32 and only this convolution reads is cast by a step of its own
// on the original path, where the transform reads the f32 itself (space_to_depth): that cast counts
// too. Without autotuning, the transform is taken.
Expected<bool> small_channel_wins(Lowering& L, const Value* xv, const DevValue& x, k::DT dt, const Tensor& w,
                                  const std::array<int64_t, 4>& p4, const std::vector<int64_t>& st,
                                  const std::vector<int64_t>& ydims, const SmallC& pl) {
  if (!L.options().autotune) return true;
  std::array<int64_t, 4> wd{w.dim(0), w.dim(1), w.dim(2), w.dim(3)};
  std::vector<int64_t> xd = x.dims;
  xd[2] += p4[2] - p4[0];
  xd[3] += p4[3] - p4[1];
  auto ms_of = [&](const ConvDescs& d) -> Expected<float> {
    KILN_ASSIGN_OR_RETURN(AlgoChoice c, pick_algo(L, d));
    return c.ms;
  };
  KILN_ASSIGN_OR_RETURN(ConvDescs orig, conv_descs(L, dt, Layout::kNHWC, xd, wd, {int(p4[0]), int(p4[1])},
                                                   {int(st[0]), int(st[1])}, {1, 1}, 1, ydims));
  KILN_ASSIGN_OR_RETURN(ConvDescs tr, conv_descs(L, dt, Layout::kNHWC, {x.dims[0], pl.cp, pl.ho, pl.wo},
                                                 {w.dim(0), pl.cp, pl.r, pl.s}, {0, 0}, {int(pl.stride_h), int(pl.stride_w)},
                                                 {1, 1}, 1, ydims));
  KILN_ASSIGN_OR_RETURN(float t_orig, ms_of(orig));
  KILN_ASSIGN_OR_RETURN(float t_tr, ms_of(tr));
  if (t_orig < 0 || t_tr < 0) return true;
  auto pass_ms = [](size_t bytes) { return double(bytes) / 2.5e9 + 0.003; };
  auto staged = L.staged_inputs.find(xv);
  const bool f32_input = staged != L.staged_inputs.end() && staged->second.dt == k::DT::kF32 && L.consumers(xv) == 1;
  double orig_total = t_orig + (x.layout == Layout::kNHWC ? 0.0 : pass_ms(2 * orig.xb)) +
                      (f32_input ? pass_ms(3 * orig.xb) : 0.0);
  double tr_total = t_tr + pass_ms((f32_input ? 2 : 1) * orig.xb + tr.xb);
  return tr_total < orig_total;
}

const Node* next_op(Lowering& L, const Value* v, OpKind want) {
  const Node* c = L.only_consumer(v);
  return c && c->op == want && !L.is_fused(c) ? c : nullptr;  // not one a pattern has taken
}

}  // namespace

// 2-D pads [top, left, bottom, right] from an ONNX node (auto_pad NOTSET/VALID only).
std::optional<std::array<int64_t, 4>> pads4(const Node& n) {
  std::string ap = n.attr_string("auto_pad", "NOTSET");
  if (ap == "VALID") return std::array<int64_t, 4>{0, 0, 0, 0};
  if (ap != "NOTSET") return std::nullopt;
  std::vector<int64_t> p = n.attr_ints("pads", {0, 0, 0, 0});
  if (p.size() != 4) return std::nullopt;
  return std::array<int64_t, 4>{p[0], p[1], p[2], p[3]};
}

// The nodes computing v * sigmoid(v) from v when nothing else reads v: a FusedElementwise of just
// that, or Sigmoid and Mul. The last one's output is the SiLU's. Empty otherwise.
std::vector<const Node*> silu_after(Lowering& L, const Value* v) {
  if (L.is_graph_output(v)) return {};
  const std::vector<const Node*> r = L.readers(v);
  if (r.size() == 1) {
    if (is_silu(*r[0]) && !L.fused_into(r[0])) return {r[0]};
    return {};
  }
  if (r.size() != 2) return {};
  const Node* sig = r[0]->op == OpKind::kSigmoid ? r[0] : r[1];
  const Node* mul = sig == r[0] ? r[1] : r[0];
  if (sig->op != OpKind::kSigmoid || mul->op != OpKind::kMul || mul->inputs.size() != 2 || L.fused_into(sig) ||
      L.fused_into(mul) || L.only_consumer(sig->outputs[0]) != mul) {
    return {};
  }
  const Value *a = mul->inputs[0], *b = mul->inputs[1], *s = sig->outputs[0];
  if (!((a == v && b == s) || (a == s && b == v))) return {};
  return {sig, mul};
}

namespace {

// One elementwise pass over y (a bias add, a SiLU) as the choices below estimate it.
double pass_over_ms(int64_t elems, int elem_bytes) { return 2.0 * double(elems) * elem_bytes / 2.5e9 + 0.003; }

bool graph_conv_fits(Lowering& L, Layout lay, int64_t group, const std::array<int64_t, 4>& wdims) {
  return L.options().graph_conv >= 0 && lay == Layout::kNHWC && L.half() && group == 1 && wdims[1] % 8 == 0 &&
         wdims[0] % 8 == 0;
}

GraphConv graph_conv_shape(k::DT dt, const std::vector<int64_t>& x, const std::array<int64_t, 4>& wdims,
                           const std::vector<int64_t>& y, std::array<int, 2> pads, std::array<int, 2> stride,
                           const std::vector<int64_t>& dil, const Tensor* bias, const DevValue* z, bool relu,
                           const std::vector<const Node*>& silu) {
  GraphConv gc;
  gc.dt = dt;
  gc.x = {x[0], x[1], x[2], x[3]};
  gc.w = wdims;
  gc.y = {y[0], y[1], y[2], y[3]};
  gc.pre = gc.post = {pads[0], pads[1]};
  gc.stride = {stride[0], stride[1]};
  gc.dil = {dil[0], dil[1]};
  gc.bias = bias != nullptr;
  gc.residual = z != nullptr;
  gc.act = relu ? 1 : silu.empty() ? 0 : 2;
  return gc;
}

// Emits gc as one cuDNN operation graph when its fastest engine beats other_ms (the other path with
// the passes it leaves; negative: not timed) by a margin, or when the build forces graphs. A graph
// engine compiles when the engine is loaded (a few hundred milliseconds each): it must win by a
// margin, not by the timing's noise (ResNet-50's 3x3 convolutions tie the legacy ones).
Expected<bool> try_graph_conv(Lowering& L, const Node& n, const GraphConv& gc, const DevValue& x, const Tensor& w,
                              const Tensor* bias_t, const DevValue* z, const Value* out,
                              const std::vector<const Node*>& fused, const std::vector<const Node*>& silu,
                              double other_ms) {
  KILN_ASSIGN_OR_RETURN(std::optional<GraphConvChoice> gch, pick_graph_conv(L, gc));
  constexpr double kMargin = 0.95;
  if (!gch || !(L.options().graph_conv == 1 || (other_ms > 0 && gch->ms < kMargin * other_ms))) return false;
  KILN_ASSIGN_OR_RETURN(Ref wr, L.upload_derived(w, "krsc", gc.dt, [&w]() { return to_krsc(w); }));
  Ref br;
  if (bias_t) {
    KILN_ASSIGN_OR_RETURN(br, L.upload_constant(*bias_t, gc.dt));
  }
  const Value* gout = silu.empty() ? out : silu.back()->outputs[0];
  const DevValue& y = L.define(gout, Layout::kNHWC);
  const std::string impl = fmt::format("cudnn graph conv NHWC {} engine {}{}{}{} ({:.4f} ms against {:.4f})",
                                       gc.dt == k::DT::kF16 ? "fp16" : "bf16", gch->engine, bias_t ? " +bias" : "",
                                       z ? " +residual" : "", gc.act == 1 ? " +relu" : gc.act == 2 ? " +silu" : "",
                                       gch->ms, other_ms);
  emit_graph_conv(L, n, gc, *gch, impl, x.ref, wr, br, z ? z->ref : Ref{}, y.ref, {read_id(&x), z ? read_id(z) : -1});
  for (const Node* f : fused) L.mark_fused(f, &n);
  for (const Node* f : silu) L.mark_fused(f, &n);
  return true;
}

Status lower_conv(Lowering& L, const Node& n) {
  const Value* xv = n.inputs[0];
  const InputAct* in_act = nullptr;
  if (auto it = L.input_acts.find(&n); it != L.input_acts.end()) {
    in_act = &it->second;
    xv = in_act->x;
  }
  const Tensor* w = L.constant(n.inputs[1]);
  const Tensor* bias_t = n.has_input(2) ? L.constant(n.inputs[2]) : nullptr;
  if (!in_act && w && (w->rank() == 3 || w->rank() == 5)) return lower_conv_nd(L, n);
  if (!in_act && (!w || (n.has_input(2) && !bias_t))) return lower_conv_fed(L, n);
  if (!w || w->rank() != 4) KILN_UNSUPPORTED("Conv needs a 4-D weight (2-D convolution)");
  if (n.has_input(2) && !bias_t) KILN_UNSUPPORTED("Conv bias computed at run time");
  auto p4 = pads4(n);
  if (!p4) KILN_UNSUPPORTED("Conv with auto_pad {}", n.attr_string("auto_pad", ""));
  if ((*p4)[2] < (*p4)[0] || (*p4)[3] < (*p4)[1]) KILN_UNSUPPORTED("Conv with more padding at the start than the end");
  auto pads = std::optional<std::array<int, 2>>(std::array<int, 2>{int((*p4)[0]), int((*p4)[1])});
  std::vector<int64_t> st = n.attr_ints("strides", {1, 1}), dil = n.attr_ints("dilations", {1, 1});
  int64_t group = n.attr_int("group", 1);
  auto dt = L.device_dt(xv->type.dtype);
  if (!dt || (*dt != k::DT::kF32 && *dt != k::DT::kF16 && *dt != k::DT::kBF16)) KILN_UNSUPPORTED("Conv on {}", xv->type.to_string());
  Layout lay = L.half() ? Layout::kNHWC : Layout::kRowMajor;
  // A "patchify" convolution (kernel == stride, no padding: ViT's 16x16/16 embedding) runs as a
  // GEMM (below); other convolutions over fewer than 8 channels may transform their input (SmallC).
  bool patch = lay == Layout::kNHWC && group == 1 && st[0] == w->dim(2) && st[1] == w->dim(3) && dil[0] == 1 &&
               dil[1] == 1 && (*p4) == std::array<int64_t, 4>{0, 0, 0, 0};
  // Output channels short of a multiple of 8 in NHWC: padded at build (lower_conv_pad.cc) where
  // nothing is fused after the convolution (an Add, a Relu or a SiLU would see the padding); a
  // patch GEMM takes any K as it is.
  if (lay == Layout::kNHWC && group == 1 && !patch && !in_act && w->dim(0) % 8 != 0 && w->dim(1) % 8 == 0 &&
      !next_op(L, n.outputs[0], OpKind::kAdd) && !next_op(L, n.outputs[0], OpKind::kRelu) &&
      silu_after(L, n.outputs[0]).empty()) {
    KILN_ASSIGN_OR_RETURN(bool padded, lower_conv_padded_k(L, n, *w, bias_t, [&L](const Node& m) { return lower_conv(L, m); }));
    if (padded) return Status::ok();
  }
  std::vector<int64_t> yd_dims;
  for (const Dim& d : n.outputs[0]->type.shape->dims) yd_dims.push_back(d.value());
  std::optional<SmallC> small;
  if (lay == Layout::kNHWC && group == 1 && !patch && !in_act && (*dt == k::DT::kF16 || *dt == k::DT::kBF16)) {
    KILN_ASSIGN_OR_RETURN(const DevValue* xin, L.value(xv));
    if (xin->dims.size() == 4) small = small_channel_plan(*w, *p4, st, dil, xin->dims[2], xin->dims[3], yd_dims[2], yd_dims[3]);
    if (small) {
      KILN_ASSIGN_OR_RETURN(bool wins, small_channel_wins(L, xv, *xin, *dt, *w, *p4, st, yd_dims, *small));
      if (!wins) small.reset();
    }
  }
  const DevValue* x0 = nullptr;
  if (small) {
    KILN_ASSIGN_OR_RETURN(x0, space_to_depth(L, n, xv, *small));
  } else {
    KILN_ASSIGN_OR_RETURN(x0, lay == Layout::kNHWC ? L.nhwc(xv) : L.rowmajor(xv));
  }

  // Depthwise: kiln's own kernel (lower_conv_depthwise.cc).
  const bool depthwise = depthwise_candidate(L, n);
  if (in_act && !depthwise) return KILN_ERROR(kInternal, "input activation fused into a non-depthwise Conv");
  if (depthwise) return lower_depthwise(L, n, *x0, in_act);

  // (A small-channel transform has put all the padding in already.)
  KILN_ASSIGN_OR_RETURN(const DevValue* x,
                        small ? x0 : pad_extra(L, n, x0, (*p4)[2] - (*p4)[0], (*p4)[3] - (*p4)[1]));

  // Fusion: conv -> [Add(z)] -> [Relu].
  const Value* out = n.outputs[0];
  const Node* add = next_op(L, out, OpKind::kAdd);
  const DevValue* z = nullptr;
  std::vector<const Node*> fused;
  if (add) {
    const Value* other = add->inputs[0] == out ? add->inputs[1] : add->inputs[0];
    if (!L.constant(other) && other->type == out->type &&
        add->outputs[0]->type.shape && add->outputs[0]->type == out->type && L.values.count(other)) {
      KILN_ASSIGN_OR_RETURN(z, lay == Layout::kNHWC ? L.nhwc(other) : L.rowmajor(other));
      fused.push_back(add);
      out = add->outputs[0];
    }
  }
  bool relu = false;
  if (const Node* r = next_op(L, out, OpKind::kRelu)) {
    relu = true;
    fused.push_back(r);
    out = r->outputs[0];
  }
  bool fuse = relu || z || bias_t;
  // A SiLU after it (x * sigmoid(x), fused by fuse-elementwise or not): only the graph path below
  // applies it in the same pass; elsewhere it stays a step of its own.
  std::vector<const Node*> silu;
  const bool one_by_one = w->dim(2) == 1 && w->dim(3) == 1;
  if (!relu && (!patch || one_by_one)) silu = silu_after(L, out);

  // A 1x1, stride-1, unpadded convolution in NHWC is a GEMM over N*H*W rows:
  //   y[NHW, K] = x[NHW, C] . w[K, C]^T (+ bias, + residual as cuBLASLt's C, relu epilogue)
  // and cuBLASLt beats cuDNN's legacy fused call on it (ResNet-50 has 36 of them). A "patchify"
  // convolution (kernel == stride, no padding: ViT's 16x16/16 embedding) is the same GEMM after
  // one strided copy gathers each patch into a row [C*R*S] (im2col without overlap).
  if (patch) {
    int64_t N = x->dims[0], C = x->dims[1], R = w->dim(2), S = w->dim(3);
    int64_t P = n.outputs[0]->type.shape->dims[2].value(), Q = n.outputs[0]->type.shape->dims[3].value();
    GemmShape gs;
    gs.m = N * P * Q;
    gs.k = C * R * S;
    gs.n = w->dim(0);
    gs.trans_b = true;
    DevValue rows;  // [N*P*Q, C*R*S]: x itself for 1x1, else the gathered patches
    const DevValue* a = x;
    if (R != 1 || S != 1) {
      std::vector<int64_t> xs = x->strides();  // logical [n, c, h, w] order
      k::NdStrides from = nd({N, P, Q, C, R, S}, {xs[0], R * xs[2], S * xs[3], xs[1], xs[2], xs[3]});
      k::NdStrides to = nd({N, P, Q, C, R, S}, contiguous_strides({N, P, Q, C, R, S}));
      rows.dt = *dt;
      rows.dims = {gs.m, gs.k};
      rows.ref = Ref{false, L.scratch(size_t(gs.m * gs.k) * size_t(k::dt_size(*dt)))};
      emit_copy_nd(L, &n, fmt::format("kernel copy_nd (patches {}x{})", R, S), k::dt_size(*dt), x->ref, 0, from, rows.ref,
                   0, to);
      a = &rows;
    }
    DevValue wv, bv;
    Epilogue ep;
    if (bias_t) ep.bias = &bv;  // uploaded below (gemm_ms reads only whether there is a bias)
    if (relu) ep.act = Act::kRelu;
    if (z) {
      ep.c = z;
      ep.beta = 1;
    }
    // cuBLASLt has no SiLU epilogue: a 1x1 convolution with one after it (EfficientNet's expansions)
    // is also timed as a cuDNN operation graph, against the GEMM and the SiLU's pass.
    const std::array<int64_t, 4> wdims{w->dim(0), w->dim(1), 1, 1};
    if (!silu.empty() && one_by_one && graph_conv_fits(L, lay, group, wdims)) {
      GraphConv gc = graph_conv_shape(*dt, x->dims, wdims, yd_dims, {0, 0}, {1, 1}, dil, bias_t, z, false, silu);
      KILN_ASSIGN_OR_RETURN(float lt_ms, gemm_ms(L, gs, ep, *dt));
      const double other_ms = lt_ms > 0 ? lt_ms + pass_over_ms(gs.m * gs.n, k::dt_size(*dt)) : -1.0;
      KILN_ASSIGN_OR_RETURN(bool done, try_graph_conv(L, n, gc, *x, *w, bias_t, z, out, fused, silu, other_ms));
      if (done) return Status::ok();
    }
    // (Uploaded only now: a graph takes its own KRSC copy, and an unused weight would stay in the engine.)
    KILN_ASSIGN_OR_RETURN(wv.ref, L.upload_constant(*w, *dt));
    wv.dt = *dt;
    if (bias_t) {
      KILN_ASSIGN_OR_RETURN(bv.ref, L.upload_constant(*bias_t, *dt));
      bv.dt = *dt;
    }
    const DevValue& y = L.define(out, lay);
    Ref yr = y.ref;
    KILN_RETURN_IF_ERROR(emit_gemm(L, n, a, &wv, gs, ep, yr, *dt));
    for (const Node* f : fused) L.mark_fused(f, &n);
    return Status::ok();
  }

  std::array<int64_t, 4> wdims{w->dim(0), w->dim(1), w->dim(2), w->dim(3)};
  std::array<int, 2> cpads = *pads, cstride{int(st[0]), int(st[1])};
  if (small) {
    wdims = {w->dim(0), small->cp, small->r, small->s};
    cpads = {0, 0};
    cstride = {int(small->stride_h), int(small->stride_w)};
  }
  KILN_ASSIGN_OR_RETURN(ConvDescs descs, conv_descs(L, *dt, lay, x->dims, wdims, cpads, cstride, {int(dil[0]), int(dil[1])},
                                                    group, yd_dims));
  auto xd = descs.x, yd = descs.y;
  auto wd = descs.w;
  auto cd = descs.c;
  int eb = k::dt_size(*dt);
  int64_t ynum = 1;
  for (int64_t d : yd_dims) ynum *= d;
  KILN_ASSIGN_OR_RETURN(AlgoChoice choice, pick_algo(L, descs));
  cudnnConvolutionFwdAlgo_t algo = choice.algo;
  // cuDNN's fused call accepts IDENTITY activation only with IMPLICIT_PRECOMP_GEMM. With a bias
  // alone, the best algorithm plus a separate bias add (one pass over y, ~3 us) can beat it
  // (depthwise convolutions at large batch do, by far); with a residual, fused is the only way.
  bool separate_bias = false;
  if (fuse && !relu) {
    double add_ms = 2.0 * double(ynum) * eb / 2.5e9 + 0.003;
    separate_bias = !z && choice.ms >= 0 && algo != CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM &&
                    (choice.precomp_ms < 0 || choice.ms + add_ms < choice.precomp_ms);
    if (!separate_bias) algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
  }
  size_t ws = 0;
  KILN_CUDA_TRY(cudnnGetConvolutionForwardWorkspaceSize(L.dnn, xd, wd, cd, yd, algo, &ws));
  if (ws > L.options().workspace_bytes && fuse && !relu && !z && algo != choice.algo) {
    // The fused call's algorithm needs more scratch than we have (ViT's 16x16/16 patch convolution
    // at batch 256 wants ~200 MB): the picked algorithm plus a separate bias add fits.
    separate_bias = true;
    algo = choice.algo;
    KILN_CUDA_TRY(cudnnGetConvolutionForwardWorkspaceSize(L.dnn, xd, wd, cd, yd, algo, &ws));
  }
  if (ws > L.options().workspace_bytes && (!fuse || relu || separate_bias)) {
    // The size cuDNN reports for an algorithm can exceed what Find reported for it (seen at ResNet-50
    // batch 256, where a declined conv then ran on the CPU): take the next that fits. IMPLICIT_GEMM
    // needs no workspace, so one always does.
    std::vector<cudnnConvolutionFwdAlgo_t> next = choice.ranked;
    next.push_back(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM);
    for (cudnnConvolutionFwdAlgo_t a : next) {
      size_t need = 0;
      if (cudnnGetConvolutionForwardWorkspaceSize(L.dnn, xd, wd, cd, yd, a, &need) != CUDNN_STATUS_SUCCESS) continue;
      if (need <= L.options().workspace_bytes) {
        algo = a;
        ws = need;
        break;
      }
    }
  }
  if (ws > L.options().workspace_bytes) {
    KILN_UNSUPPORTED("convolution needs {} bytes of workspace, more than the {} allowed (BuildOptions::workspace_bytes)",
                     ws, L.options().workspace_bytes);
  }
  // The convolution, its epilogue and a SiLU as one cuDNN operation graph, where that is faster than
  // the algorithm above and the separate passes it leaves (a bias add, the SiLU).
  if (graph_conv_fits(L, lay, group, wdims) && !small) {
    GraphConv gc = graph_conv_shape(*dt, x->dims, wdims, yd_dims, cpads, cstride, dil, bias_t, z, relu, silu);
    const double pass_ms = pass_over_ms(ynum, eb);
    const double legacy_ms = (algo == choice.algo ? choice.ms : choice.precomp_ms) + (separate_bias ? pass_ms : 0.0) +
                             (silu.empty() ? 0.0 : pass_ms);
    const bool timed = choice.ms > 0 && (algo == choice.algo || choice.precomp_ms > 0);
    KILN_ASSIGN_OR_RETURN(bool done, try_graph_conv(L, n, gc, *x, *w, bias_t, z, out, fused, silu, timed ? legacy_ms : -1.0));
    if (done) return Status::ok();
  }

  Ref wr;
  if (small) {
    const SmallC& sc = *small;
    const std::string form = fmt::format("small-c {} {} {} {} {} {}", sc.block, sc.off_h, sc.off_w, sc.r, sc.s, sc.cp);
    KILN_ASSIGN_OR_RETURN(wr, L.upload_derived(*w, form, *dt, [w, sc]() { return small_channel_filter(*w, sc); }));
  } else if (lay == Layout::kNHWC) {
    KILN_ASSIGN_OR_RETURN(wr, L.upload_derived(*w, "krsc", *dt, [w]() { return to_krsc(*w); }));
  } else {
    KILN_ASSIGN_OR_RETURN(wr, L.upload_constant(*w, *dt));
  }
  Ref br;
  if (fuse && bias_t) {
    KILN_ASSIGN_OR_RETURN(br, L.upload_constant(*bias_t, *dt));
  } else if (fuse) {
    KILN_ASSIGN_OR_RETURN(Tensor b, Tensor::create(DType::kFloat32, {w->dim(0)}));
    KILN_ASSIGN_OR_RETURN(br, L.upload(b, *dt));
  }
  const DevValue& y = L.define(out, lay);
  std::string impl = fmt::format("cudnn conv {} {} algo {}{}{}{}", lay == Layout::kNHWC ? "NHWC" : "NCHW",
                                 *dt == k::DT::kF32 ? "fp32" : *dt == k::DT::kF16 ? "fp16" : "bf16", int(algo),
                                 bias_t ? (separate_bias ? " +bias (cudnnAddTensor)" : " +bias") : "", z ? " +residual" : "",
                                 relu ? " +relu" : "");
  ByteWriter p;
  p.put(int32_t(*dt));
  p.u8(lay == Layout::kNHWC);
  put(p, x->dims);
  for (int64_t v : wdims) p.i64(v);
  for (int v : {cpads[0], cpads[1], cstride[0], cstride[1], int(dil[0]), int(dil[1])}) p.put(int32_t(v));
  p.i64(group);
  put(p, yd_dims);
  p.put(int32_t(algo));
  p.u8(fuse);
  p.u8(separate_bias);
  p.u8(relu);
  put(p, x->ref);
  put(p, wr);
  put(p, br);
  put(p, z ? z->ref : Ref{});
  put(p, y.ref);
  L.emit(&n, impl, {read_id(x), z ? read_id(z) : -1}, {y.ref.id}, StepOp::kCudnnConv, std::move(p));
  for (const Node* f : fused) L.mark_fused(f, &n);
  return Status::ok();
}

// Four dims (cuDNN's 2-D descriptors), each at least 1 and within int.
std::vector<int64_t> dims4(Params& in, bool& ok) {
  std::vector<int64_t> d = in.dims();
  ok = ok && d.size() == 4 && std::all_of(d.begin(), d.end(), [](int64_t v) { return v >= 1 && v <= INT32_MAX; });
  return d;
}

Status malformed(const Params& in) {
  return KILN_ERROR(kInvalidModel, "step '{}': malformed convolution parameters", in.step().label);
}

Expected<StepFn> bind_cudnn_conv(Params& in, BindCtx& bc) {
  bool ok = true;
  const k::DT dt = in.dt();
  const Layout lay = in.flag() ? Layout::kNHWC : Layout::kRowMajor;
  const std::vector<int64_t> xdims = dims4(in, ok);
  std::array<int64_t, 4> wdims{};
  for (int64_t& v : wdims) v = in.i64();
  std::array<int, 6> ci{};
  for (int& v : ci) v = in.i32();
  const int64_t group = in.i64();
  const std::vector<int64_t> ydims = dims4(in, ok);
  const auto algo = cudnnConvolutionFwdAlgo_t(in.i32());
  const bool fuse = in.flag(), separate_bias = in.flag(), relu = in.flag();
  const Ref xr = in.ref(), wr = in.ref(), br = in.opt_ref(), zr = in.opt_ref(), yr = in.ref();
  KILN_RETURN_IF_ERROR(in.done());
  ok = ok && group >= 1 && group <= INT32_MAX && (!fuse || br.id >= 0) &&
       std::all_of(wdims.begin(), wdims.end(), [](int64_t v) { return v >= 1 && v <= INT32_MAX; });
  if (!ok) return malformed(in);
  KILN_ASSIGN_OR_RETURN(ConvDescs d, conv_descs(bc.keep_alive, bc.opt.precision, bc.opt.workspace_bytes, dt, lay, xdims,
                                                wdims, {ci[0], ci[1]}, {ci[2], ci[3]}, {ci[4], ci[5]}, group, ydims));
  size_t ws = 0;
  if (cudnnGetConvolutionForwardWorkspaceSize(bc.dnn, d.x, d.w, d.c, d.y, algo, &ws) != CUDNN_STATUS_SUCCESS ||
      ws > bc.opt.workspace_bytes) {
    return KILN_ERROR(kInvalidModel, "step '{}': cuDNN refuses the engine's algorithm {} for this convolution",
                      in.step().label, int(algo));
  }
  cudnnTensorDescriptor_t bd = nullptr;
  cudnnActivationDescriptor_t ad = nullptr;
  if (fuse) {
    KILN_ASSIGN_OR_RETURN(bd, tensor_desc(bc.keep_alive, {1, wdims[0], 1, 1}, dt, separate_bias ? lay : Layout::kRowMajor));
    KILN_CUDA_TRY(cudnnCreateActivationDescriptor(&ad));
    hold(bc.keep_alive, ad, destroy_act);
    KILN_CUDA_TRY(cudnnSetActivationDescriptor(ad, relu ? CUDNN_ACTIVATION_RELU : CUDNN_ACTIVATION_IDENTITY,
                                               CUDNN_NOT_PROPAGATE_NAN, 0.0));
  }
  const bool has_z = zr.id >= 0;
  auto xd = d.x, yd = d.y;
  auto wd = d.w;
  auto cd = d.c;
  return StepFn([=](const RunCtx& c) -> Status {
    float one = 1.0f, zero = 0.0f;
    if (!fuse || separate_bias) {
      KILN_CUDA_TRY(cudnnConvolutionForward(c.dnn, &one, xd, c.ptr(xr), wd, c.ptr(wr), cd, algo, c.workspace,
                                            c.workspace_bytes, &zero, yd, c.ptr(yr)));
      if (separate_bias) KILN_CUDA_TRY(cudnnAddTensor(c.dnn, &one, bd, c.ptr(br), &one, yd, c.ptr(yr)));
      return Status::ok();
    }
    void* yp = c.ptr(yr);
    KILN_CUDA_TRY(cudnnConvolutionBiasActivationForward(c.dnn, &one, xd, c.ptr(xr), wd, c.ptr(wr), cd, algo, c.workspace,
                                                        c.workspace_bytes, has_z ? &one : &zero, yd,
                                                        has_z ? c.ptr(zr) : yp, bd, c.ptr(br), ad, yd, yp));
    return Status::ok();
  });
}

Expected<StepFn> bind_space_to_depth(Params& in, BindCtx&) {
  const Ref xr = in.ref();
  const k::DT in_dt = in.dt();
  const Ref pr = in.ref();
  const k::DT out_dt = in.dt();
  k::SpaceToDepthShape sh{};
  for (int64_t* v : {&sh.n, &sh.c, &sh.h, &sh.w, &sh.sn, &sh.sc, &sh.sh, &sh.sw, &sh.block, &sh.top, &sh.left, &sh.ho,
                     &sh.wo, &sh.cp}) {
    *v = in.i64();
  }
  KILN_RETURN_IF_ERROR(in.done());
  return StepFn([=](const RunCtx& c) {
    return cuda_status(k::space_to_depth_nhwc(c.ptr(xr), in_dt, sh, c.ptr(pr), out_dt, c.stream), "space_to_depth_nhwc");
  });
}

}  // namespace

void register_conv_binders(std::map<StepOp, BindFn>& t) {
  register_graph_conv_binder(t);
  t[StepOp::kCudnnConv] = bind_cudnn_conv;
  register_depthwise_binder(t);
  t[StepOp::kSpaceToDepth] = bind_space_to_depth;
}

void register_conv_lowerings(std::map<OpKind, LowerFn>& t) {
  t[OpKind::kConv] = lower_conv;
}

Expected<ConvDescs> make_conv_descs(std::vector<std::shared_ptr<void>>& keep, Precision prec, size_t workspace, k::DT dt,
                                    Layout lay, const std::vector<int64_t>& xdims, const std::array<int64_t, 4>& wdims,
                                    std::array<int, 2> pads, std::array<int, 2> stride, std::array<int, 2> dil,
                                    int64_t group, const std::vector<int64_t>& ydims) {
  return conv_descs(keep, prec, workspace, dt, lay, xdims, wdims, pads, stride, dil, group, ydims);
}

Expected<Tensor> filter_krsc(const Tensor& w) { return to_krsc(w); }

Expected<cudnnTensorDescriptor_t> make_tensor_desc(std::vector<std::shared_ptr<void>>& keep, const std::vector<int64_t>& d,
                                                   k::DT dt, Layout lay) {
  return tensor_desc(keep, d, dt, lay);
}

}  // namespace kiln::cuda
