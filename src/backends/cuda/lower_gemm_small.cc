// Few-row products with a constant weight (batch-1 transformer layers: M = 128 tokens) on kiln's
// split-K cluster kernel (kernels/gemm_small.cu) instead of cuBLASLt, when timing says so.
//
// At M = 128 a layer's GEMMs read ~14 MB of weights and almost nothing else, yet cuBLASLt's tiles
// give 12-36 CTAs for N = 768-2304, so the weights stream through a fraction of the SMs (BERT-base
// b1 on the H100: ~0.7 TB/s). The small-M kernel puts one CTA on every SM by splitting K across
// a thread-block cluster, holds each CTA's whole slice in shared memory, and requests its weight
// slice before waiting for the previous kernel (programmatic dependent launch). Which is faster
// depends on the shape, so every configuration that fits (32-, 64- or 128-column slices, 1-8 K
// slices) is timed at build against cuBLASLt's best by pick_lt_algo's method (tuning.h: in a
// captured graph, weights cold in L2), and the kernel is used only where it wins. The weight is
// transposed once on the host (Wt[N,K]) and uploaded beside the original.
//
// Status (2026-11-24, H100, graph-timed as above): it loses on every BERT-base b1 shape, so
// BuildOptions::gemm_small is off by default and the op harness forces it to keep it correct. Best
// configurations 8.7 / 7.2 / 9.6 / 9.6 us (QKV / attention out / FFN up / FFN down) against cuBLASLt's
// 4.6 / 4.5 / 5.6 / 7.6 us (BERT-base b1; GPT-2's attention out 6.9 us). Variants that skip stages place the time (128x2304x768 in 128-column
// slices x 4): launching the empty cluster grid 1.7 us, the partial-tile write and cluster barrier
// 1.3 us, the DSMEM reduction with the epilogue 2.7 us, the loads ~1 us, mma.sync ~1.3 us. Launch,
// barrier and reduction alone cost what cuBLASLt's whole product does: split-K across a cluster
// cannot win at these sizes, and mma.sync runs at half wgmma's rate. What could: wgmma + TMA
// without a cross-CTA reduction, which needs about one CTA per 128x(N/132) output slice.
//
// Knobs for experiments on a GPU machine: KILN_GEMM_SMALL=1 forces the kernel wherever it applies,
// -1 keeps it off; KILN_GEMM_SMALL_CONFIG=BNxS times only that configuration (the op harness uses
// it to cover each slice width); KILN_GEMM_SMALL_PDL=0 launches without programmatic serialization.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "backends/cuda/lower.h"
#include "backends/cuda/tuning.h"

