#pragma once
#include "cfg.h"
#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/util/packed_stride.hpp"  // tools/util/include of the CUTLASS source tree
using namespace cute;

template <int BM, int BN, int BK, class KSched, class ESched, int EP, class TileSched = void>
struct Cfg {
  using H = cutlass::half_t;
  using TileShape = Shape<Int<BM>, Int<BN>, Int<BK>>;
  using ClusterShape = Shape<_1, _1, _1>;
  using Fusion = std::conditional_t<EP == 1,
      cutlass::epilogue::fusion::LinCombPerColBiasEltAct<cutlass::epilogue::thread::GELU, H, float, H, H>,
      cutlass::epilogue::fusion::LinCombPerColBias<H, float, H, H>>;
  using Epi = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      H, cutlass::layout::RowMajor, 8, H, cutlass::layout::RowMajor, 8, ESched, Fusion>::CollectiveOp;
  using Main = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      H, cutlass::layout::RowMajor, 8, H, cutlass::layout::RowMajor, 8, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epi::SharedStorage))>,
      KSched>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Main, Epi, TileSched>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static Launch make(const Prob& p, int splits) {
    auto g = std::make_shared<Gemm>();
    using SA = typename Gemm::GemmKernel::StrideA;
    using SB = typename Gemm::GemmKernel::StrideB;
    using SC = typename Gemm::GemmKernel::StrideC;
    using SD = typename Gemm::GemmKernel::StrideD;
    SA sa = cutlass::make_cute_packed_stride(SA{}, cute::make_shape(p.m, p.k, 1));
    cute::get<0>(sa) = p.lda;
    SB sb = cutlass::make_cute_packed_stride(SB{}, cute::make_shape(p.n, p.k, 1));
    SC sc = cutlass::make_cute_packed_stride(SC{}, cute::make_shape(p.m, p.n, 1));
    SD sd = cutlass::make_cute_packed_stride(SD{}, cute::make_shape(p.m, p.n, 1));
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {p.m, p.n, p.k, 1},
                                  {reinterpret_cast<const H*>(p.A), sa, reinterpret_cast<const H*>(p.B), sb},
                                  {{}, reinterpret_cast<const H*>(p.C ? p.C : p.D), sc, reinterpret_cast<H*>(p.D), sd}};
    args.epilogue.thread.alpha = 1.f;
    args.epilogue.thread.beta = p.C ? 1.f : 0.f;
    args.epilogue.thread.bias_ptr = reinterpret_cast<const H*>(p.bias);
    if constexpr (!std::is_same_v<TileSched, void>) {
      args.scheduler.splits = splits;
      args.scheduler.decomposition_mode =
          cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90StreamKParams::DecompositionMode::SplitK;
    }
    if (g->can_implement(args) != cutlass::Status::kSuccess) return Launch{};
    size_t ws = Gemm::get_workspace_size(args);
    void* w = nullptr;
    if (ws) cudaMalloc(&w, ws);
    if (g->initialize(args, w) != cutlass::Status::kSuccess) return Launch{};
    return [g](cudaStream_t s, bool pdl) {
      return g->run(s, nullptr, pdl) == cutlass::Status::kSuccess ? cudaSuccess : cudaErrorUnknown;
    };
  }
};
template <class C>
void add(std::vector<Runner>& v, const char* name, int ep, int splits = 1) {
  v.push_back({std::string(name) + (splits > 1 ? "_s" + std::to_string(splits) : ""), ep,
               [splits](const Prob& p) { return C::make(p, splits); }});
}
using NP = cutlass::gemm::KernelTmaWarpSpecialized;
using PP = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using CO = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using ENP = cutlass::epilogue::TmaWarpSpecialized;
using ECO = cutlass::epilogue::TmaWarpSpecializedCooperative;
using SK = cutlass::gemm::StreamKScheduler;
