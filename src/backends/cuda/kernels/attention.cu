// Fused attention (kernels.h), flash-attention-2 style: a CTA of four warps per (query block, head,
// batch). Per 64-key step, S = Q.K^T runs on tensor cores (mma.sync m16n8k16, f32 accumulate)
// straight into registers; the online softmax (running max m, running sum l, rescale of the f32
// output accumulator by exp(m_old - m_new)) works on those registers, a row's values
// spread over one quad of lanes; the probabilities are repacked in registers as the A operand of
// O += P.V. K and V are staged in shared memory as [key][d] by cp.async, double buffered so the
// next 64 keys stream in while this tile computes; K's fragments come from ldmatrix, V's
// (transposed) from ldmatrix.trans; a pitch of head dim + 8 elements keeps both conflict-free. Head
// dims 32 and 64 (a template parameter). A query block is 64 rows (a warp's 16 each) when the grid
// has at least a CTA per SM, else 16 rows with each key tile split over the four warps, whose
// softmax states merge at the end (attention_kernel).
// Nothing of size S x S reaches global memory; Q, K, V, O are addressed through strides, so
// [B,S,H,D] projection outputs are consumed in place.
// (Fragment layouts: mma.cuh.)
#include <cmath>
#include <type_traits>

#include "backends/cuda/kernels/mma.cuh"

