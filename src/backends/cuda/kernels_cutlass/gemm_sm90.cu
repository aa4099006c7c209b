// Hopper GEMMs for few-row products (batch-1 transformer layers), built from CUTLASS 3's sm90
// collectives: TMA loads into a multi-stage shared-memory ring, wgmma on one consumer warpgroup,
// a TMA-store epilogue with the bias, GELU and residual fused. What they have that cuBLASLt's
// kernels lack is programmatic dependent launch: launched with programmatic stream serialization,
// a kernel's CTAs become resident while the previous kernel finishes and wait (griddepcontrol.wait)
// only before their first load, and each kernel lets the next one launch once its main loop is
// done. At BERT-base batch 1 (M = 128) that hides most of the gap between dependent launches that
// a CUDA graph still pays, which is the whole of their gain: the products themselves are no faster
// than cuBLASLt's (bench/RESULTS.md, "The experiment that decided it (bench/pdl_chain, outside the
// build)").
//
// Instantiated for fp16 and bf16 with f32 accumulation, B as a row-major [K, N] matrix (the ONNX MatMul
// weight as exported), CTA tiles 64 x {32, 64} x 64, activation none or GELU (tanh form, as
// cuBLASLt's epilogue). Compiled only when the CUTLASS headers were found (scripts/install-deps.sh);
// otherwise gemm_sm90_available() is false and the lowering keeps cuBLASLt.
#include "backends/cuda/kernels/kernels.h"

#ifdef KILN_HAVE_CUTLASS
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#endif

namespace kiln::cuda::k {

#ifdef KILN_HAVE_CUTLASS
namespace {

template <class E, int BN, template <class> class Act>
struct Sm90Gemm {
  using Tile = cute::Shape<cute::_64, cute::Int<BN>, cute::_64>;
  using Cluster = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using Fusion = cutlass::epilogue::fusion::LinCombPerColBiasEltAct<Act, E, float, E, E>;
  using Epi = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster, cutlass::epilogue::collective::EpilogueTileAuto,
      float, float, E, cutlass::layout::RowMajor, 8, E, cutlass::layout::RowMajor, 8,
      cutlass::epilogue::TmaWarpSpecialized, Fusion>::CollectiveOp;
  using Main = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, E, cutlass::layout::RowMajor, 8, E,
      cutlass::layout::RowMajor, 8, float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epi::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecialized>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Main, Epi>;
  using Adapter = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Adapter::Arguments arguments(const GemmSm90Args& g) {
    using SA = typename Kernel::StrideA;
    using SB = typename Kernel::StrideB;
    using SC = typename Kernel::StrideC;
    using SD = typename Kernel::StrideD;
    // Row-major A [M, K] (leading dimension lda), B [K, N], C and D [M, N]: the unit stride is
    // the static one in each CUTLASS stride type; the batch stride is unused (L = 1).
    SA sa{};
    cute::get<0>(sa) = g.lda;
    SB sb{};
    cute::get<1>(sb) = g.n;
    SC sc{};
    cute::get<0>(sc) = g.n;
    SD sd{};
    cute::get<0>(sd) = g.n;
    const E* c = static_cast<const E*>(g.c ? g.c : g.d);  // not read when beta is 0
    typename Adapter::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                     {int(g.m), int(g.n), int(g.k), 1},
                                     {static_cast<const E*>(g.a), sa, static_cast<const E*>(g.b), sb},
                                     {{}, c, sc, static_cast<E*>(g.d), sd}};
    args.epilogue.thread.alpha = g.alpha;
    args.epilogue.thread.beta = g.c ? g.beta : 0.0f;
    args.epilogue.thread.bias_ptr = static_cast<const E*>(g.bias);  // null: no bias
    return args;
  }

  static cudaError_t prepare() {
    return cudaFuncSetAttribute(cutlass::device_kernel<Kernel>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                int(Kernel::SharedStorageSize));
  }

  // No workspace (a non-persistent kernel without split-K); the parameters (with the TMA
  // descriptors) are built on the host for each launch, which graph capture records once.
  // Launched here rather than by the adapter, which swallows the launch's error code.
  static cudaError_t launch(const GemmSm90Args& g, cudaStream_t s) {
    typename Kernel::Params params = Kernel::to_underlying_arguments(arguments(g), nullptr);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = Adapter::get_grid_shape(params);
    cfg.blockDim = Kernel::get_block_shape();
    cfg.dynamicSmemBytes = size_t(Kernel::SharedStorageSize);
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = g.pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, cutlass::device_kernel<Kernel>, params);
  }
};

template <class E, template <class> class Act, class F>
cudaError_t with_tile(int bn, F f) {
  switch (bn) {
    case 32: return f(Sm90Gemm<E, 32, Act>{});
    case 64: return f(Sm90Gemm<E, 64, Act>{});
    default: return cudaErrorInvalidValue;
  }
}

template <class E, class F>
cudaError_t with_act(int act, int bn, F f) {
  switch (act) {
    case 0: return with_tile<E, cutlass::epilogue::thread::Identity>(bn, f);
    case 2: return with_tile<E, cutlass::epilogue::thread::GELU_taylor>(bn, f);
    default: return cudaErrorInvalidValue;
  }
}

template <class F>
cudaError_t dispatch(DT dt, int act, int bn, F f) {
  switch (dt) {
    case DT::kF16: return with_act<cutlass::half_t>(act, bn, f);
    case DT::kBF16: return with_act<cutlass::bfloat16_t>(act, bn, f);
    default: return cudaErrorInvalidValue;
  }
}

bool shape_ok(DT dt, const GemmSm90Args& g) {
  if ((dt != DT::kF16 && dt != DT::kBF16) || (g.bn != 32 && g.bn != 64) || (g.act != 0 && g.act != 2)) return false;
  if (g.m < 1 || g.n < 8 || g.k < 8 || g.n % 8 || g.k % 8 || g.lda < g.k || g.lda % 8) return false;
  if (g.m > (int64_t{1} << 30) || g.n > (int64_t{1} << 30) || g.k > (int64_t{1} << 30)) return false;
  for (const void* p : {g.a, g.b, g.bias, g.c, static_cast<const void*>(g.d)}) {
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return g.a && g.b && g.d;
}

}  // namespace

bool gemm_sm90_available() { return true; }

cudaError_t gemm_sm90_prepare(DT dt, int bn, int act) {
  return dispatch(dt, act, bn, [](auto k) { return decltype(k)::prepare(); });
}

cudaError_t gemm_sm90(DT dt, const GemmSm90Args& g, cudaStream_t s) {
  if (!shape_ok(dt, g)) return cudaErrorInvalidValue;
  return dispatch(dt, g.act, g.bn, [&](auto k) { return decltype(k)::launch(g, s); });
}

#else  // built without the CUTLASS headers: the lowering keeps cuBLASLt

bool gemm_sm90_available() { return false; }
cudaError_t gemm_sm90_prepare(DT, int, int) { return cudaErrorNotSupported; }
cudaError_t gemm_sm90(DT, const GemmSm90Args&, cudaStream_t) { return cudaErrorNotSupported; }

#endif

}  // namespace kiln::cuda::k
