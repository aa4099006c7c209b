// Small-M GEMM (kernels.h gemm_small): D[M,N] = act(alpha * A[M,K] . W[K,N] + beta * C + bias) for
// the few-row products of batch-1 transformer layers (M = 128 tokens), where the weights are the
// only real traffic and cuBLASLt's tiles leave most of the 132 SMs idle: a 128 x 768 x 768
// product has 12 to 36 output tiles. Here each CTA owns all (up to 128) rows of a BN-column slice
// and one of S slices of K, so the grid is (N / BN) x S CTAs, ~one per SM. The S CTAs sharing an
// output slice form a thread-block cluster (Hopper) and add their f32 partial tiles through
// distributed shared memory, each finishing 128 / S rows with the epilogue: no workspace, no
// second kernel.
//
// The whole K slice of both operands is resident in shared memory (up to 227 KB), requested at
// once: a CTA runs only 2-9 steps of 64, too few for a ring of stages to reach the bandwidth (the
// first version of this kernel, a 3-stage ring: ~8% of DRAM bandwidth). Half the warps copy the
// weight slice, the other half the activation slice, each step's piece its own cp.async group, and
// all eight warps multiply a step as soon as both pieces have landed. The weight does not depend on
// the kernel before (it is a constant), so it is requested before pdl_wait(): with programmatic
// dependent launch the weight stream overlaps the previous kernel's tail.
//
// The weight comes transposed, Wt[N,K] (K contiguous; the lowering transposes the constant once
// at build), so both operands are K-major tiles in shared memory and their mma.sync fragments are
// plain (non-transposed) ldmatrix loads. Eight warps: 4 row blocks of 32 x 2 column halves of BN/2,
// m16n8k16 with f32 accumulators (fragment layouts: mma.cuh).
#include <cooperative_groups.h>

#include <cmath>

#include "backends/cuda/kernels/mma.cuh"

namespace cg = cooperative_groups;

namespace kiln::cuda::k {

namespace {

constexpr int kBM = 128;                 // rows per CTA (the whole M of a batch-1 layer)
constexpr int kBK = 64;                  // K per step: one cp.async group per operand
constexpr int kThreads = 256;            // warps 0-3 copy the weight, 4-7 the activations
constexpr size_t kMaxSmem = 227 * 1024;  // the H100's per-block opt-in limit

// Shared pitch of a K slice of kc elements: kc + 8, so consecutive rows are 16 bytes apart modulo
// 128 and ldmatrix reads are conflict-free.
__host__ __device__ constexpr int pitch(int kc) { return kc + 8; }

size_t smem_bytes(int bn, int64_t kc) {
  const size_t slices = size_t(kBM + bn) * size_t(pitch(int(kc))) * 2;
  const size_t red = size_t(kBM) * size_t(bn + 4) * 4;  // the f32 partial tile, reusing the slices
  return slices > red ? slices : red;
}

// cuBLASLt's GELU epilogue is the tanh form; the same here, so either kernel gives the same model.
__device__ __forceinline__ float gelu_tanh(float x) {
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

// cp.async.wait_group with a run-time count: waits until at most n groups are in flight (n above
// 7 waits for 7, which is stricter and so still correct).
__device__ __forceinline__ void cp_async_wait_upto(int n) {
  switch (n) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    case 5: cp_async_wait<5>(); break;
    case 6: cp_async_wait<6>(); break;
    default: cp_async_wait<7>(); break;
  }
}

template <class T, int BN>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_small_kernel(const T* __restrict__ a, const T* __restrict__ wt, const T* __restrict__ bias,
                      const T* __restrict__ c, T* __restrict__ d, int m, int n, int k, int kc, float alpha,
                      float beta, int act) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int ld = pitch(kc);
  T* as = reinterpret_cast<T*>(smem);  // [kBM][ld]
  T* bs = as + size_t(kBM) * ld;       // [BN][ld]
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int n0 = int(blockIdx.x) * BN, k0 = int(blockIdx.y) * kc, m0 = int(blockIdx.z) * kBM;
  const int steps = kc / kBK;
  const int rows = min(kBM, m - m0);
  pdl_launch_dependents();

  constexpr int kChunks = kBK / 8;  // 16-byte pieces per row and step
  if (warp < 4) {
    for (int st = 0; st < steps; ++st) {
      const int kk = k0 + st * kBK;
      for (int i = tid; i < BN * kChunks; i += 128) {
        const int r = i / kChunks, ch = i % kChunks;
        cp_async16(bs + r * ld + st * kBK + ch * 8, wt + size_t(n0 + r) * k + kk + ch * 8, 16);
      }
      cp_async_commit();
    }
    pdl_wait();  // before the epilogue reads C and writes D
  } else {
    pdl_wait();  // A is the previous kernel's output
    for (int st = 0; st < steps; ++st) {
      const int kk = k0 + st * kBK;
      for (int i = tid - 128; i < kBM * kChunks; i += 128) {
        const int r = i / kChunks, ch = i % kChunks;
        const bool in = r < rows;
        cp_async16(as + r * ld + st * kBK + ch * 8, in ? a + size_t(m0 + r) * k + kk + ch * 8 : a, in ? 16 : 0);
      }
      cp_async_commit();
    }
  }

