// Few-row products with a constant weight on kiln's Hopper GEMM (kernels_cutlass/gemm_sm90.cu:
// CUTLASS 3 TMA + wgmma kernels with programmatic dependent launch) instead of cuBLASLt, when the
// build-time timing says so.
//
// The kernel's edge over cuBLASLt is not its product but its launch: cuBLASLt's kernels cannot be
// launched with programmatic serialization, so every one of them starts only after the previous
// kernel has drained, and at batch 1 (BERT-base: M = 128) each product is short enough that this
// gap is a large share of it (bench/RESULTS.md, "The experiment that decided it (bench/pdl_chain,
// outside the build)"). gemm_sm90 becomes resident during the previous kernel, waits only
// before its first load, and lets the next kernel (LayerNorm, attention, or another GEMM, launched
// with programmatic serialization when they follow it: Step::triggers_dependents) do the same.
// The candidates (CTA tiles 64x32 and 64x64) are timed by pick_lt_algo's method (tuning.h: back to
// back in a captured graph, weights cold in L2), with programmatic serialization on when the step
// before triggers its dependents (then the launches overlap as they will in the forward) and off
// otherwise (cuBLASLt's terms); they replace cuBLASLt only where faster. BuildOptions::gemm_sm90
// forces the kernel wherever it applies (1: the op harness) or keeps it off (-1), and
// BuildOptions::gemm_sm90_tile restricts the candidates to one tile width.
#include <cstdio>
#include <optional>

#include "backends/cuda/lower.h"
#include "backends/cuda/timing_cache.h"
#include "backends/cuda/tuning.h"