namespace kiln::cuda {

namespace {

int act_code(const std::string& act) { return act.empty() ? 0 : act == "relu" ? 1 : act == "gelu" ? 2 : -1; }

bool pdl_enabled() {
  const char* e = std::getenv("KILN_GEMM_SMALL_PDL");
  return !(e && *e && std::atoi(e) == 0);
}

// KILN_GEMM_SMALL_CONFIG=BNxS: only that configuration is a candidate.
bool config_allowed(int bn, int split) {
  const char* e = std::getenv("KILN_GEMM_SMALL_CONFIG");
  if (!e || !*e) return true;
  int want_bn = 0, want_split = 0;
  return std::sscanf(e, "%dx%d", &want_bn, &want_split) == 2 && want_bn == bn && want_split == split;
}

// The weight as Wt[N,K] in the device dtype: a Gemm with transB already holds it so; a [K,N]
// constant is transposed on the host once per weight.
Expected<Ref> weight_nk(Lowering& L, const DevValue* b, const GemmShape& s) {
  if (s.trans_b) return b->ref;
  return transposed_weight(L, b, s.k, s.n, L.transposed_weights);
}

// The fastest configuration, timed as pick_lt_algo times cuBLASLt's candidates (tuning.h): ms per
// launch inside a captured graph, the weight cold in L2, the activations too when they are large.
Expected<GemmSmallChoice> time_small(const GemmShape& s, const Epilogue& ep, k::DT dt, int act, bool any_grid) {
  GemmSmallChoice best;
  ProductScratch t(s, ep.c != nullptr);
  for (int bn : {128, 64, 32}) {
    if (!t.ok() || k::gemm_small_prepare(dt, bn) != cudaSuccess) break;
    for (int split = 1; split <= 8; ++split) {
      if (!k::gemm_small_supported(dt, s.m, s.n, s.k, bn, split) || !config_allowed(bn, split)) continue;
      const int64_t ctas = s.n / bn * split * ((s.m + 127) / 128);
      if (!any_grid && (ctas < 16 || ctas > 264)) continue;  // far from one CTA per SM: not worth timing
      k::GemmSmallArgs g;
      g.bias = ep.bias ? t.bias.p : nullptr;
      g.d = t.d.p;
      g.m = s.m;
      g.n = s.n;
      g.k = s.k;
      g.bn = bn;
      g.split = split;
      g.act = act;
      g.alpha = ep.alpha;
      g.beta = ep.c ? ep.beta : 0.0f;
      // Without programmatic serialization: back to back, each launch would stream its weight during
      // the one before, an overlap cuBLASLt's timing does not get and a model's other kernels mostly
      // do not give. (The 2026-11-24 numbers above were taken with it: the kernel lost even so.)
      g.pdl = false;
      auto launch = [&](int i, cudaStream_t stream) {
        k::GemmSmallArgs gi = g;
        gi.a = t.op.a.copy(i);
        gi.wt = t.op.w.copy(i);
        gi.c = ep.c ? t.op.c.copy(i) : nullptr;
        return k::gemm_small(dt, gi, stream) == cudaSuccess;
      };
      const float ms = time_in_graph(t.op.launches, launch);  // -1: a configuration that cannot run
      if (ms > 0 && (best.ms < 0 || ms < best.ms)) best = {bn, split, ms};
    }
  }
  KILN_RETURN_IF_ERROR(finish_timing(fmt::format("the small-M kernel for m={} n={} k={}", s.m, s.n, s.k)));
  return best;
}

}  // namespace

Expected<bool> try_emit_gemm_small(Lowering& L, const Node& n, const DevValue* a, const DevValue* b, const GemmShape& s,
                                   const Epilogue& ep, Ref y, k::DT dt, float lt_ms, std::string* lost) {
  const int act = act_code(ep.act);
  int mode = L.options().gemm_small;
  // A knob for experiments on a GPU machine: KILN_GEMM_SMALL=1 forces the kernel, -1 keeps it off.
  if (const char* e = std::getenv("KILN_GEMM_SMALL"); e && *e) mode = std::atoi(e) > 0 ? 1 : std::atoi(e) < 0 ? -1 : 0;
  if (mode < 0 || (mode == 0 && (!L.options().autotune || lt_ms <= 0)) || act < 0 || (dt != k::DT::kF16 && dt != k::DT::kBF16) || s.batch != 1 ||
      s.trans_a || !b->ref.weight || b->dt != dt || a->dt != dt || s.m > 512 || s.k % 64 != 0 || s.n % 32 != 0 ||
      (ep.bias && ep.bias->dt != dt) || (ep.c && (ep.c->dt != dt || ep.c->numel() != s.m * s.n))) {
    return false;
  }
  const std::string key = fmt::format("{} {} {} {} {} {} {}", s.m, s.n, s.k, int(dt), act, ep.bias != nullptr, ep.c != nullptr);
  auto it = L.gemm_small_choices.find(key);
  if (it == L.gemm_small_choices.end()) {
    KILN_ASSIGN_OR_RETURN(GemmSmallChoice timed, time_small(s, ep, dt, act, mode == 1));
    it = L.gemm_small_choices.emplace(key, timed).first;
  }
  const int bn = it->second.bn, split = it->second.split;
  const float ms = it->second.ms;
  if (ms < 0 || (mode == 0 && ms >= lt_ms)) {  // cuBLASLt is as fast: keep the library
    if (ms > 0) *lost = fmt::format("; small-M kernel {:.1f} us ({} columns, split-k {})", 1000.0f * ms, bn, split);
    return false;
  }
  KILN_CUDA_TRY(k::gemm_small_prepare(dt, bn));
  KILN_ASSIGN_OR_RETURN(Ref wt, weight_nk(L, b, s));
  Ref ar = a->ref, bias = ep.bias ? ep.bias->ref : Ref{}, cr = ep.c ? ep.c->ref : Ref{};
  const bool has_bias = ep.bias != nullptr, has_c = ep.c != nullptr;
  std::vector<int> reads = {a->ref.weight ? -1 : a->ref.id};
  if (has_c && !cr.weight) reads.push_back(cr.id);
  if (has_bias && !bias.weight) reads.push_back(bias.id);
  const int64_t m = s.m, nn = s.n, kk = s.k;
  const float alpha = ep.alpha, beta = has_c ? ep.beta : 0.0f;
  const bool pdl = pdl_enabled();
  std::string impl = fmt::format("kernel gemm_small {} m={} n={} k={}{}{}{} (slices of {} columns, split-k {} in a cluster; "
                                 "{:.1f} us{})",
                                 dt == k::DT::kF16 ? "fp16" : "bf16", s.m, s.n, s.k, has_bias ? " +bias" : "",
                                 has_c ? (ep.beta == 1.0f && ep.alpha == 1.0f ? " +residual" : " +C") : "",
                                 ep.act.empty() ? "" : " +" + ep.act, bn, split, 1000.0f * ms,
                                 lt_ms > 0 ? fmt::format(" vs cuBLASLt {:.1f} us", 1000.0f * lt_ms) : "");
  L.emit(&n, impl, reads, {y.id}, [=](const RunCtx& c) -> Status {
    k::GemmSmallArgs g;
    g.a = c.ptr(ar);
    g.wt = c.ptr(wt);
    g.bias = has_bias ? c.ptr(bias) : nullptr;
    g.c = has_c ? c.ptr(cr) : nullptr;
    g.d = c.ptr(y);
    g.m = m;
    g.n = nn;
    g.k = kk;
    g.bn = bn;
    g.split = split;
    g.act = act;
    g.alpha = alpha;
    g.beta = beta;
    g.pdl = pdl;
    return cuda_status(k::gemm_small(dt, g, c.stream), "gemm_small");
  });
  return true;
}

}  // namespace kiln::cuda