  const int wm = warp & 3, wn = warp >> 2;
  constexpr int kNT = BN / 16;  // n8 tiles per warp: BN / 2 columns
  const bool busy = wm * 32 < rows;
  float acc[2][kNT][4] = {};
  for (int st = 0; st < steps; ++st) {
    cp_async_wait_upto(steps - 1 - st);  // this thread's pieces of step st have landed
    __syncthreads();                     // ... and every other thread's
    if (!busy) continue;
    const T* at = as + (wm * 32) * ld + st * kBK;
    const T* bt = bs + (wn * (BN / 2)) * ld + st * kBK;
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      uint32_t af[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        // matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15)
        const T* p = at + (mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + ks * 16 + (lane >> 4) * 8;
        ldmatrix_x4(af[mt], p);
      }
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        // matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15): b0 b1 of two n8 tiles
        uint32_t bf[4];
        const T* p = bt + (np * 16 + (lane & 7) + (lane >> 4) * 8) * ld + ks * 16 + ((lane >> 3) & 1) * 8;
        ldmatrix_x4(bf, p);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma(acc[mt][2 * np], af[mt], bf[0], bf[1], T());
          mma(acc[mt][2 * np + 1], af[mt], bf[2], bf[3], T());
        }
      }
    }
  }
  __syncthreads();  // the slices' shared memory becomes the partial tile

  float* red = reinterpret_cast<float*>(smem);  // [kBM][BN + 4]
  constexpr int kLdr = BN + 4;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const int r = wm * 32 + mt * 16 + g, col = wn * (BN / 2) + nt * 8 + 2 * t;
      *reinterpret_cast<float2*>(red + r * kLdr + col) = make_float2(acc[mt][nt][0], acc[mt][nt][1]);
      *reinterpret_cast<float2*>(red + (r + 8) * kLdr + col) = make_float2(acc[mt][nt][2], acc[mt][nt][3]);
    }
  }
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every partial tile of the cluster is written

  // This CTA finishes rows [r0, r1) of the tile: the sum over the cluster's partials, then the
  // epilogue, four columns per thread. Every rank's piece is requested before any is added: a
  // distributed-shared-memory load costs hundreds of cycles.
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
  const int64_t kc = g.k / g.split;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(g.n / BN), unsigned(g.split), unsigned((g.m + kBM - 1) / kBM));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem_bytes(BN, kc);
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = unsigned(g.split);
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = g.pdl ? 2 : 1;
  return cudaLaunchKernelEx(&cfg, gemm_small_kernel<T, BN>, static_cast<const T*>(g.a), static_cast<const T*>(g.wt),
                            static_cast<const T*>(g.bias), static_cast<const T*>(g.c), static_cast<T*>(g.d), int(g.m),
                            int(g.n), int(g.k), int(kc), g.alpha, g.beta, g.act);
}

template <class T>
cudaError_t launch_dt(const GemmSmallArgs& g, cudaStream_t s) {
  switch (g.bn) {
    case 32: return launch_small<T, 32>(g, s);
    case 64: return launch_small<T, 64>(g, s);
    default: return launch_small<T, 128>(g, s);
  }
}

template <class T, int BN>
cudaError_t prepare_small() {
  return cudaFuncSetAttribute(gemm_small_kernel<T, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMaxSmem));
}

template <class T>
cudaError_t prepare_dt(int bn) {
  switch (bn) {
    case 32: return prepare_small<T, 32>();
    case 64: return prepare_small<T, 64>();
    case 128: return prepare_small<T, 128>();
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

bool gemm_small_supported(DT dt, int64_t m, int64_t n, int64_t k, int bn, int split) {
  return (dt == DT::kF16 || dt == DT::kBF16) && (bn == 32 || bn == 64 || bn == 128) && m >= 1 && m <= 4 * kBM && k > 0 &&
         n % bn == 0 && split >= 1 && split <= 8 && k % (int64_t{split} * kBK) == 0 &&
         smem_bytes(bn, k / split) <= kMaxSmem && n / bn <= 65535 && k <= (int64_t{1} << 30) &&
         m * n <= (int64_t{1} << 31) && m * k <= (int64_t{1} << 31) && n * k <= (int64_t{1} << 31);
}

cudaError_t gemm_small_prepare(DT dt, int bn) {
  if (dt == DT::kF16) return prepare_dt<__half>(bn);
  if (dt == DT::kBF16) return prepare_dt<__nv_bfloat16>(bn);
  return cudaErrorInvalidValue;
}

cudaError_t gemm_small(DT dt, const GemmSmallArgs& g, cudaStream_t s) {
  if (!gemm_small_supported(dt, g.m, g.n, g.k, g.bn, g.split) || g.act < 0 || g.act > 2) return cudaErrorInvalidValue;
  for (const void* p : {g.a, g.wt, g.bias, g.c, static_cast<const void*>(g.d)}) {
    if (p != nullptr && !aligned_to(p, 16)) return cudaErrorInvalidValue;
  }
  return dt == DT::kF16 ? launch_dt<__half>(g, s) : launch_dt<__nv_bfloat16>(g, s);
}

}  // namespace kiln::cuda::k
