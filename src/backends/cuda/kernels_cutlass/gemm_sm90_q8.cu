// 8-bit products on Hopper for QuantizedMatMul (lower_gemm_quant.cc), built from CUTLASS 3's sm90
// collectives: both operands float8 e4m3 (f32 sums, promoted to full f32 every few k-blocks as
// CUTLASS's FP8 mainloop does) or both int8 (int32 sums), and the whole dequantization in the
// epilogue: D = act(alpha[n] * sums + bias[n] + beta * C), alpha the column's scale times x's,
// bias the model's bias less what x's zero point adds, C a residual. cuBLASLt (CUDA 13.0) has no
// Hopper kernel for that: its int8 products leave int32 sums and its fp8 ones take no per-column
// scale, so a separate pass over the sums cost more than the 8 bits saved (bench/RESULTS.md,
// "thirty-fourth session").
//
// A is x quantized, row-major [M, K]; B is the weight stored [N, K] (both K-major, as wgmma wants 8-bit
// operands); D and C are fp16 or bf16 [M, N]. Two tiles, 128x128x128 for many rows and 64x128x128
// for few (WideTile, NarrowTile); activations none or GELU (tanh form, as the 16-bit kernels'
// epilogues).
#include <type_traits>

#include "backends/cuda/kernels/common.cuh"
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

using cute::_1;
using cute::_64;
using cute::_128;

// Many rows. int8: two consumer warpgroups taking turns (one's epilogue under the other's products),
// the fastest on BERT-base's products at 8192 rows (bench/RESULTS.md, "thirty-fifth session").
// fp8: the two warpgroups on one tile (cooperative): CUTLASS's fp8 main loop promotes the
// tensor cores' partial sums to f32 every few k-blocks, and in the ping-pong kernel that costs it
// half its speed. Both persistent over the tiles.
template <bool Fp8>
struct WideTile {
  using Shape = cute::Shape<_128, _128, _128>;
  using Main = std::conditional_t<Fp8, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                  cutlass::gemm::KernelTmaWarpSpecializedPingpong>;
  using Epi = std::conditional_t<Fp8, cutlass::epilogue::TmaWarpSpecializedCooperative,
                                 cutlass::epilogue::TmaWarpSpecialized>;
};
// Few rows (a batch-1 transformer's 128): 64-row tiles, ping-pong.
template <bool Fp8>
struct NarrowTile {
  using Shape = cute::Shape<_64, _128, _128>;
  using Main = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using Epi = cutlass::epilogue::TmaWarpSpecialized;
};

template <class In, class Acc, class E, class T, template <class> class Act>
struct Sm90Q8 {
  using Cluster = cute::Shape<_1, _1, _1>;
  // act(alpha[n] * acc + beta * C + bias[n]); beta is a scalar (a null pointer and a zero skip C).
  using Fusion = cutlass::epilogue::fusion::PerColLinCombPerColBiasEltAct<Act, E, float, float, E, float>;
  using Epi = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename T::Shape, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, Acc, float, E, cutlass::layout::RowMajor, 8, E,
      cutlass::layout::RowMajor, 8, typename T::Epi, Fusion>::CollectiveOp;
  using Main = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, In, cutlass::layout::RowMajor, 16, In,
      cutlass::layout::ColumnMajor, 16, Acc, typename T::Shape, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epi::SharedStorage))>,
      typename T::Main>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Main, Epi>;
  using Adapter = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Adapter::Arguments arguments(const GemmSm90QArgs& g, int sm_count) {
    const int m = int(g.m), n = int(g.n), k = int(g.k);
    // Each CUTLASS stride type holds the unit stride statically; the leading dimension is set here
    // (A [M, K], B [N, K] and C, D [M, N], all with the last index contiguous; L = 1).
    typename Kernel::StrideA sa{};
    cute::get<0>(sa) = k;
    typename Kernel::StrideB sb{};
    cute::get<0>(sb) = k;
    typename Kernel::StrideC sc{};
    cute::get<0>(sc) = n;
    typename Kernel::StrideD sd{};
    cute::get<0>(sd) = n;
    const E* c = static_cast<const E*>(g.c ? g.c : g.d);  // not read when beta is 0
    typename Adapter::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                     {m, n, k, 1},
                                     {static_cast<const In*>(g.a), sa, static_cast<const In*>(g.b), sb},
                                     {{}, c, sc, static_cast<E*>(g.d), sd}};
    auto& t = args.epilogue.thread;
    t.alpha_ptr = g.alpha;  // one per column
    t.beta = g.c ? g.beta : 0.0f;
    t.beta_ptr = nullptr;
    t.dBeta = {cute::_0{}, false, 0};  // a scalar
    t.bias_ptr = g.bias;               // null: no bias
    args.hw_info.sm_count = sm_count;
    return args;
  }

  static cudaError_t prepare() {
    return cudaFuncSetAttribute(cutlass::device_kernel<Kernel>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                int(Kernel::SharedStorageSize));
  }

  // No workspace (no split-K or stream-K); the parameters are built on the host for each launch,
  // which graph capture records once. Launched here rather than by the adapter, which swallows the
  // launch's error code.
  static cudaError_t launch(const GemmSm90QArgs& g, cudaStream_t s) {
    auto args = arguments(g, sm_count());  // the current device's (the persistent grid's size)
    if (Kernel::get_workspace_size(args) != 0 || !Kernel::can_implement(args)) return cudaErrorInvalidValue;
    typename Kernel::Params params = Kernel::to_underlying_arguments(args, nullptr);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = Kernel::get_grid_shape(params);
    cfg.blockDim = Kernel::get_block_shape();
    cfg.dynamicSmemBytes = size_t(Kernel::SharedStorageSize);
    cfg.stream = s;
    return cudaLaunchKernelEx(&cfg, cutlass::device_kernel<Kernel>, params);
  }
};