namespace kiln::cuda::k {

namespace {

constexpr int kTile = 64;           // queries per CTA, keys per step
constexpr int kWarps = kTile / 16;  // 16 query rows per warp
constexpr int kThreads = kWarps * 32;
// Per head dim D (32 or 64): shared pitch D + 8 elements (144 bytes, 36 words, at 64; 80 bytes, 20
// words, at 32: 8 rows of ldmatrix land on distinct banks either way), D / 8 16-byte chunks per row.
template <int D>
struct Head {
  static constexpr int kLd = D + 8, kChunks = D / 8;
  static constexpr int kRowsPerPass = kThreads / kChunks;  // rows one pass of the CTA covers
};

struct NoMask {};  // the mask type of a launch without one

__device__ __forceinline__ uint32_t pack(float lo, float hi, __half) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}
__device__ __forceinline__ uint32_t pack(float lo, float hi, __nv_bfloat16) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

__device__ __forceinline__ uint32_t ld32(const void* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Copies of 64 rows x D into a [row][d] tile: thread x moves the 16-byte chunk x % (D / 8) of rows
// x / (D / 8) + i * rows-per-pass, so consecutive threads take consecutive chunks of a row
// (coalesced). `src` is this thread's first chunk (row x / (D / 8) of the tile's first row), `stride`
// the source's row stride; rows past `count` are zero-filled (their source address is never read).
template <int D, class T>
__device__ __forceinline__ void load_rows_async(T* tile, const T* src, int64_t stride, int count) {
  constexpr int kLd = Head<D>::kLd, kChunks = Head<D>::kChunks, kRowsPerPass = Head<D>::kRowsPerPass;
  const int r0 = int(threadIdx.x) / kChunks;
  T* dst = tile + r0 * kLd + (int(threadIdx.x) % kChunks) * 8;
#pragma unroll
  for (int i = 0; i < kTile / kRowsPerPass; ++i) {
    const bool in = r0 + i * kRowsPerPass < count;
    cp_async16(dst + i * kRowsPerPass * kLd, in ? src + i * kRowsPerPass * stride : src, in ? 16 : 0);
  }
}

// 2^x in one instruction (MUFU.EX2); 2^-inf = 0.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

constexpr float kLog2e = 1.4426950408889634f;

// Read-only global loads as volatile asm: they stay where they are written, ahead of the K/V wait,
// so their latency hides behind it (as plain loads the compiler sank them to their use under the
// register cap, and the kernel stalled on them: bench/RESULTS.md, "(eighth session) — attention
// kernel rework, LayerNorm register/latency choice, MobileNetV2 b256 vs max-autotune (issue 4)").
__device__ __forceinline__ uint16_t ldg16(const void* p) {
  uint16_t r;
  asm volatile("ld.global.nc.b16 %0, [%1];" : "=h"(r) : "l"(p));
  return r;
}
__device__ __forceinline__ uint32_t ldg32(const void* p) {
  uint32_t r;
  asm volatile("ld.global.nc.b32 %0, [%1];" : "=r"(r) : "l"(p));
  return r;
}
__device__ __forceinline__ uint2 ldg64(const void* p) {
  uint2 r;
  asm volatile("ld.global.nc.v2.b32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
  return r;
}

// A lane's two adjacent mask values as held between their load and their use: the 16-bit types
// stay packed in one register (the f32 conversion happens at the use), f32 ones are two. Keys
// that are not loaded read as 0.
template <class M>
struct MaskPair {
  uint2 v;
  __device__ __forceinline__ void load(const M* p, int64_t stride, bool lo, bool hi) {
    v.x = lo ? ldg32(p) : 0u;
    v.y = hi ? ldg32(p + stride) : 0u;
  }
  __device__ __forceinline__ void load2(const M* p) { v = ldg64(p); }
  __device__ __forceinline__ void load_shared(const M* p) { v = *reinterpret_cast<const uint2*>(p); }
  __device__ __forceinline__ float2 get() const { return make_float2(__uint_as_float(v.x), __uint_as_float(v.y)); }
};
template <class H, class H2>
struct MaskPair16 {
  uint32_t v;
  __device__ __forceinline__ void load(const H* p, int64_t stride, bool lo, bool hi) {
    const uint32_t a = lo ? ldg16(p) : 0u, b = hi ? ldg16(p + stride) : 0u;
    v = a | (b << 16);
  }
  __device__ __forceinline__ void load2(const H* p) { v = ldg32(p); }
  __device__ __forceinline__ void load_shared(const H* p) { v = *reinterpret_cast<const uint32_t*>(p); }
  __device__ __forceinline__ float2 get() const {
    const H2 h = *reinterpret_cast<const H2*>(&v);
    if constexpr (std::is_same_v<H, __half>) return __half22float2(h);
    else return __bfloat1622float2(h);
  }
};
template <>
struct MaskPair<__half> : MaskPair16<__half, __half2> {};
template <>
struct MaskPair<__nv_bfloat16> : MaskPair16<__nv_bfloat16, __nv_bfloat162> {};

// A tile's additive mask for this lane: keys 2t, 2t+1 of the groups of 8 keys nt0 .. nt0 + N - 1,
// rows g and g + 8. `mr` are the two rows' pointers at this tile's first key plus 2t keys; `lim`
// keys of the tile are valid (>= kTile: all); keys past it read as 0 (their scores are -inf
// anyway). kPairs: the keys are contiguous and pair-aligned (one 2-element load); `one_row`: both
// rows read the same mask row (a mask broadcast over queries), loaded once.
template <int N, bool kPairs, class M>
__device__ __forceinline__ void load_mask(MaskPair<M> (&mk)[N][2], const M* const (&mr)[2], int64_t key_stride,
                                          int nt0, int lim, int t, bool one_row) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int key = (nt0 + i) * 8 + 2 * t;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (r == 1 && one_row) {
        mk[i][1] = mk[i][0];
      } else if constexpr (kPairs) {
        if (key < lim) mk[i][r].load2(mr[r] + (nt0 + i) * 8);
        else mk[i][r].load(mr[r], 0, false, false);
      } else {
        mk[i][r].load(mr[r] + int64_t((nt0 + i) * 8) * key_stride, key_stride, key < lim, key + 1 < lim);
      }
    }
  }
}

