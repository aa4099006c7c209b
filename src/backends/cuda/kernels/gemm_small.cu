// Small-M GEMM (kernels.h gemm_small): D[M,N] = act(alpha * A[M,K] . W[K,N] + beta * C + bias) for
// the few-row products of batch-1 transformer layers (M = 128 tokens), where the weights are the
// only real traffic and cuBLASLt's tiles leave most of the 132 SMs idle: a 128 x 768 x 768
// product has 12 to 36 output tiles. Here each CTA owns all (up to 128) rows of a BN-column slice
// and one of S slices of K, so the grid is (N / BN) x S CTAs, ~one per SM. The S CTAs sharing an
// output slice form a thread-block cluster (Hopper) and add their f32 partial tiles through
// distributed shared memory, each finishing BM / S rows with the epilogue: no workspace, no
// second kernel.
//
// The weight comes transposed, Wt[N,K] (K contiguous; the lowering transposes the constant once
// at build), so both operands are K-major tiles in shared memory and their mma.sync fragments are
// plain (non-transposed) ldmatrix loads. A and Wt stream through a cp.async pipeline of kStages
// 64-deep K steps. Four warps each compute 32 rows x BN columns (m16n8k16, f32 accumulators).
// (Fragment layouts: mma.cuh.)
#include <cooperative_groups.h>

#include <cmath>

#include "backends/cuda/kernels/mma.cuh"

namespace cg = cooperative_groups;

namespace kiln::cuda::k {

namespace {

constexpr int kBM = 128;         // rows per CTA (the whole M of a batch-1 layer)
constexpr int kBK = 64;          // K per pipeline stage
constexpr int kLds = kBK + 8;    // shared pitch in elements: 144 bytes, ldmatrix conflict-free
constexpr int kStages = 3;
constexpr int kThreads = 128;

template <int BN>
constexpr size_t smem_bytes() {
  constexpr size_t pipe = size_t(kStages) * (kBM + BN) * kLds * 2;
  constexpr size_t red = size_t(kBM) * (BN + 4) * 4;  // the f32 partial tile, reusing the pipeline
  return pipe > red ? pipe : red;
}

// cuBLASLt's GELU epilogue is the tanh form; the same here, so either kernel gives the same model.
__device__ __forceinline__ float gelu_tanh(float x) {
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

template <class T, int BN>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_small_kernel(const T* __restrict__ a, const T* __restrict__ wt, const T* __restrict__ bias,
                      const T* __restrict__ c, T* __restrict__ d, int m, int n, int k, int k_per_cta, float alpha,
                      float beta, int act) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* as = reinterpret_cast<T*>(smem);             // [kStages][kBM][kLds]
  T* bs = as + size_t(kStages) * kBM * kLds;       // [kStages][BN][kLds]
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int n0 = int(blockIdx.x) * BN, m0 = int(blockIdx.z) * kBM, k0 = int(blockIdx.y) * k_per_cta;
  const int steps = k_per_cta / kBK;
  const int rows = min(kBM, m - m0);

  auto load_stage = [&](int st, int step) {
    const int kk = k0 + step * kBK;
    T* at = as + size_t(st) * kBM * kLds;
    T* bt = bs + size_t(st) * BN * kLds;
    constexpr int kChunks = kBK / 8;  // 16-byte chunks per row
#pragma unroll
    for (int i = tid; i < kBM * kChunks; i += kThreads) {
      const int r = i / kChunks, ch = i % kChunks;
      const bool in = r < rows;
      cp_async16(at + r * kLds + ch * 8, in ? a + size_t(m0 + r) * k + kk + ch * 8 : a, in ? 16 : 0);
    }
#pragma unroll
    for (int i = tid; i < BN * kChunks; i += kThreads) {
      const int r = i / kChunks, ch = i % kChunks;
      cp_async16(bt + r * kLds + ch * 8, wt + size_t(n0 + r) * k + kk + ch * 8, 16);
    }
  };

  constexpr int kNT = BN / 8;  // n8 tiles per warp
  float acc[2][kNT][4] = {};
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) load_stage(s, s);
    cp_async_commit();
  }
  for (int step = 0; step < steps; ++step) {
    cp_async_wait<kStages - 2>();  // this step's stage has landed (the newer ones may still fly)
    __syncthreads();               // ... for every thread; and the stage refilled below is free
    const int next = step + kStages - 1;
    if (next < steps) load_stage(next % kStages, next);
    cp_async_commit();
    const T* at = as + size_t(step % kStages) * kBM * kLds + (warp * 32) * kLds;
    const T* bt = bs + size_t(step % kStages) * BN * kLds;
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      uint32_t af[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        // matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15)
        const T* p = at + (mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kLds + ks * 16 + (lane >> 4) * 8;
        ldmatrix_x4(af[mt], p);
      }
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        // matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15): b0 b1 of two n8 tiles
        uint32_t bf[4];
        const T* p = bt + (np * 16 + (lane & 7) + (lane >> 4) * 8) * kLds + ks * 16 + ((lane >> 3) & 1) * 8;
        ldmatrix_x4(bf, p);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma(acc[mt][2 * np], af[mt], bf[0], bf[1], T());
          mma(acc[mt][2 * np + 1], af[mt], bf[2], bf[3], T());
        }
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the pipeline's shared memory becomes the partial tile

  float* red = reinterpret_cast<float*>(smem);  // [kBM][BN + 4]
  constexpr int kLdr = BN + 4;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const int r = warp * 32 + mt * 16 + g, col = nt * 8 + 2 * t;
      *reinterpret_cast<float2*>(red + r * kLdr + col) = make_float2(acc[mt][nt][0], acc[mt][nt][1]);
      *reinterpret_cast<float2*>(red + (r + 8) * kLdr + col) = make_float2(acc[mt][nt][2], acc[mt][nt][3]);
    }
  }
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every partial tile of the cluster is written

  // This CTA finishes rows [r0, r1) of the tile: the sum over the cluster's partials, then the
  // epilogue, four columns per thread. Every rank's piece is requested before any is added: a
  // distributed-shared-memory load costs hundreds of cycles, and issued one after another (the
  // first version of this loop) they made the reduction most of the kernel's time.
  const int parts = int(cluster.num_blocks()), rank = int(cluster.block_rank());
  const float* src[8];
