// Experiment: BERT-base b1 encoder chain (12 layers: QKV, O+res, LN, FFN1+gelu, FFN2+res, LN) in one
// CUDA graph, GEMMs through cuBLASLt vs CUTLASS sm90 (with and without programmatic dependent launch).
#include <cublasLt.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include "cfg.h"
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %d: %s\n", #x, __LINE__, cudaGetErrorString(e_)); exit(1);} } while (0)
#define LK(x) do { cublasStatus_t e_ = (x); if (e_ != CUBLAS_STATUS_SUCCESS) { printf("cublasLt %d at %d\n", int(e_), __LINE__); exit(1);} } while (0)
constexpr int M = 128, H = 768, F = 3072, L = 12;

__global__ void init(__half* p, size_t n, float scale, unsigned seed) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < n) { unsigned x = unsigned(i) * 2654435761u ^ seed; x ^= x >> 13; x *= 0x5bd1e995; x ^= x >> 15;
    p[i] = __float2half(((x & 0xffff) / 65535.f - 0.5f) * 2.f * scale); }
}
__global__ void layer_norm(const __half* x, __half* y, int n) {   // one row per block, 96 threads x 8
  asm volatile("griddepcontrol.wait;" ::: "memory");
  int r = blockIdx.x, t = threadIdx.x;
  uint4 v = reinterpret_cast<const uint4*>(x + size_t(r) * n)[t];
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const __half* h = reinterpret_cast<const __half*>(&v);
  float f[8], s = 0, q = 0;
  for (int i = 0; i < 8; ++i) { f[i] = __half2float(h[i]); s += f[i]; q += f[i] * f[i]; }
  __shared__ float ss[2][4];
  for (int o = 16; o; o >>= 1) { s += __shfl_xor_sync(~0u, s, o); q += __shfl_xor_sync(~0u, q, o); }
  if ((t & 31) == 0) { ss[0][t >> 5] = s; ss[1][t >> 5] = q; }
  __syncthreads();
  s = ss[0][0] + ss[0][1] + ss[0][2]; q = ss[1][0] + ss[1][1] + ss[1][2];
  float mu = s / n, rs = rsqrtf(q / n - mu * mu + 1e-12f);
  __half o8[8];
  for (int i = 0; i < 8; ++i) o8[i] = __float2half((f[i] - mu) * rs);
  reinterpret_cast<uint4*>(y + size_t(r) * n)[t] = *reinterpret_cast<uint4*>(o8);
}
cudaError_t launch_ln(cudaStream_t s, const __half* x, __half* y, bool pdl) {
  cudaLaunchConfig_t c{}; c.gridDim = M; c.blockDim = H / 8; c.stream = s;
  cudaLaunchAttribute a[1]; a[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a[0].val.programmaticStreamSerializationAllowed = 1; c.attrs = a; c.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&c, layer_norm, x, y, H);
}