// M: the additive mask's element type, NoMask without one. kPairs: see load_mask. kRow: the mask is
// one row of contiguous keys per (batch, head), broadcast over the queries (a [B,1,1,Sk] padding
// mask), and each tile's piece of it is staged in shared memory by the K/V copies instead of read by
// every lane from global memory (the report says "+row mask"), where the per-lane loads left the
// kernel stalled on memory and spilling at 4 blocks/SM (bench/RESULTS.md, "Attention: a one-row mask
// staged in shared memory (5e391dd) — BERT does not take it"). BERT's padding mask, which
// transformers exports broadcast over the queries, takes this path once the narrow-masks pass has
// cut its chain to one row per key (bench/RESULTS.md, "narrow-masks (91b1848)").
// kQW: warps along the queries (16 rows each); the other 4 / kQW warps split every key tile between
// them (kKW groups of 64 / kKW keys) and their partial softmax states merge at the end. kQW = 4 (64
// queries per CTA, every warp sees every key) when there are CTAs enough to fill the GPU; kQW = 1
// for few heads x queries (batch 1: 12 heads x 2 tiles of 64 are 24 CTAs on 132 SMs), where the
// per-warp chain of dependent steps over the keys is what takes the time.
// Blocks per SM: 4 (128 registers) without a mask and with pair-loaded masks (24 bytes spilled,
// still faster than 3 blocks on BERT: bench/RESULTS.md, "(eighth session) — attention kernel
// rework, LayerNorm register/latency choice, MobileNetV2 b256 vs max-autotune (issue 4)"); 3 for
// element-wise masks, which spill 88 bytes at 4 (on the earlier kernel masked layers were faster at
// 3 and unmasked ones at 4: bench/RESULTS.md, "(third session) — all five models ahead of eager and
// torch.compile (issues 3, 4)").
template <class T, class M, bool kPairs, int kQW, bool kRow, int D>
__global__ void __launch_bounds__(kThreads, std::is_same_v<M, NoMask> || kPairs ? 4 : 3)
    attention_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                     const void* __restrict__ mask, T* __restrict__ o, AttentionShape sh, float scale) {
  constexpr int kD = D, kLd = Head<D>::kLd, kChunks = Head<D>::kChunks;
  constexpr bool kMasked = !std::is_same_v<M, NoMask>;
  constexpr int kKW = kWarps / kQW;         // warps sharing a query row block, each on its own keys
  constexpr int kNT = kTile / 8 / kKW;      // groups of 8 keys per warp per tile
  constexpr int kQRows = 16 * kQW;          // queries per CTA
  static_assert(kNT % 2 == 0, "P.V takes keys 16 at a time");
  // K and V double-buffered: the next key tile streams in (cp.async) while this one is used.
  __shared__ __align__(16) T qs[kTile * kLd];
  __shared__ __align__(16) T ks[2][kTile * kLd];
  __shared__ __align__(16) T vs[2][kTile * kLd];
  constexpr int kRowBytes = kRow ? kTile * int(sizeof(M)) : 16;
  __shared__ __align__(16) unsigned char ms[2][kRowBytes];  // kRow: the tile's mask values
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane >> 2, t = lane & 3;
  const int qw = warp % kQW, kw = warp / kQW, nt0 = kw * kNT;
  const int b = int(blockIdx.z), h = int(blockIdx.y), q0 = int(blockIdx.x) * kQRows;
  pdl_wait();               // launched with programmatic serialization: q, k, v are the previous kernel's
  pdl_launch_dependents();  // the output projection may start (and stream its weight)
  // This thread's copy chunk of K/V row 0 (load_rows_async), advanced one tile per step.
  const int r0 = int(threadIdx.x) / kChunks, c0 = (int(threadIdx.x) % kChunks) * 8;
  const T* kp = k + b * sh.k[0] + h * sh.k[1] + r0 * sh.k[2] + c0;
  const T* vp = v + b * sh.v[0] + h * sh.v[1] + r0 * sh.v[2] + c0;
  load_rows_async<D>(qs, q + b * sh.q[0] + h * sh.q[1] + (q0 + r0) * sh.q[2] + c0, sh.q[2],
                  min(kQRows, sh.sq - q0));
  load_rows_async<D>(ks[0], kp, sh.k[2], min(kTile, sh.sk));
  load_rows_async<D>(vs[0], vp, sh.v[2], min(kTile, sh.sk));
  // kRow: the mask's 16-byte chunks of keys [key0, key0 + kTile), those at or past `lim` keys zero-filled.
  const M* mrow = nullptr;
  auto load_mask_row = [&](unsigned char* dst, int key0, int lim) {
    if constexpr (kRow) {
      constexpr int kPer = 16 / int(sizeof(M));
      const int c = int(threadIdx.x), valid = min(kPer, lim - c * kPer);
      if (c < kTile / kPer) cp_async16(dst + c * 16, valid > 0 ? mrow + key0 + c * kPer : mrow, valid > 0 ? valid * int(sizeof(M)) : 0);
    }
  };
  if constexpr (kRow) {
    mrow = static_cast<const M*>(mask) + int64_t(b) * sh.m[0] + int64_t(h) * sh.m[1];
    load_mask_row(ms[0], 0, sh.sk);
  }
  cp_async_commit();
  const M* mr[2] = {};  // the lane's two rows of the mask at key 2t; rows past the end read row sq-1's
  bool one_row = true;
  if constexpr (kMasked && !kRow) {
    const M* mp = static_cast<const M*>(mask) + int64_t(b) * sh.m[0] + int64_t(h) * sh.m[1] + int64_t(2 * t) * sh.m[3];
    for (int r = 0; r < 2; ++r) mr[r] = mp + int64_t(min(q0 + qw * 16 + g + 8 * r, sh.sq - 1)) * sh.m[2];
    one_row = sh.m[2] == 0;
  }
  float acc[kD / 8][4] = {};  // O: 8 column tiles of 8
  // Running max and this lane's partial sums of rows g, g + 8.
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  uint32_t qa[kD / 16][4];  // this warp's 16 query rows as A fragments, for the whole loop
  const int tiles = (sh.sk + kTile - 1) / kTile;

  for (int j = 0; j < tiles; ++j) {
    const int j0 = j * kTile, buf = j & 1, lim = sh.sk - j0;
    // This tile's mask values, requested before the K/V wait so their latency hides behind it.
    MaskPair<M> mk[kNT][2];
    if constexpr (kMasked && !kRow) {
      load_mask<kNT, kPairs>(mk, mr, sh.m[3], nt0, lim, t, one_row);
      for (int r = 0; r < 2; ++r) mr[r] += int64_t(kTile) * sh.m[3];
    }
    if (j + 1 < tiles) {  // the next tile into the other buffer, freed by the last iteration's barrier
      kp += kTile * sh.k[2];
      vp += kTile * sh.v[2];
      load_rows_async<D>(ks[buf ^ 1], kp, sh.k[2], min(kTile, lim - kTile));
      load_rows_async<D>(vs[buf ^ 1], vp, sh.v[2], min(kTile, lim - kTile));
      load_mask_row(ms[buf ^ 1], j0 + kTile, lim - kTile);
      cp_async_commit();
      cp_async_wait<1>();  // everything but that newest group has landed
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (j == 0) {
      const T* qwp = qs + qw * 16 * kLd;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        qa[kk][0] = ld32(qwp + g * kLd + kk * 16 + 2 * t);
        qa[kk][1] = ld32(qwp + (g + 8) * kLd + kk * 16 + 2 * t);
        qa[kk][2] = ld32(qwp + g * kLd + kk * 16 + 8 + 2 * t);
        qa[kk][3] = ld32(qwp + (g + 8) * kLd + kk * 16 + 8 + 2 * t);
      }
    }
    const T* kt = ks[buf];
    const T* vt = vs[buf];

    // S = Q . K^T over this warp's keys. K's B fragments (key-major: non-transposed) through
    // ldmatrix, four 8x8 matrices at a time: 8 keys x d {0-7, 8-15, 16-23, 24-31} of a 32-wide half.
    float s[kNT][4];
    const T* krow = kt + (nt0 * 8 + (lane & 7)) * kLd + (lane >> 3) * 8;
#pragma unroll
    for (int i = 0; i < kNT; ++i) {
      s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
      for (int kh = 0; kh < kD / 32; ++kh) {
        uint32_t bk[4];
        ldmatrix_x4(bk, krow + i * 8 * kLd + kh * 32);
        mma(s[i], qa[2 * kh], bk[0], bk[1], T());
        mma(s[i], qa[2 * kh + 1], bk[2], bk[3], T());
      }
    }
    // x = s * scale + mask; keys past the end -inf. e^(x - m) = 2^((x - m) log2(e)), one MUFU.EX2
    // per score. Not as 2^(x log2(e) - m log2(e)) (one instruction less): m log2(e) overflows to inf
    // for masks near the float minimum (HF's finfo(bf16/f32).min, -3.4e38), and a key group that
    // saw only such keys would then turn its row into NaN.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < kNT; ++i) {
      float2 mv[2];
      if constexpr (kRow) {
        MaskPair<M> p;
        p.load_shared(reinterpret_cast<const M*>(ms[buf]) + (nt0 + i) * 8 + 2 * t);
        mv[0] = mv[1] = p.get();
      } else if constexpr (kMasked) {
        mv[0] = mk[i][0].get();
        mv[1] = mk[i][1].get();
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        float x;
        if constexpr (kMasked) x = fmaf(s[i][e], scale, (e & 1) ? mv[r].y : mv[r].x);
        else x = s[i][e] * scale;
        if (lim < kTile && (nt0 + i) * 8 + 2 * t + (e & 1) >= lim) x = -INFINITY;
        s[i][e] = x;
        mx[r] = fmaxf(mx[r], x);
      }
    }
    float alpha[2], base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      float m_new = fmaxf(m_run[r], mx[r]);
      base[r] = m_new == -INFINITY ? 0.0f : m_new;  // a row masked so far stays all-zero
      alpha[r] = exp2_approx((m_run[r] - base[r]) * kLog2e);
      m_run[r] = m_new;
      l_run[r] *= alpha[r];
    }
