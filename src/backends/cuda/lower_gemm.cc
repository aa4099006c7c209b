// MatMul and Gemm through cuBLASLt, with the bias (+ReLU/GELU) epilogue fused when the product
// feeds an Add of a per-column constant (MatMul + Add is how PyTorch exports nn.Linear).
//
// Row-major trick: cuBLASLt is column-major, and a row-major [M,K] matrix is a column-major
// [K,M] one. So D = A.B (row-major) is computed as D^T = B^T . A^T (column-major): cuBLASLt's
// "A" is our B, its "B" is our A, m = N, n = M, and the bias vector runs along m = N.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "backends/cuda/lower.h"
#include "backends/cuda/timing_cache.h"
#include "backends/cuda/tuning.h"
#include "ops/op_registry.h"

namespace kiln::cuda {

namespace {


cudaDataType_t lt_type(k::DT d) {
  switch (d) {
    case k::DT::kF16: return CUDA_R_16F;
    case k::DT::kBF16: return CUDA_R_16BF;
    case k::DT::kF64: return CUDA_R_64F;
    default: return CUDA_R_32F;
  }
}

Status destroy_desc(cublasLtMatmulDesc_t d) { return cuda_status(cublasLtMatmulDescDestroy(d), "destroy"); }
Status destroy_layout(cublasLtMatrixLayout_t d) { return cuda_status(cublasLtMatrixLayoutDestroy(d), "destroy"); }

Expected<cublasLtMatrixLayout_t> make_layout(std::vector<std::shared_ptr<void>>& keep, cudaDataType_t t, int64_t rows,
                                             int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  KILN_CUDA_TRY(cublasLtMatrixLayoutCreate(&l, t, uint64_t(rows), uint64_t(cols), ld));
  hold(keep, l, destroy_layout);
  if (batch > 1) {
    int32_t b = int32_t(batch);
    KILN_CUDA_TRY(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof(b)));
    KILN_CUDA_TRY(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  }
  return l;
}

// The matmul descriptor and the three matrix layouts of a product, held in `keep`.
struct LtDescs {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
};

Expected<LtDescs> make_lt_descs(std::vector<std::shared_ptr<void>>& keep, k::DT dt, cublasComputeType_t ct,
                                const GemmShape& s, cublasLtEpilogue_t epi) {
  cudaDataType_t t = lt_type(dt);
  LtDescs d;
  // f64 products scale in f64 (alpha and beta are doubles); every other in f32.
  KILN_CUDA_TRY(cublasLtMatmulDescCreate(&d.desc, ct, ct == CUBLAS_COMPUTE_64F ? CUDA_R_64F : CUDA_R_32F));
  hold(keep, d.desc, destroy_desc);
  cublasOperation_t opa = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, opb = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  KILN_CUDA_TRY(cublasLtMatmulDescSetAttribute(d.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  KILN_CUDA_TRY(cublasLtMatmulDescSetAttribute(d.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  KILN_CUDA_TRY(cublasLtMatmulDescSetAttribute(d.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  // Column-major views (see the header comment): "A" = our B, "B" = our A, D = [n, m] ld n.
  KILN_ASSIGN_OR_RETURN(d.la, make_layout(keep, t, s.trans_b ? s.k : s.n, s.trans_b ? s.n : s.k, s.trans_b ? s.k : s.n,
                                          s.batch, s.stride_b));
  KILN_ASSIGN_OR_RETURN(d.lb, make_layout(keep, t, s.trans_a ? s.m : s.k, s.trans_a ? s.k : s.m, s.trans_a ? s.m : s.k,
                                          s.batch, s.stride_a));
  KILN_ASSIGN_OR_RETURN(d.ld, make_layout(keep, t, s.n, s.m, s.n, s.batch, s.stride_d));
  return d;
}

template <typename T>
T algo_config(const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T v{};
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&a, attr, &v, sizeof(v), &written) != CUBLAS_STATUS_SUCCESS) return T{};
  return v;
}

// The heuristic's candidates plus split-K variants of the first few that allow it. At small M
// (BERT at batch 1: 128 rows) the heuristic's tiles leave most SMs idle on N = 768 products and
// the GEMM reads its weights at a fraction of the memory bandwidth; splitting K gives every SM
// work. Each variant is validated by cublasLtMatmulAlgoCheck against the workspace we have.
std::vector<cublasLtMatmulAlgo_t> gemm_candidates(Lowering& L, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                                                  cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t ld,
                                                  const cublasLtMatmulHeuristicResult_t* heur, int found,
                                                  const GemmShape& s, size_t ws) {
  std::vector<cublasLtMatmulAlgo_t> out;
  for (int i = 0; i < found; ++i) {
    if (heur[i].state == CUBLAS_STATUS_SUCCESS) out.push_back(heur[i].algo);
  }
  constexpr int kSplitBases = 4;
  int bases = std::min<int>(int(out.size()), kSplitBases);
  for (int i = 0; i < bases; ++i) {
    const cublasLtMatmulAlgo_t base = out[size_t(i)];
    int32_t splittable = 0;
    uint32_t schemes = 0;
    size_t written = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &splittable, sizeof(splittable),
                                          &written) != CUBLAS_STATUS_SUCCESS || !splittable ||
        algo_config<int32_t>(base, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) > 1 ||
        cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &schemes, sizeof(schemes),
                                          &written) != CUBLAS_STATUS_SUCCESS) {
      continue;
    }
    // Reduce in fp32 when the algorithm can (the split partial sums of an fp16 product must not
    // round to fp16 before they are added); in place otherwise.
    uint32_t scheme = (schemes & CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE) ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE
                      : (schemes & CUBLASLT_REDUCTION_SCHEME_INPLACE) ? CUBLASLT_REDUCTION_SCHEME_INPLACE
                                                                      : 0;
    if (!scheme) continue;
    for (int32_t split : {2, 3, 4, 6, 8, 12, 16}) {
      if (s.k / split < 128) break;
      cublasLtMatmulAlgo_t v = base;
      cublasLtMatmulHeuristicResult_t check{};
      if (cublasLtMatmulAlgoConfigSetAttribute(&v, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof(split)) !=
              CUBLAS_STATUS_SUCCESS ||
          cublasLtMatmulAlgoConfigSetAttribute(&v, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof(scheme)) !=
              CUBLAS_STATUS_SUCCESS ||
          cublasLtMatmulAlgoCheck(L.lt, desc, la, lb, ld, ld, &v, &check) != CUBLAS_STATUS_SUCCESS ||
          check.workspaceSize > ws) {
        continue;
      }
      out.push_back(v);
    }
  }
  return out;
}

// The timing cache's value for a cuBLASLt choice: the opaque algorithm's bytes in hex, then the ms.
std::string encode_algo(const cublasLtMatmulAlgo_t& a, float ms) {
  std::string hex;
  for (uint64_t w : a.data) hex += fmt::format("{:016x}", w);
  return fmt::format("{} {}", hex, ms);
}

bool decode_algo(const std::string& v, cublasLtMatmulAlgo_t& a, float& ms) {
  constexpr size_t kHex = sizeof(a.data) * 2;
  if (v.size() < kHex + 2 || v[kHex] != ' ') return false;
  for (size_t i = 0; i < sizeof(a.data) / sizeof(a.data[0]); ++i) {
    const std::string word = v.substr(16 * i, 16);
    if (word.find_first_not_of("0123456789abcdef") != std::string::npos) return false;
    a.data[i] = std::stoull(word, nullptr, 16);
  }
  char* end = nullptr;
  ms = std::strtof(v.c_str() + kHex + 1, &end);
  return end && *end == '\0';
}

// The heuristic's candidates (and split-K variants), timed on scratch buffers when autotuning
// (TensorRT's tactic timing for GEMMs); the heuristic's first choice otherwise or when timing
// cannot run. Each candidate is timed as the forward runs it (tuning.h): launches back to back in a
// captured graph, each reading its weight from DRAM (a model's weights do not fit the 50 MB L2),
// so small-M products are timed at the bandwidth and launch overlap they get in the model. Shapes
// repeat across layers, so choices are cached per shape and epilogue; gemm_algo_ms keeps the
// chosen algorithm's milliseconds per launch.
Expected<cublasLtMatmulAlgo_t> pick_lt_algo(Lowering& L, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                                            cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t ld, const GemmShape& s,
                                            const Epilogue& ep, k::DT dt, const std::string& key) {
  if (auto it = L.gemm_algos.find(key); it != L.gemm_algos.end()) return it->second;
  // A timed choice from the timing cache, if cuBLASLt still accepts it for these descriptors.
  TimingCache* cache = L.options().autotune ? L.options().timing_cache.get() : nullptr;
  if (cache) {
    std::optional<std::string> v = cache->get("lt", key);
    if (!v && !L.options().time_misses) v = cache->nearest("lt", key);
    if (v) {
      cublasLtMatmulAlgo_t algo{};
      float ms = -1;
      cublasLtMatmulHeuristicResult_t check{};
      if (decode_algo(*v, algo, ms) &&
          cublasLtMatmulAlgoCheck(L.lt, desc, la, lb, ld, ld, &algo, &check) == CUBLAS_STATUS_SUCCESS &&
          check.workspaceSize <= L.options().workspace_bytes) {
        L.gemm_algos[key] = algo;
        if (ms > 0) L.gemm_algo_ms[key] = ms;
        return algo;
      }
    }
  }
  constexpr int kMax = 24;
  cublasLtMatmulPreference_t pref = nullptr;
  KILN_CUDA_TRY(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = L.options().workspace_bytes;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  cublasLtMatmulHeuristicResult_t heur[kMax] = {};
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulAlgoGetHeuristic(L.lt, desc, la, lb, ld, ld, pref, kMax, heur, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    KILN_UNSUPPORTED("cuBLASLt has no algorithm for m={} n={} k={} batch={} ({})", s.m, s.n, s.k, s.batch,
                     st == CUBLAS_STATUS_SUCCESS ? "none found" : "status " + std::to_string(int(st)));
  }
  cublasLtMatmulAlgo_t best = heur[0].algo;
  float best_timed_ms = -1;
  std::vector<cublasLtMatmulAlgo_t> cands = L.options().autotune && L.options().time_misses ? gemm_candidates(L, desc, la, lb, ld, heur, found, s, ws)
                                                                 : std::vector<cublasLtMatmulAlgo_t>{};
  if (cands.size() > 1) {
    size_t eb = size_t(k::dt_size(dt));
    auto span = [&](int64_t rows, int64_t cols, int64_t stride) {
      return eb * size_t(s.batch > 1 && stride > 0 ? s.batch * stride : rows * cols);
    };
    // Our B is the product's weight (tuning.h ProductOperands).
    const size_t d_bytes = span(s.m, s.n, s.stride_d);
    ProductOperands op(span(s.m, s.k, s.stride_a), span(s.k, s.n, s.stride_b), d_bytes, ep.c != nullptr);
    Scratch d, bias;
    bool ok = op.ok() && cudaMalloc(&d.p, d_bytes) == cudaSuccess &&
              cudaMalloc(&bias.p, eb * size_t(s.n)) == cudaSuccess &&
              cudaMemset(d.p, 0, d_bytes) == cudaSuccess &&
              cudaMemset(bias.p, 0, eb * size_t(s.n)) == cudaSuccess;
    if (ok && ep.bias) {
      ok = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias.p, sizeof(bias.p)) ==
           CUBLAS_STATUS_SUCCESS;
    }
    float alpha = 1, beta = ep.c ? 1.0f : 0.0f, best_ms = -1;
    const double alpha_d = alpha, beta_d = beta;
    const bool f64 = dt == k::DT::kF64;
    const void* pa = f64 ? static_cast<const void*>(&alpha_d) : &alpha;
    const void* pb = f64 ? static_cast<const void*>(&beta_d) : &beta;
    for (const cublasLtMatmulAlgo_t& algo : cands) {
      if (!ok) break;
      auto launch = [&](int i, cudaStream_t stream) {
        return cublasLtMatmul(L.lt, desc, pa, op.w.copy(i), la, op.a.copy(i), lb, pb, ep.c ? op.c.copy(i) : d.p, ld,
                              d.p, ld, &algo, L.build_workspace, ws, stream) == CUBLAS_STATUS_SUCCESS;
      };
      const float ms = time_in_graph(op.launches, launch);  // -1: the algorithm refuses these operands
      if (ms > 0 && (best_ms < 0 || ms < best_ms)) {
        best_ms = ms;
        best = algo;
      }
    }
    // A failed scratch allocation is not an error: the heuristic's choice stands, the report shows no time.
    KILN_RETURN_IF_ERROR(finish_timing(fmt::format("cuBLASLt algorithms for m={} n={} k={}", s.m, s.n, s.k)));
    best_timed_ms = best_ms;
  }
  L.gemm_algos[key] = best;
  if (best_timed_ms > 0) L.gemm_algo_ms[key] = best_timed_ms;
  // Untimed choices (one candidate, or timing could not run) are kept too: a build from the cache
  // then makes every choice the first build made.
  if (cache && L.options().time_misses) cache->put("lt", key, encode_algo(best, best_timed_ms));
  return best;
}

// "algo 21 tile 18 split-k 4" for the build report: which cuBLASLt kernel the autotuner chose.
std::string describe_algo(const cublasLtMatmulAlgo_t& a) {
  int32_t split = algo_config<int32_t>(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
  return fmt::format("algo {} tile {}{}", algo_config<int32_t>(a, CUBLASLT_ALGO_CONFIG_ID),
                     algo_config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_TILE_ID),
                     split > 1 ? fmt::format(" split-k {}", split) : "");
}

// emit_gemm's cuBLASLt choice for (s, ep, dt): its descriptors, algorithm and timing-cache key.
struct LtChoice {
  cublasComputeType_t ct;
  cublasLtEpilogue_t epi;
  cublasLtMatmulAlgo_t algo;
  float ms;  // per launch as timed, -1 when not timed
};

Expected<LtChoice> lt_choice(Lowering& L, const GemmShape& s, const Epilogue& ep, k::DT dt) {
  LtChoice c;
  c.ct = dt == k::DT::kF64                                              ? CUBLAS_COMPUTE_64F
         : L.options().precision == Precision::kTf32 && dt == k::DT::kF32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                          : CUBLAS_COMPUTE_32F;
  c.epi = CUBLASLT_EPILOGUE_DEFAULT;
  if (ep.bias) {
    c.epi = ep.act == Act::kRelu ? CUBLASLT_EPILOGUE_RELU_BIAS
            : ep.act == Act::kGelu ? CUBLASLT_EPILOGUE_GELU_BIAS
                                   : CUBLASLT_EPILOGUE_BIAS;
  } else if (ep.act == Act::kRelu) {
    c.epi = CUBLASLT_EPILOGUE_RELU;
  } else if (ep.act == Act::kGelu) {
    c.epi = CUBLASLT_EPILOGUE_GELU;
  }
  KILN_ASSIGN_OR_RETURN(LtDescs lt, make_lt_descs(L.keep_alive, dt, c.ct, s, c.epi));
  std::string key = fmt::format("dt{} t{}{} e{} c{} {} @ {} {} {} b{} {} {} {}", int(dt), int(s.trans_a), int(s.trans_b),
                                int(c.epi), ep.c != nullptr, int(c.ct), s.m, s.n, s.k, s.batch, s.stride_a, s.stride_b,
                                s.stride_d);
  KILN_ASSIGN_OR_RETURN(c.algo, pick_lt_algo(L, lt.desc, lt.la, lt.lb, lt.ld, s, ep, dt, key));
  auto timed = L.gemm_algo_ms.find(key);
  c.ms = timed == L.gemm_algo_ms.end() ? -1.0f : timed->second;
  return c;
}

}  // namespace

Expected<float> gemm_ms(Lowering& L, const GemmShape& s, const Epilogue& ep, k::DT dt) {
  KILN_ASSIGN_OR_RETURN(LtChoice c, lt_choice(L, s, ep, dt));
  return c.ms;
}

Status emit_gemm(Lowering& L, const Node& n, const DevValue* a, const DevValue* b, const GemmShape& s, const Epilogue& ep,
                 Ref y, k::DT dt) {
  KILN_ASSIGN_OR_RETURN(LtChoice choice, lt_choice(L, s, ep, dt));
  const cublasComputeType_t ct = choice.ct;
  const cublasLtEpilogue_t epi = choice.epi;
  const cublasLtMatmulAlgo_t algo = choice.algo;
  const float lt_ms = choice.ms;
  // lost: what the Hopper GEMM measured when it was timed and lost to cuBLASLt, for the report.
  std::string lost;
  KILN_ASSIGN_OR_RETURN(bool sm90, try_emit_gemm_sm90(L, n, a, b, s, ep, y, dt, lt_ms, &lost));
  if (sm90) return Status::ok();
  const bool has_bias = ep.bias != nullptr, has_c = ep.c != nullptr;
  std::vector<int> reads = {read_id(a), read_id(b)};
  if (ep.bias) reads.push_back(read_id(ep.bias));
  if (ep.c) reads.push_back(read_id(ep.c));
  std::string impl = fmt::format("cublasLt {} m={} n={} k={}{}{}{}{}", dt == k::DT::kF64 ? "fp64" :
                                 L.options().precision == Precision::kTf32 ? "tf32" :
                                 dt == k::DT::kF32 ? "fp32" : dt == k::DT::kF16 ? "fp16" : "bf16", s.m, s.n, s.k,
                                 s.batch > 1 ? fmt::format(" batch={}", s.batch) : "", has_bias ? " +bias" : "",
                                 ep.c ? (ep.beta == 1.0f && ep.alpha == 1.0f ? " +residual" : " +C") : "",
                                 ep.act == Act::kNone ? "" : " +" + std::string(act_name(ep.act))) +
                     " (" + describe_algo(algo) +
                     (lt_ms > 0 ? fmt::format(", {:.1f} us{}", 1000.0f * lt_ms, lost) : "") + ")";
  ByteWriter w;
  w.put(int32_t(dt));
  w.put(int32_t(ct));
  w.put(int32_t(epi));
  for (int64_t v : {s.m, s.n, s.k, s.batch, s.stride_a, s.stride_b, s.stride_d}) w.i64(v);
  w.u8(s.trans_a);
  w.u8(s.trans_b);
  w.put(ep.alpha);
  w.put(has_c ? ep.beta : 0.0f);
  for (uint64_t word : algo.data) w.u64(word);
  put(w, a->ref);
  put(w, b->ref);
  put(w, has_bias ? ep.bias->ref : Ref{});
  put(w, has_c ? ep.c->ref : Ref{});
  put(w, y);
  L.emit(&n, impl, reads, {y.id}, StepOp::kLtMatmul, std::move(w));
  return Status::ok();
}

namespace {

// A cuBLASLt matmul with the algorithm its build chose, checked again against these descriptors
// (a file's algorithm that this cuBLASLt refuses is an error, not a launch).
Expected<StepFn> bind_lt_matmul(Params& in, BindCtx& bc) {
  const k::DT dt = in.dt();
  const auto ct = cublasComputeType_t(in.i32());
  const auto epi = cublasLtEpilogue_t(in.i32());
  GemmShape s;
  for (int64_t* v : {&s.m, &s.n, &s.k, &s.batch, &s.stride_a, &s.stride_b, &s.stride_d}) *v = in.i64();
  s.trans_a = in.flag();
  s.trans_b = in.flag();
  const float alpha = in.f32(), beta = in.f32();
  const double alpha_d = alpha, beta_d = beta;  // f64 products' scale type
  cublasLtMatmulAlgo_t algo{};
  for (uint64_t& word : algo.data) word = uint64_t(in.i64());
  const Ref ar = in.ref(), br = in.ref(), bias = in.opt_ref(), cr = in.opt_ref(), y = in.ref();
  KILN_RETURN_IF_ERROR(in.done());
  if (s.m < 1 || s.n < 1 || s.k < 1 || s.batch < 1) {
    return KILN_ERROR(kInvalidModel, "step '{}': a matmul of no size", in.step().label);
  }
  KILN_ASSIGN_OR_RETURN(LtDescs lt, make_lt_descs(bc.keep_alive, dt, ct, s, epi));
  cublasLtMatmulHeuristicResult_t check{};
  if (cublasLtMatmulAlgoCheck(bc.lt, lt.desc, lt.la, lt.lb, lt.ld, lt.ld, &algo, &check) != CUBLAS_STATUS_SUCCESS ||
      check.workspaceSize > bc.opt.workspace_bytes) {
    return KILN_ERROR(kInvalidModel, "step '{}': cuBLASLt refuses the engine's algorithm for this product", in.step().label);
  }
  const bool has_bias = bias.id >= 0, has_c = cr.id >= 0;
  auto mu = std::make_shared<std::mutex>();  // the bias pointer lives in the descriptor sessions share
  bc.keep_alive.push_back(mu);
  return StepFn([=](const RunCtx& c) -> Status {
    if (has_bias) {
      std::lock_guard<std::mutex> lock(*mu);
      void* bp = c.ptr(bias);
      KILN_CUDA_TRY(cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp)));
    }
    void* d = c.ptr(y);
    const void* cin = has_c ? c.ptr(cr) : d;
    const bool f64 = ct == CUBLAS_COMPUTE_64F;
    KILN_CUDA_TRY(cublasLtMatmul(c.lt, lt.desc, f64 ? static_cast<const void*>(&alpha_d) : &alpha, c.ptr(br), lt.la,
                                 c.ptr(ar), lt.lb, f64 ? static_cast<const void*>(&beta_d) : &beta, cin, lt.ld, d, lt.ld,
                                 &algo, c.workspace, c.workspace_bytes, c.stream));
    return Status::ok();
  });
}

}  // namespace