template <class In, class Acc, class E, template <class> class Act, class F>
cudaError_t with_tile(int tile, F f) {
  switch (tile) {
    case 0: return f(Sm90Q8<In, Acc, E, WideTile<std::is_same_v<In, cutlass::float_e4m3_t>>, Act>{});
    case 1: return f(Sm90Q8<In, Acc, E, NarrowTile<std::is_same_v<In, cutlass::float_e4m3_t>>, Act>{});
    default: return cudaErrorInvalidValue;
  }
}

template <class In, class Acc, class E, class F>
cudaError_t with_act(int act, int tile, F f) {
  switch (act) {
    case 0: return with_tile<In, Acc, E, cutlass::epilogue::thread::Identity>(tile, f);
    case 2: return with_tile<In, Acc, E, cutlass::epilogue::thread::GELU_taylor>(tile, f);
    default: return cudaErrorInvalidValue;
  }
}

template <class E, class F>
cudaError_t with_input(bool fp8, int act, int tile, F f) {
  return fp8 ? with_act<cutlass::float_e4m3_t, float, E>(act, tile, f) : with_act<int8_t, int32_t, E>(act, tile, f);
}

template <class F>
cudaError_t dispatch(bool fp8, bool bf16, int act, int tile, F f) {
  return bf16 ? with_input<cutlass::bfloat16_t>(fp8, act, tile, f) : with_input<cutlass::half_t>(fp8, act, tile, f);
}

bool shape_ok(const GemmSm90QArgs& g) {
  if ((g.tile != 0 && g.tile != 1) || (g.act != 0 && g.act != 2) || !gemm_sm90_q8_shape_ok(g.m, g.n, g.k)) return false;
  for (const void* p : {g.a, g.b, static_cast<const void*>(g.alpha), static_cast<const void*>(g.bias), g.c,
                        static_cast<const void*>(g.d)}) {
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return g.a && g.b && g.alpha && g.d;
}

}  // namespace

bool gemm_sm90_q8_available() { return true; }

bool gemm_sm90_q8_shape_ok(int64_t m, int64_t n, int64_t k) {
  constexpr int64_t kMax = int64_t{1} << 30;
  return m >= 1 && n >= 16 && k >= 16 && n % 16 == 0 && k % 16 == 0 && m <= kMax && n <= kMax && k <= kMax;
}

cudaError_t gemm_sm90_q8_prepare(bool fp8, bool bf16, int tile, int act) {
  return dispatch(fp8, bf16, act, tile, [](auto k) { return decltype(k)::prepare(); });
}

cudaError_t gemm_sm90_q8(const GemmSm90QArgs& g, cudaStream_t s) {
  if (!shape_ok(g)) return cudaErrorInvalidValue;
  return dispatch(g.fp8, g.bf16, g.act, g.tile, [&](auto k) { return decltype(k)::launch(g, s); });
}

#else  // built without the CUTLASS headers: QuantizedMatMul keeps cuBLASLt or its 16-bit form

bool gemm_sm90_q8_available() { return false; }
bool gemm_sm90_q8_shape_ok(int64_t, int64_t, int64_t) { return false; }
cudaError_t gemm_sm90_q8_prepare(bool, bool, int, int) { return cudaErrorNotSupported; }
cudaError_t gemm_sm90_q8(const GemmSm90QArgs&, cudaStream_t) { return cudaErrorNotSupported; }

#endif

}  // namespace kiln::cuda::k