cublasLtHandle_t lt; void* lt_ws; constexpr size_t kWs = 32 << 20;
struct LtGemm { cublasLtMatmulDesc_t d; cublasLtMatrixLayout_t la, lb, lc; std::vector<cublasLtMatmulAlgo_t> algos; Prob p; };
LtGemm lt_make(const Prob& p) {
  LtGemm g; g.p = p;
  LK(cublasLtMatmulDescCreate(&g.d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasLtEpilogue_t ep = p.ep == 1 ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
  LK(cublasLtMatmulDescSetAttribute(g.d, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
  LK(cublasLtMatmulDescSetAttribute(g.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias)));
  LK(cublasLtMatrixLayoutCreate(&g.la, CUDA_R_16F, p.n, p.k, p.n));     // weight: col-major N x K
  LK(cublasLtMatrixLayoutCreate(&g.lb, CUDA_R_16F, p.k, p.m, p.lda));   // activation: col-major K x M
  LK(cublasLtMatrixLayoutCreate(&g.lc, CUDA_R_16F, p.n, p.m, p.n));
  cublasLtMatmulPreference_t pref; LK(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = kWs; LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  cublasLtMatmulHeuristicResult_t h[16]; int found = 0;
  LK(cublasLtMatmulAlgoGetHeuristic(lt, g.d, g.la, g.lb, g.lc, g.lc, pref, 16, h, &found));
  for (int i = 0; i < found; ++i) g.algos.push_back(h[i].algo);
  return g;
}
Launch lt_launch(const LtGemm& g, int algo) {
  return [g, algo](cudaStream_t s, bool) {
    float one = 1, beta = g.p.C ? 1.f : 0.f;
    auto st = cublasLtMatmul(lt, g.d, &one, g.p.B, g.la, g.p.A, g.lb, &beta, g.p.C ? g.p.C : g.p.D, g.lc, g.p.D, g.lc,
                             &g.algos[algo], lt_ws, kWs, s);
    return st == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorUnknown;
  };
}

// Time a list of launches captured into one graph; returns median and p99 us per replay.
std::pair<double, double> time_graph(cudaStream_t s, const std::function<void(cudaStream_t)>& body, int reps = 200) {
  cudaGraph_t g; cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal)); body(s); CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  for (int i = 0; i < 30; ++i) CK(cudaGraphLaunch(ge, s));
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) { CK(cudaEventRecord(a, s)); CK(cudaGraphLaunch(ge, s)); CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b)); float ms; CK(cudaEventElapsedTime(&ms, a, b)); t.push_back(ms * 1000); }
  std::sort(t.begin(), t.end());
  CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g));
  return {t[t.size() / 2], t[t.size() * 99 / 100]};
}

__half* alloc(size_t n, float scale, unsigned seed) {
  __half* p; CK(cudaMalloc(&p, n * 2)); init<<<unsigned((n + 255) / 256), 256>>>(p, n, scale, seed); return p;
}