ProductScratch::ProductScratch(const GemmShape& s, bool has_c)
    : op(2 * size_t(s.m * s.k), 2 * size_t(s.n * s.k), 2 * size_t(s.m * s.n), has_c) {
  const size_t d_bytes = 2 * size_t(s.m * s.n), bias_bytes = 2 * size_t(s.n);
  ok_ = op.ok() && cudaMalloc(&d.p, d_bytes) == cudaSuccess && cudaMalloc(&bias.p, bias_bytes) == cudaSuccess &&
        cudaMemset(bias.p, 0x3c, bias_bytes) == cudaSuccess;
}

Expected<Ref> transposed_weight(Lowering& L, const DevValue* w, int64_t rows, int64_t cols, std::map<int, Ref>& cache) {
  if (auto it = cache.find(w->ref.id); it != cache.end()) return it->second;
  const std::string_view host = L.weight_host(w->ref.id);
  if (host.size() != size_t(rows * cols) * 2) {
    return KILN_ERROR(kInternal, "weight of {} bytes for a {}x{} matrix of 16-bit elements", host.size(), rows, cols);
  }
  std::vector<uint16_t> dst(size_t(rows * cols));
  const auto* src = reinterpret_cast<const uint16_t*>(host.data());
  // 64x64 blocks (reads and writes both stay in cache), blocks of rows spread over the thread pool:
  // a transformer's weights are most of its engine's load time otherwise.
  constexpr int64_t kB = 64;
  parallel_for((rows + kB - 1) / kB, 1, [&](int64_t rb0, int64_t rb1) {
    for (int64_t r0 = rb0 * kB; r0 < std::min(rows, rb1 * kB); r0 += kB) {
      for (int64_t c0 = 0; c0 < cols; c0 += kB) {
        for (int64_t r = r0; r < std::min(rows, r0 + kB); ++r) {
          for (int64_t c = c0; c < std::min(cols, c0 + kB); ++c) dst[size_t(c * rows + r)] = src[size_t(r * cols + c)];
        }
      }
    }
  });
  KILN_ASSIGN_OR_RETURN(Ref t, L.upload_raw(dst.data(), dst.size() * 2));
  cache[w->ref.id] = t;
  return t;
}