#pragma unroll
    for (int i = 0; i < kNT; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float p = exp2_approx((s[i][e] - base[e >> 1]) * kLog2e);
        s[i][e] = p;
        l_run[e >> 1] += p;
      }
    }
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt) {
      acc[dt][0] *= alpha[0];
      acc[dt][1] *= alpha[0];
      acc[dt][2] *= alpha[1];
      acc[dt][3] *= alpha[1];
    }
#pragma unroll
    for (int kk = 0; kk < kNT / 2; ++kk) {  // O += P . V, P straight from the S registers
      uint32_t pa[4] = {pack(s[2 * kk][0], s[2 * kk][1], T()), pack(s[2 * kk][2], s[2 * kk][3], T()),
                        pack(s[2 * kk + 1][0], s[2 * kk + 1][1], T()), pack(s[2 * kk + 1][2], s[2 * kk + 1][3], T())};
      // V's B fragments (key-major in shared memory) through ldmatrix.trans, two 8-wide d tiles at a time:
      // matrices {keys 0-7, keys 8-15} x {d tile 2dp, 2dp+1}.
      const int mi = lane >> 3;
      const T* vrow = vt + (nt0 * 8 + kk * 16 + (mi & 1) * 8 + (lane & 7)) * kLd + (mi >> 1) * 8;
#pragma unroll
      for (int dp = 0; dp < kD / 16; ++dp) {
        uint32_t bv[4];
        ldmatrix_x4_trans(bv, vrow + dp * 16);
        mma(acc[2 * dp], pa, bv[0], bv[1], T());
        mma(acc[2 * dp + 1], pa, bv[2], bv[3], T());
      }
    }
    __syncthreads();  // this buffer is refilled by the next iteration's prefetch
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  if constexpr (kKW > 1) {
    // Merge the key groups' states into the first group's warp: the others leave (m, l, O) in the
    // K buffers (free after the loop's last barrier) as [slot][value][lane], conflict-free.
    constexpr int kVals = 4 + kD / 2;
    static_assert((kKW - 1) * kQW * kVals * 32 * sizeof(float) <= sizeof(ks), "merge scratch");
    float* part = reinterpret_cast<float*>(&ks[0][0]);
    if (kw > 0) {
      float* my = part + ((kw - 1) * kQW + qw) * kVals * 32 + lane;
      my[0] = m_run[0];
      my[32] = m_run[1];
      my[64] = l_run[0];
      my[96] = l_run[1];
#pragma unroll
      for (int dt = 0; dt < kD / 8; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) my[(4 + dt * 4 + e) * 32] = acc[dt][e];
    }
    __syncthreads();
    if (kw > 0) return;
    float mo[kKW - 1][2];
    float mtot[2] = {m_run[0], m_run[1]};
#pragma unroll
    for (int w = 0; w < kKW - 1; ++w) {
      const float* ot = part + (w * kQW + qw) * kVals * 32 + lane;
      mo[w][0] = ot[0];
      mo[w][1] = ot[32];
      mtot[0] = fmaxf(mtot[0], mo[w][0]);
      mtot[1] = fmaxf(mtot[1], mo[w][1]);
    }
    // Weights 2^((m_w - M) log2 e); a group that saw only masked keys (m_w = -inf) weighs 0.
    float f[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      f[r] = m_run[r] == -INFINITY ? 0.0f : exp2_approx((m_run[r] - mtot[r]) * kLog2e);
      l_run[r] *= f[r];
    }
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[dt][e] *= f[e >> 1];
#pragma unroll
    for (int w = 0; w < kKW - 1; ++w) {
      const float* ot = part + (w * kQW + qw) * kVals * 32 + lane;
      float fw[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        fw[r] = mo[w][r] == -INFINITY ? 0.0f : exp2_approx((mo[w][r] - mtot[r]) * kLog2e);
        l_run[r] += fw[r] * ot[(2 + r) * 32];
      }
#pragma unroll
      for (int dt = 0; dt < kD / 8; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[dt][e] += fw[e >> 1] * ot[(4 + dt * 4 + e) * 32];
    }
  }

  // A row whose every key is masked (-inf) summed no weight: zeros, as ONNX Attention specifies
  // (the unfused softmax would give 0 / 0). A NaN sum stays NaN.
  const float inv[2] = {l_run[0] == 0.0f ? 0.0f : 1.0f / l_run[0], l_run[1] == 0.0f ? 0.0f : 1.0f / l_run[1]};
  // O goes out through this warp's 16 rows of qs (read only at j == 0, by this warp alone): the
  // fragments' 4-byte pieces become whole 16-byte chunks per lane, 128 contiguous bytes per row,
  // instead of half-used 32-byte sectors (bench/RESULTS.md, "(sixth session) — generated elementwise
  // kernels, attention/LayerNorm tuning, a small-M GEMM that lost (issue 4)").
  T* ow = qs + qw * 16 * kLd;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt) {
      *reinterpret_cast<uint32_t*>(ow + (g + 8 * r) * kLd + dt * 8 + 2 * t) =
          pack(acc[dt][2 * r] * inv[r], acc[dt][2 * r + 1] * inv[r], T());
    }
  }
  __syncwarp();