int main(int argc, char** argv) {
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  LK(cublasLtCreate(&lt)); CK(cudaMalloc(&lt_ws, kWs));
  std::vector<Runner> runners; add_runners_0(runners); add_runners_1(runners); add_runners_2(runners);
  struct W { __half *qkv, *bq, *o, *bo, *f1, *b1, *f2, *b2; };
  std::vector<W> w(L);
  for (int l = 0; l < L; ++l) {
    unsigned sd = 100 * l;
    w[l] = {alloc(size_t(H) * 3 * H, 1 / sqrtf(H), sd + 1), alloc(3 * H, 0.1f, sd + 2), alloc(size_t(H) * H, 1 / sqrtf(H), sd + 3),
            alloc(H, 0.1f, sd + 4), alloc(size_t(H) * F, 1 / sqrtf(H), sd + 5), alloc(F, 0.1f, sd + 6),
            alloc(size_t(F) * H, 1 / sqrtf(F), sd + 7), alloc(H, 0.1f, sd + 8)};
  }
  // Activations: x[l] is layer l's input (x[L] the output); per-layer buffers so the chain is real.
  std::vector<__half*> x(L + 1), y1(L), y2(L), z(L), y3(L), y4(L);
  x[0] = alloc(size_t(M) * H, 1.f, 7);
  for (int l = 0; l < L; ++l) { x[l + 1] = alloc(size_t(M) * H, 0, 0); y1[l] = alloc(size_t(M) * 3 * H, 0, 0);
    y2[l] = alloc(size_t(M) * H, 0, 0); z[l] = alloc(size_t(M) * H, 0, 0); y3[l] = alloc(size_t(M) * F, 0, 0); y4[l] = alloc(size_t(M) * H, 0, 0); }
  CK(cudaDeviceSynchronize());
  // The four products of layer l.
  auto prob = [&](int l, int which) -> Prob {
    switch (which) {
      case 0: return {M, 3 * H, H, x[l], H, w[l].qkv, w[l].bq, nullptr, y1[l], 0};
      case 1: return {M, H, H, y1[l], 3 * H, w[l].o, w[l].bo, x[l], y2[l], 2};
      case 2: return {M, F, H, z[l], H, w[l].f1, w[l].b1, nullptr, y3[l], 1};
      default: return {M, H, F, y3[l], F, w[l].f2, w[l].b2, z[l], y4[l], 2};
    }
  };
  const char* names[4] = {"qkv 128x2304x768 +bias", "out 128x768x768 +bias+res", "ffn1 128x3072x768 +bias+gelu", "ffn2 128x768x3072 +bias+res"};
  // Per shape: every candidate timed as 12 launches (one per layer's weight) in one graph.
  std::vector<Launch> best_lt[4], best_cu[4], best_cu_pdl[4];
  for (int which = 0; which < 4; ++which) {
    printf("== %s (us per launch, graph of %d)\n", names[which], L);
    std::vector<LtGemm> g; for (int l = 0; l < L; ++l) g.push_back(lt_make(prob(l, which)));
    double bt = 1e9;
    for (size_t a = 0; a < g[0].algos.size(); ++a) {
      std::vector<Launch> ls; for (int l = 0; l < L; ++l) ls.push_back(lt_launch(g[l], int(a)));
      bool ok = true; for (auto& f : ls) if (f(s, false) != cudaSuccess) ok = false;
      if (!ok || cudaStreamSynchronize(s) != cudaSuccess) { cudaGetLastError(); continue; }
      auto t = time_graph(s, [&](cudaStream_t st) { for (auto& f : ls) f(st, false); }, 50);
      printf("  lt algo %zu: %.2f\n", a, t.first / L);
      if (t.first < bt) { bt = t.first; best_lt[which] = ls; }
    }
    double bc = 1e9, bp = 1e9; std::string nc, np;
    for (auto& r : runners) {
      if (r.ep != prob(0, which).ep) continue;
      std::vector<Launch> ls; for (int l = 0; l < L; ++l) ls.push_back(r.make(prob(l, which)));
      if (!ls[0]) { printf("  %s: cannot implement\n", r.name.c_str()); continue; }
      for (bool pdl : {false, true}) {
        auto t = time_graph(s, [&](cudaStream_t st) { for (auto& f : ls) CK(f(st, pdl)); }, 50);
        printf("  %s pdl=%d: %.2f\n", r.name.c_str(), int(pdl), t.first / L);
        if (!pdl && t.first < bc) { bc = t.first; best_cu[which] = ls; nc = r.name; }
        if (pdl && t.first < bp) { bp = t.first; best_cu_pdl[which] = ls; np = r.name; }
      }
    }
    printf("  best: lt %.2f, cutlass %s %.2f, cutlass+pdl %s %.2f\n", bt / L, nc.c_str(), bc / L, np.c_str(), bp / L);
  }
  auto chain = [&](std::vector<Launch>* G, bool pdl_gemm, bool pdl_ln) {
    return [=, &x, &y2, &z, &y4](cudaStream_t st) {
      for (int l = 0; l < L; ++l) {
        CK(G[0][l](st, pdl_gemm)); CK(G[1][l](st, pdl_gemm)); CK(launch_ln(st, y2[l], z[l], pdl_ln));
        CK(G[2][l](st, pdl_gemm)); CK(G[3][l](st, pdl_gemm)); CK(launch_ln(st, y4[l], x[l + 1], pdl_ln));
      }
    };
  };
  std::vector<__half> ref(size_t(M) * H), out(size_t(M) * H);
  auto check = [&](const char* what) {
    CK(cudaMemcpy(out.data(), x[L], out.size() * 2, cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    for (size_t i = 0; i < out.size(); ++i) { double d = __half2float(out[i]) - __half2float(ref[i]); num += d * d; den += double(__half2float(ref[i])) * __half2float(ref[i]); }
    printf("  %s rel-L2 vs cuBLASLt chain: %.2e\n", what, std::sqrt(num / den));
  };
  for (int round = 0; round < 3; ++round) {
    auto a = time_graph(s, chain(best_lt, false, false));
    CK(cudaMemcpy(ref.data(), x[L], ref.size() * 2, cudaMemcpyDeviceToHost));
    auto d = time_graph(s, chain(best_lt, false, true));
    auto b = time_graph(s, chain(best_cu, false, false)); check("cutlass");
    auto c = time_graph(s, chain(best_cu_pdl, true, true)); check("cutlass+pdl");
    printf("round %d chain (72 kernels) median/p99 us: cuBLASLt %.1f/%.1f | cuBLASLt+LN pdl %.1f/%.1f | cutlass %.1f/%.1f | cutlass+pdl %.1f/%.1f\n",
           round, a.first, a.second, d.first, d.second, b.first, b.second, c.first, c.second);
  }
  return 0;
}