namespace {

// The node consuming `v` alone, if it is op `want`.
const Node* next_op(Lowering& L, const Value* v, OpKind want) {
  const Node* c = L.only_consumer(v);
  return c && c->op == want && !L.is_fused(c) ? c : nullptr;  // not one a pattern has taken
}

}  // namespace

// A residual Add of a full-size tensor already computed becomes cuBLASLt's C input (beta = 1),
// so the transformer's "x + Linear(y)" is one GEMM instead of a GEMM and an elementwise pass. A
// Reshape between them (GPT-2's Gemm on [B*S, E] rows, added back as [B, S, E]) is the same bytes.
const Value* fuse_residual(Lowering& L, const Value* out, k::DT dt, Epilogue& ep, std::vector<const Node*>& fused) {
  const Node* reshape = next_op(L, out, OpKind::kReshape);
  const Value* at = reshape ? reshape->outputs[0] : out;
  const Node* add = next_op(L, at, OpKind::kAdd);
  if (!add || ep.c) return out;
  const Value* other = add->inputs[0] == at ? add->inputs[1] : add->inputs[0];
  if (other == at || L.constant(other) || !L.values.count(other) || !(other->type == at->type) ||
      !(add->outputs[0]->type == at->type)) {
    return out;
  }
  auto r = L.rowmajor(other);
  if (!r || (*r)->dt != dt) return out;
  ep.c = *r;
  ep.beta = 1.0f;
  if (reshape) fused.push_back(reshape);
  fused.push_back(add);
  return add->outputs[0];
}