#pragma unroll
  for (int q = 0; q < 8; ++q) src[q] = cluster.map_shared_rank(red, q < parts ? q : 0);
  const int per = (kBM + parts - 1) / parts, r0 = rank * per, r1 = min(min(kBM, r0 + per), rows);
  constexpr int kQuads = BN / 4;
  for (int i = tid; i < (r1 - r0) * kQuads; i += kThreads) {
    const int r = r0 + i / kQuads, col = (i % kQuads) * 4;
    float4 v[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      if (q < parts) v[q] = *reinterpret_cast<const float4*>(src[q] + r * kLdr + col);
    }
    float acc4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      if (q < parts) {
        acc4[0] += v[q].x;
        acc4[1] += v[q].y;
        acc4[2] += v[q].z;
        acc4[3] += v[q].w;
      }
    }
    const size_t o = size_t(m0 + r) * n + n0 + col;
    struct alignas(4 * sizeof(T)) Quad {
      T e[4];
    };
    Quad cq{}, bq{}, out;
    if (c != nullptr) cq = *reinterpret_cast<const Quad*>(c + o);
    if (bias != nullptr) bq = *reinterpret_cast<const Quad*>(bias + n0 + col);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x = alpha * acc4[e];
      if (c != nullptr) x += beta * to_f(cq.e[e]);
      if (bias != nullptr) x += to_f(bq.e[e]);
      if (act == 1) x = fmaxf(x, 0.0f);
      else if (act == 2) x = gelu_tanh(x);
      out.e[e] = from_f<T>(x);
    }
    *reinterpret_cast<Quad*>(d + o) = out;
  }
  cluster.sync();  // no CTA leaves while another still reads its shared memory
}

template <class T, int BN>
cudaError_t launch_small(const GemmSmallArgs& g, cudaStream_t s) {
  constexpr size_t kSmem = smem_bytes<BN>();
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(g.n / BN), unsigned(g.split), unsigned((g.m + kBM - 1) / kBM));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = unsigned(g.split);
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, gemm_small_kernel<T, BN>, static_cast<const T*>(g.a), static_cast<const T*>(g.wt),
                            static_cast<const T*>(g.bias), static_cast<const T*>(g.c), static_cast<T*>(g.d), int(g.m),
                            int(g.n), int(g.k), int(g.k / g.split), g.alpha, g.beta, g.act);
}

template <class T, int BN>
cudaError_t prepare_small() {
  return cudaFuncSetAttribute(gemm_small_kernel<T, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              int(smem_bytes<BN>()));
}

}  // namespace

bool gemm_small_supported(DT dt, int64_t m, int64_t n, int64_t k, int bn, int split) {
  return (dt == DT::kF16 || dt == DT::kBF16) && (bn == 32 || bn == 64) && m >= 1 && m <= 4 * kBM && n % bn == 0 &&
         split >= 1 && split <= 8 && k % (int64_t{split} * kBK) == 0 && n / bn <= 65535 && k <= (int64_t{1} << 30) &&
         m * n <= (int64_t{1} << 31) && m * k <= (int64_t{1} << 31) && n * k <= (int64_t{1} << 31);
}

cudaError_t gemm_small_prepare(DT dt, int bn) {
  if (dt == DT::kF16) return bn == 64 ? prepare_small<__half, 64>() : prepare_small<__half, 32>();
  if (dt == DT::kBF16) return bn == 64 ? prepare_small<__nv_bfloat16, 64>() : prepare_small<__nv_bfloat16, 32>();
  return cudaErrorInvalidValue;
}

cudaError_t gemm_small(DT dt, const GemmSmallArgs& g, cudaStream_t s) {
  if (!gemm_small_supported(dt, g.m, g.n, g.k, g.bn, g.split) || g.act < 0 || g.act > 2) return cudaErrorInvalidValue;
  for (const void* p : {g.a, g.wt, g.bias, g.c, static_cast<const void*>(g.d)}) {
    if (p != nullptr && !aligned_to(p, 16)) return cudaErrorInvalidValue;
  }
  if (dt == DT::kF16) return g.bn == 64 ? launch_small<__half, 64>(g, s) : launch_small<__half, 32>(g, s);
  return g.bn == 64 ? launch_small<__nv_bfloat16, 64>(g, s) : launch_small<__nv_bfloat16, 32>(g, s);
}

}  // namespace kiln::cuda::k