#pragma unroll
  for (int i = lane; i < 16 * kChunks; i += 32) {
    const int rr = i / kChunks, ch = i % kChunks, qrow = q0 + qw * 16 + rr;
    if (qrow >= sh.sq) continue;
    *reinterpret_cast<uint4*>(o + b * sh.o[0] + h * sh.o[1] + int64_t(qrow) * sh.o[2] + ch * 8) =
        *reinterpret_cast<const uint4*>(ow + rr * kLd + ch * 8);
  }
}

template <class T, class M, bool kPairs, int kQW, bool kRow, int D>
cudaError_t launch_qw(const void* q, const void* k, const void* v, const void* mask, void* o, const AttentionShape& sh,
                      float scale, cudaStream_t s) {
  constexpr int rows = 16 * kQW;
  dim3 grid(unsigned((sh.sq + rows - 1) / rows), unsigned(sh.h), unsigned(sh.b));
  return launch_pdl(sh.pdl, attention_kernel<T, M, kPairs, kQW, kRow, D>, grid, dim3(kThreads), s, static_cast<const T*>(q),
                    static_cast<const T*>(k), static_cast<const T*>(v), mask, static_cast<T*>(o), sh, scale);
}

// 64 queries per CTA when that gives at least one CTA per SM, else 16 with the keys split four ways.
bool few_ctas(const AttentionShape& sh) { return int64_t(sh.b) * sh.h * ((sh.sq + kTile - 1) / kTile) < sm_count(); }