namespace {

// erf GELU may take cuBLASLt's (tanh) GELU epilogue in half-precision builds: the two differ by at
// most 4.7e-4 (at x = 2.7, where an fp16 step is 2e-3; bf16's is 1.6e-2), i.e. under a quarter of
// a unit of the stored result, and the separate pass costs a full read+write of the MLP's widest
// activation in every layer (bench/RESULTS.md, "(third session) — all five models ahead of eager and
// torch.compile (issues 3, 4)"). fp32 builds keep the exact erf kernel.
bool erf_gelu_as_tanh(k::DT dt) { return dt == k::DT::kF16 || dt == k::DT::kBF16; }

// Relu or Gelu (the model's own, or the fuse-gelu pass's from the decomposed forms) after the
// product: cuBLASLt's epilogue (its GELU is the tanh form; erf GELU joins it only in
// half-precision builds, see erf_gelu_as_tanh).
const Value* fuse_activation(Lowering& L, const Value* out, k::DT dt, Epilogue& ep, std::vector<const Node*>& fused) {
  if (const Node* act = next_op(L, out, OpKind::kRelu)) {
    ep.act = Act::kRelu;
    fused.push_back(act);
    return act->outputs[0];
  }
  // A Gelu node (the fuse-gelu pass's, or the model's own), also through a Reshape (GPT-2's
  // Gemm -> Reshape -> GELU): the product's rows are the same bytes either way.
  const Node* reshape = next_op(L, out, OpKind::kReshape);
  const Value* gin = reshape && !L.is_graph_output(reshape->outputs[0]) ? reshape->outputs[0] : out;
  if (const Node* g = next_op(L, gin, OpKind::kGelu)) {
    if (g->attr_string("approximate", "none") != "tanh" && !erf_gelu_as_tanh(dt)) return out;
    ep.act = Act::kGelu;
    if (gin != out) fused.push_back(reshape);
    fused.push_back(g);
    return g->outputs[0];
  }
  return out;
}

}  // namespace