namespace kiln::cuda {

namespace {

// 0 none, 2 gelu (the kernel's two epilogue activations); -1 for anything else.
// The kernel's activation code (kernels.h GemmSm90Args::act); -1: it has none for a.
int act_code(Act a) { return a == Act::kNone ? 0 : a == Act::kGelu ? 2 : -1; }

// The weight as B[K,N] row-major in the device dtype: a MatMul's [K,N] constant as it is, a Gemm
// with transB's [N,K] transposed on the host once per weight.
Expected<Ref> weight_kn(Lowering& L, const DevValue* b, const GemmShape& s) {
  if (!s.trans_b) return b->ref;
  return transposed_weight(L, b, s.n, s.k, L.weights_kn);
}

// The fastest tile, timed as pick_lt_algo times cuBLASLt's candidates; bn = 0 when none ran.
Expected<GemmSm90Choice> time_sm90(const GemmShape& s, const Epilogue& ep, k::DT dt, int act, int only_bn, bool overlap) {
  GemmSm90Choice best;
  ProductScratch t(s, ep.c != nullptr);
  for (int bn : {32, 64}) {
    if (!t.ok() || (only_bn && bn != only_bn) || k::gemm_sm90_prepare(dt, bn, act) != cudaSuccess) continue;
    k::GemmSm90Args g;
    g.bias = ep.bias ? t.bias.p : nullptr;
    g.d = t.d.p;
    g.m = s.m;
    g.n = s.n;
    g.k = s.k;
    g.lda = s.k;
    g.bn = bn;
    g.act = act;
    g.alpha = ep.alpha;
    g.beta = ep.c ? ep.beta : 0.0f;
    g.pdl = overlap;
    auto launch = [&](int i, cudaStream_t stream) {
      k::GemmSm90Args gi = g;
      gi.a = t.op.a.copy(i);
      gi.b = t.op.w.copy(i);
      gi.c = ep.c ? t.op.c.copy(i) : nullptr;
      return k::gemm_sm90(dt, gi, stream) == cudaSuccess;
    };
    const float ms = time_in_graph(t.op.launches, launch);  // -1: a tile that cannot run
    if (ms > 0 && (best.ms < 0 || ms < best.ms)) best = {bn, ms};
  }
  KILN_RETURN_IF_ERROR(finish_timing(fmt::format("the Hopper GEMM for m={} n={} k={}", s.m, s.n, s.k)));
  return best;
}

}  // namespace

Expected<bool> try_emit_gemm_sm90(Lowering& L, const Node& n, const DevValue* a, const DevValue* b, const GemmShape& s,
                                  const Epilogue& ep, Ref y, k::DT dt, float lt_ms, std::string* lost) {
  const int act = act_code(ep.act);
  const int mode = L.options().gemm_sm90;
  // Few rows only: at large M the launch gap is a small share and cuBLASLt's tiles are the faster.
  constexpr int64_t kMaxRows = 2048;
  if (mode < 0 || !k::gemm_sm90_available() || (mode == 0 && (!L.options().autotune || lt_ms <= 0)) || act < 0 ||
      (dt != k::DT::kF16 && dt != k::DT::kBF16) || s.batch != 1 || s.trans_a || !b->ref.weight || b->dt != dt || a->dt != dt ||
      (mode == 0 && s.m > kMaxRows) || s.n % 8 != 0 || s.k % 8 != 0 || (ep.bias && ep.bias->dt != dt) ||
      (ep.c && (ep.c->dt != dt || ep.c->numel() != s.m * s.n))) {
    return false;
  }
  const bool overlap = L.follows_trigger();
  const std::string key =
      fmt::format("{} {} {} {} {} {} {} {}", s.m, s.n, s.k, int(dt), act, ep.bias != nullptr, ep.c != nullptr, overlap);
  auto it = L.gemm_sm90_choices.find(key);
  if (it == L.gemm_sm90_choices.end()) {
    // The timing cache holds "tile ms" per signature (the tile restriction is part of it).
    TimingCache* cache = L.options().timing_cache.get();
    const std::string sig = fmt::format("{} {} {} {} {} tile{} @ {} {} {}", int(dt), act, ep.bias != nullptr, ep.c != nullptr,
                                        overlap, L.options().gemm_sm90_tile, s.m, s.n, s.k);
    GemmSm90Choice choice;
    std::optional<std::string> v = cache ? cache->get("sm90", sig) : std::nullopt;
    if (!v && cache && !L.options().time_misses) v = cache->nearest("sm90", sig);
    if (!v || std::sscanf(v->c_str(), "%d %f", &choice.bn, &choice.ms) != 2 ||
        (choice.ms > 0 && choice.bn != 32 && choice.bn != 64)) {
      if (!L.options().time_misses) return false;  // nothing timed near this shape: keep cuBLASLt
      KILN_ASSIGN_OR_RETURN(choice, time_sm90(s, ep, dt, act, L.options().gemm_sm90_tile, overlap));
      if (cache) cache->put("sm90", sig, fmt::format("{} {}", choice.bn, choice.ms));
    }
    it = L.gemm_sm90_choices.emplace(key, choice).first;
  }
  const int bn = it->second.bn;
  const float ms = it->second.ms;
  if (ms < 0 || (mode == 0 && ms >= lt_ms)) {  // cuBLASLt is as fast: keep the library
    if (ms > 0) *lost = fmt::format("; Hopper GEMM {:.1f} us (tile 64x{})", 1000.0f * ms, bn);
    return false;
  }
  KILN_ASSIGN_OR_RETURN(Ref wkn, weight_kn(L, b, s));
  const bool has_bias = ep.bias != nullptr, has_c = ep.c != nullptr;
  std::vector<int> reads = {a->ref.weight ? -1 : a->ref.id};
  if (has_c && !ep.c->ref.weight) reads.push_back(ep.c->ref.id);
  if (has_bias && !ep.bias->ref.weight) reads.push_back(ep.bias->ref.id);
  std::string impl = fmt::format("kernel gemm_sm90 {} m={} n={} k={}{}{}{} (CUTLASS TMA+wgmma, tile 64x{}x64, programmatic "
                                 "launch; {:.1f} us{})",
                                 dt == k::DT::kF16 ? "fp16" : "bf16", s.m, s.n, s.k, has_bias ? " +bias" : "",
                                 has_c ? (ep.beta == 1.0f && ep.alpha == 1.0f ? " +residual" : " +C") : "",
                                 ep.act == Act::kNone ? "" : " +" + std::string(act_name(ep.act)), bn, 1000.0f * ms,
                                 lt_ms > 0 ? fmt::format(" vs cuBLASLt {:.1f} us", 1000.0f * lt_ms) : "");
  ByteWriter w;
  w.put(int32_t(dt));
  w.put(int32_t(bn));
  w.put(int32_t(act));
  for (int64_t v : {s.m, s.n, s.k}) w.i64(v);
  w.put(ep.alpha);
  w.put(has_c ? ep.beta : 0.0f);
  put(w, a->ref);
  put(w, wkn);
  put(w, has_bias ? ep.bias->ref : Ref{});
  put(w, has_c ? ep.c->ref : Ref{});
  put(w, y);
  L.emit(&n, impl, reads, {y.id}, StepOp::kGemmSm90, std::move(w));
  L.steps.back().triggers_dependents = true;
  return true;
}

namespace {

Expected<StepFn> bind_gemm_sm90(Params& in, BindCtx&) {
  const k::DT dt = in.dt();
  const int bn = in.i32(), act = in.i32();
  const int64_t m = in.i64(), nn = in.i64(), kk = in.i64();
  const float alpha = in.f32(), beta = in.f32();
  const Ref ar = in.ref(), wkn = in.ref(), bias = in.opt_ref(), cr = in.opt_ref(), y = in.ref();
  KILN_RETURN_IF_ERROR(in.done());
  if (!k::gemm_sm90_available()) {
    return KILN_ERROR(kUnsupported, "step '{}': this kiln was built without the Hopper GEMM", in.step().label);
  }
  // Once per (tile, activation) before the first launch, outside graph capture.
  KILN_CUDA_TRY(k::gemm_sm90_prepare(dt, bn, act));
  return StepFn([=](const RunCtx& c) -> Status {
    k::GemmSm90Args g;
    g.a = c.ptr(ar);
    g.b = c.ptr(wkn);
    g.bias = bias.id >= 0 ? c.ptr(bias) : nullptr;
    g.c = cr.id >= 0 ? c.ptr(cr) : nullptr;
    g.d = c.ptr(y);
    g.m = m;
    g.n = nn;
    g.k = kk;
    g.lda = kk;
    g.bn = bn;
    g.act = act;
    g.alpha = alpha;
    g.beta = beta;
    g.pdl = true;
    return cuda_status(k::gemm_sm90(dt, g, c.stream), "gemm_sm90");
  });
}

}  // namespace

void register_gemm_sm90_binder(std::map<StepOp, BindFn>& t) { t[StepOp::kGemmSm90] = bind_gemm_sm90; }

}  // namespace kiln::cuda