template <class T, class M, int D, bool kPairs, bool kRow = false>
cudaError_t launch_pairs(const void* q, const void* k, const void* v, const void* mask, void* o, const AttentionShape& sh,
                         float scale, cudaStream_t s) {
  if (few_ctas(sh)) return launch_qw<T, M, kPairs, 1, kRow, D>(q, k, v, mask, o, sh, scale, s);
  return launch_qw<T, M, kPairs, kWarps, kRow, D>(q, k, v, mask, o, sh, scale, s);
}

// A mask broadcast over the queries with contiguous keys, its (batch, head) rows 16-byte multiples apart.
bool row_mask_strides(const AttentionShape& sh, size_t elem_bytes) {
  const int64_t e = int64_t(elem_bytes);
  return sh.m[3] == 1 && sh.m[2] == 0 && sh.sk % 2 == 0 && (sh.m[0] * e) % 16 == 0 && (sh.m[1] * e) % 16 == 0;
}

template <class T, class M, int D>
cudaError_t launch(const void* q, const void* k, const void* v, const void* mask, void* o, const AttentionShape& sh,
                   float scale, cudaStream_t s) {
  if constexpr (!std::is_same_v<M, NoMask>) {
    const bool pairs = sh.m[3] == 1 && sh.sk % 2 == 0 && sh.m[0] % 2 == 0 && sh.m[1] % 2 == 0 && sh.m[2] % 2 == 0 &&
                       reinterpret_cast<uintptr_t>(mask) % (2 * sizeof(M)) == 0;
    // One row per (batch, head) whose 16-byte chunks can be copied as they are: staged (kRow). Implies `pairs`.
    const bool row = row_mask_strides(sh, sizeof(M)) && reinterpret_cast<uintptr_t>(mask) % 16 == 0;
    if (row) return launch_pairs<T, M, D, true, true>(q, k, v, mask, o, sh, scale, s);
    if (pairs) return launch_pairs<T, M, D, true>(q, k, v, mask, o, sh, scale, s);
  }
  return launch_pairs<T, M, D, false>(q, k, v, mask, o, sh, scale, s);
}