const Value* fuse_product_tail(Lowering& L, const Value* out, k::DT dt, Epilogue& ep, std::vector<const Node*>& fused) {
  return fuse_activation(L, fuse_residual(L, out, dt, ep, fused), dt, ep, fused);
}

namespace {

// MatMul -> Add(per-column constant) [-> Add(residual)] [-> Relu | Gelu]: returns the value the fused chain
// produces and fills ep. Fusion needs the intermediate values to have no other reader.
const Value* fuse_epilogue(Lowering& L, const Node& mm, int64_t n_cols, k::DT dt, Epilogue& ep,
                           std::vector<const Node*>& fused, bool allow_residual = true) {
  const Value* out = mm.outputs[0];
  if (const Node* add = next_op(L, out, OpKind::kAdd)) {
    const Value* other = add->inputs[0] == out ? add->inputs[1] : add->inputs[0];
    const Tensor* b = L.constant(other);
    if (b && b->numel() == n_cols && b->rank() >= 1 && b->dim(b->rank() - 1) == n_cols &&
        add->outputs[0]->type.shape && add->outputs[0]->type.shape->rank() == out->type.shape->rank()) {
      auto r = L.value(other);
      if (r && (*r)->dt == dt) {
        ep.bias = *r;
        fused.push_back(add);
        out = add->outputs[0];
      }
    }
  }
  return allow_residual ? fuse_product_tail(L, out, dt, ep, fused) : fuse_activation(L, out, dt, ep, fused);
}

// Defines the chain's final value and emits the matmul; the fused nodes are marked only once
// the matmul is certain (a kUnsupported leaves them to be lowered on their own).
Status define_and_emit(Lowering& L, const Node& n, const DevValue* a, const DevValue* b, const GemmShape& s,
                       const Epilogue& ep, const Value* out, const std::vector<const Node*>& fused, k::DT dt) {
  const DevValue& y = L.define(out);
  Status st = emit_gemm(L, n, a, b, s, ep, y.ref, dt);
  if (!st) {
    L.values.erase(out);
    return st;
  }
  for (const Node* f : fused) L.mark_fused(f, &n);
  return Status::ok();
}

// A constant [K, N] weight whose rows are not 16-byte aligned (GPT-2's 50257-wide LM head) keeps
// cuBLASLt off its fast Hopper kernels, several times slower than the padded product
// (bench/RESULTS.md, "(later) — fused attention, residual/GELU epilogues, Clip into depthwise
// (issues 3, 4)"): it is held zero-padded to [K, Npad], the product goes to an aligned [M, Npad]
// scratch buffer, and one cast_rows pass compacts it. Returns null when the weight is fine as it is
// (or is not a [K, N] matrix for this K).
Expected<const DevValue*> padded_weight(Lowering& L, const Value* v, k::DT dt, int64_t k_dim) {
  const Tensor* w = L.constant(v);
  int64_t per16 = 16 / k::dt_size(dt);
  if (!w || L.device_dt(w->dtype()) != dt || w->rank() != 2 || w->dim(0) != k_dim || w->dim(1) % per16 == 0 ||
      w->dim(0) % per16 != 0) {
    return nullptr;
  }
  int64_t K = w->dim(0), N = w->dim(1), Np = (N + per16 - 1) / per16 * per16;
  KILN_ASSIGN_OR_RETURN(Ref ref, L.upload_derived(*w, fmt::format("columns padded to {}", Np), dt, [w, K, N, Np]() -> Expected<Tensor> {
    KILN_ASSIGN_OR_RETURN(Tensor f, convert_tensor(*w, DType::kFloat32));
    KILN_ASSIGN_OR_RETURN(Tensor p, Tensor::create(DType::kFloat32, {K, Np}));
    std::fill(p.data<float>(), p.data<float>() + K * Np, 0.0f);
    for (int64_t r = 0; r < K; ++r) std::copy(f.data<float>() + r * N, f.data<float>() + (r + 1) * N, p.data<float>() + r * Np);
    return p;
  }));
  auto* pw = new DevValue{ref, dt, w->dtype(), {K, Np}, Layout::kRowMajor};
  L.keep_alive.emplace_back(pw, [](void* q) { delete static_cast<DevValue*>(q); });
  return pw;
}

// MatMul with a padded weight: bias padded too, product into scratch, compacted into the output.
Status emit_padded_matmul(Lowering& L, const Node& n, const DevValue* a, const DevValue* pw, int64_t rows, int64_t cols,
                          k::DT dt) {
  GemmShape s;
  s.m = rows;
  s.k = pw->dims[0];
  s.n = pw->dims[1];
  Epilogue ep;
  std::vector<const Node*> fused;
  const Value* out = fuse_epilogue(L, n, cols, dt, ep, fused, /*allow_residual=*/false);  // C would need ld Npad
  size_t eb = size_t(k::dt_size(dt));
  if (ep.bias) {  // its host bytes (device dtype) extended with zeros
    const std::string_view host = L.weight_host(ep.bias->ref.id);
    std::vector<char> padded(size_t(s.n) * eb, 0);
    std::copy(host.begin(), host.end(), padded.begin());
    KILN_ASSIGN_OR_RETURN(Ref r, L.upload_raw(padded.data(), padded.size()));
    auto* pb = new DevValue{r, dt, ep.bias->ir_dtype, {s.n}, Layout::kRowMajor};
    L.keep_alive.emplace_back(pb, [](void* q) { delete static_cast<DevValue*>(q); });
    ep.bias = pb;
  }
  Ref tmp{false, L.scratch(size_t(s.m * s.n) * eb)};
  KILN_RETURN_IF_ERROR(emit_gemm(L, n, a, pw, s, ep, tmp, dt));
  // A graph output nobody else reads is compacted straight into its declared dtype (GPT-2's fp32
  // logits): one pass instead of a compacting copy plus the output cast.
  std::optional<k::DT> ydt;
  if (L.is_graph_output(out) && L.consumers(out) == 0) ydt = to_kdt(out->type.dtype);
  const DevValue& y = L.define(out, Layout::kRowMajor, ydt);
  const k::DT to = y.dt;
  ByteWriter w;
  w.put(int32_t(dt));
  w.put(int32_t(to));
  put(w, tmp);
  put(w, y.ref);
  for (int64_t v : {s.n, cols, rows, cols}) w.i64(v);
  L.emit(&n, fmt::format("kernel cast_rows (compact {} -> {} columns{})", s.n, cols, to != dt ? ", to the output dtype" : ""),
         {tmp.id}, {y.ref.id}, StepOp::kCastRows, std::move(w));
  for (const Node* f : fused) L.mark_fused(f, &n);
  return Status::ok();
}

}  // namespace

Expected<GemmShape> matmul_gemm_shape(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  const size_t ra = a.size(), rb = b.size();
  if (ra < 2 || rb < 2) KILN_UNSUPPORTED("MatMul with a rank-1 operand");
  GemmShape s;
  s.m = a[ra - 2];
  s.k = a[ra - 1];
  s.n = b[rb - 1];
  if (b[rb - 2] != s.k || s.m < 1 || s.k < 1 || s.n < 1) KILN_UNSUPPORTED("MatMul of {} by {}", dims_to_string(a), dims_to_string(b));
  const int64_t batch_a = prod_of(a, 0, ra - 2), batch_b = prod_of(b, 0, rb - 2);
  if (batch_b == 1) {
    s.m *= batch_a;  // [..., M, K] x [K, N]: one GEMM over all rows
  } else if (batch_a == 1) {
    s.batch = batch_b;
    s.stride_b = s.k * s.n;
    s.stride_d = s.m * s.n;
  } else {
    const std::vector<int64_t> ba(a.begin(), a.end() - 2), bb(b.begin(), b.end() - 2);
    if (ba != bb) KILN_UNSUPPORTED("MatMul with broadcast batch dims {} x {}", dims_to_string(a), dims_to_string(b));
    s.batch = batch_a;
    s.stride_a = s.m * s.k;
    s.stride_b = s.k * s.n;
    s.stride_d = s.m * s.n;
  }
  return s;
}