template <class T, int D>
cudaError_t launch_masked(const void* q, const void* k, const void* v, const void* mask, DT mask_dt, void* o,
                          const AttentionShape& sh, float scale, cudaStream_t s) {
  if (!mask) return launch<T, NoMask, D>(q, k, v, mask, o, sh, scale, s);
  switch (mask_dt) {
    case DT::kF16: return launch<T, __half, D>(q, k, v, mask, o, sh, scale, s);
    case DT::kBF16: return launch<T, __nv_bfloat16, D>(q, k, v, mask, o, sh, scale, s);
    case DT::kF32: return launch<T, float, D>(q, k, v, mask, o, sh, scale, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

bool attention_supported(DT dt, int head_dim) {
  return (dt == DT::kF16 || dt == DT::kBF16) && (head_dim == 64 || head_dim == 32);
}

bool attention_row_mask(const AttentionShape& sh, DT mask_dt) {
  return (mask_dt == DT::kF16 || mask_dt == DT::kBF16 || mask_dt == DT::kF32) && row_mask_strides(sh, size_t(dt_size(mask_dt)));
}

cudaError_t attention(DT dt, const void* q, const void* k, const void* v, const void* mask, DT mask_dt, void* o,
                      const AttentionShape& sh, float scale, cudaStream_t s) {
  if (!attention_supported(dt, sh.d) || sh.b < 1 || sh.h < 1 || sh.sq < 1 || sh.sk < 1 || sh.h > 65535 || sh.b > 65535) {
    return cudaErrorInvalidValue;
  }
  // O is written in 16-byte chunks of rows.
  if (reinterpret_cast<uintptr_t>(o) % 16 != 0 || sh.o[0] % 8 != 0 || sh.o[1] % 8 != 0 || sh.o[2] % 8 != 0) {
    return cudaErrorInvalidValue;
  }
  if (sh.d == 32) {
    if (dt == DT::kF16) return launch_masked<__half, 32>(q, k, v, mask, mask_dt, o, sh, scale, s);
    return launch_masked<__nv_bfloat16, 32>(q, k, v, mask, mask_dt, o, sh, scale, s);
  }
  if (dt == DT::kF16) return launch_masked<__half, 64>(q, k, v, mask, mask_dt, o, sh, scale, s);
  return launch_masked<__nv_bfloat16, 64>(q, k, v, mask, mask_dt, o, sh, scale, s);
}

}  // namespace kiln::cuda::k