namespace {

Status lower_matmul(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* a, L.rowmajor(n.inputs[0]));
  k::DT dt = a->dt;
  if (dt != k::DT::kF32 && dt != k::DT::kF16 && dt != k::DT::kBF16 && dt != k::DT::kF64) {
    KILN_UNSUPPORTED("MatMul on {}", dtype_name(a->ir_dtype));
  }
  if (a->dims.size() >= 2 && dt != k::DT::kF64) {
    KILN_ASSIGN_OR_RETURN(const DevValue* pw, padded_weight(L, n.inputs[1], dt, a->dims.back()));
    if (pw) {
      return emit_padded_matmul(L, n, a, pw, a->numel() / a->dims.back(), L.constant(n.inputs[1])->dim(1), dt);
    }
  }
  KILN_ASSIGN_OR_RETURN(const DevValue* b, L.rowmajor(n.inputs[1]));
  if (b->dt != dt) KILN_UNSUPPORTED("MatMul on {} x {}", dtype_name(a->ir_dtype), dtype_name(b->ir_dtype));
  KILN_ASSIGN_OR_RETURN(const GemmShape s, matmul_gemm_shape(a->dims, b->dims));
  Epilogue ep;
  std::vector<const Node*> fused;
  // f64 products take no epilogue (cuBLASLt's bias and activation epilogues are not promised for
  // 64-bit compute): a following Add or activation runs as its own kernel.
  const Value* out = dt == k::DT::kF64 ? n.outputs[0] : fuse_epilogue(L, n, s.n, dt, ep, fused);
  return define_and_emit(L, n, a, b, s, ep, out, fused, dt);
}

// Gemm's C broadcast to [m, n] (ONNX's unidirectional broadcasting: a scalar, a row, a column)
// into a buffer of the node, for cuBLASLt's C slot.
Expected<const DevValue*> broadcast_c(Lowering& L, const Node& n, const DevValue* c, int64_t m, int64_t nc) {
  if (c->dims.size() > 2) KILN_UNSUPPORTED("Gemm with C of rank {}", c->dims.size());
  std::vector<int64_t> cdims = c->dims, cs = c->strides();
  while (cdims.size() < 2) {
    cdims.insert(cdims.begin(), 1);
    cs.insert(cs.begin(), 0);
  }
  const std::vector<int64_t> out = {m, nc};
  for (size_t i = 0; i < 2; ++i) {
    if (cdims[i] == 1) cs[i] = 0;
    else if (cdims[i] != out[i]) KILN_UNSUPPORTED("Gemm with C of shape {} for a [{},{}] result", dims_to_string(c->dims), m, nc);
  }
  auto* full = new DevValue(*c);
  L.keep_alive.emplace_back(full, [](void* q) { delete static_cast<DevValue*>(q); });
  full->dims = out;
  full->ref = Ref{false, L.scratch(full->bytes())};
  emit_copy_nd(L, &n, "kernel copy_nd (Gemm's C broadcast)", k::dt_size(c->dt), c->ref, 0, nd(out, cs), full->ref, 0,
               nd(out, full->strides()));
  return static_cast<const DevValue*>(full);
}

Status lower_gemm(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* a, L.rowmajor(n.inputs[0]));
  KILN_ASSIGN_OR_RETURN(const DevValue* b, L.rowmajor(n.inputs[1]));
  k::DT dt = a->dt;
  if ((dt != k::DT::kF32 && dt != k::DT::kF16 && dt != k::DT::kBF16) || b->dt != dt) {
    KILN_UNSUPPORTED("Gemm on {} x {}", dtype_name(a->ir_dtype), dtype_name(b->ir_dtype));
  }
  GemmShape s;
  s.trans_a = n.attr_int("transA", 0) != 0;
  s.trans_b = n.attr_int("transB", 0) != 0;
  s.m = s.trans_a ? a->dims[1] : a->dims[0];
  s.k = s.trans_a ? a->dims[0] : a->dims[1];
  s.n = s.trans_b ? b->dims[0] : b->dims[1];
  Epilogue ep;
  ep.alpha = n.attr_float("alpha", 1.0f);
  ep.beta = n.attr_float("beta", 1.0f);
  if (n.has_input(2) && ep.beta != 0) {
    const Value* cv = n.inputs[2];
    const Tensor* c = L.constant(cv);
    if (c && c->numel() == s.n && (c->rank() == 1 || (c->rank() == 2 && c->dim(0) == 1))) {
      // A per-column C is the bias epilogue (beta folded in on the host).
      Tensor scaled = c->reshaped({s.n}).clone();
      if (ep.beta != 1.0f) {
        KILN_ASSIGN_OR_RETURN(scaled, convert_tensor(scaled, DType::kFloat64));
        for (int64_t i = 0; i < s.n; ++i) scaled.data<double>()[i] *= ep.beta;
      }
      KILN_ASSIGN_OR_RETURN(Ref r, L.upload(scaled, dt));
      auto* bias = new DevValue{r, dt, cv->type.dtype, {s.n}, Layout::kRowMajor};
      L.keep_alive.emplace_back(bias, [](void* p) { delete static_cast<DevValue*>(p); });
      ep.bias = bias;
    } else {
      KILN_ASSIGN_OR_RETURN(const DevValue* cd, L.rowmajor(cv));
      if (cd->dt != dt) KILN_UNSUPPORTED("Gemm with C of another dtype");
      if (cd->numel() != s.m * s.n || cd->dims.size() != 2) {
        KILN_ASSIGN_OR_RETURN(cd, broadcast_c(L, n, cd, s.m, s.n));
      }
      ep.c = cd;
    }
  }
  std::vector<const Node*> fused;
  const Value* out = n.outputs[0];
  if (!ep.c) {  // a full-size C of the Gemm itself takes cuBLASLt's C slot
    out = fuse_residual(L, out, dt, ep, fused);
    out = fuse_activation(L, out, dt, ep, fused);
  }
  return define_and_emit(L, n, a, b, s, ep, out, fused, dt);
}

}  // namespace

void register_gemm_lowerings(std::map<OpKind, LowerFn>& t) {
  t[OpKind::kMatMul] = lower_matmul;
  t[OpKind::kGemm] = lower_gemm;
}

namespace {

Expected<StepFn> bind_cast_rows(Params& in, BindCtx&) {
  const k::DT from = in.dt(), to = in.dt();
  const Ref xr = in.ref(), yr = in.ref();
  const int64_t ldx = in.i64(), ldy = in.i64(), rows = in.i64(), cols = in.i64();
  KILN_RETURN_IF_ERROR(in.done());
  return StepFn([=](const RunCtx& c) {
    return cuda_status(k::cast_rows(from, to, c.ptr(xr), ldx, c.ptr(yr), ldy, rows, cols, c.stream), "cast_rows");
  });
}

}  // namespace

void register_gemm_binders(std::map<StepOp, BindFn>& t) {
  t[StepOp::kLtMatmul] = bind_lt_matmul;
  t[StepOp::kCastRows] = bind_cast_rows;
  register_gemm_sm90_binder(t);
}

}  // namespace kiln::cuda
