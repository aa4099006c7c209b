// Fused attention (kernels.h), flash-attention-2 style: one CTA per (64 queries, head, batch),
// four warps of 16 query rows. Per 64-key step, S = Q.K^T runs on tensor cores (mma.sync
// m16n8k16, f32 accumulate) straight into registers; the online softmax (running max m, running
// sum l, rescale of the f32 output accumulator by exp(m_old - m_new)) works on those registers,
// a row's values spread over one quad of lanes; the probabilities are repacked in registers as
// the A operand of O += P.V. K and V are staged in shared memory as [key][d] by cp.async, double
// buffered so the next 64 keys stream in while this tile computes; K fragments are 32-bit shared
// loads, V's (transposed) come from ldmatrix.trans; a 72-element pitch keeps both conflict-free.
// Nothing of size S x S reaches global memory; Q, K, V, O are addressed through strides, so
// [B,S,H,D] projection outputs are consumed in place.
// (Fragment layouts: mma.cuh.)
#include <cmath>
#include <type_traits>

#include "backends/cuda/kernels/mma.cuh"

namespace kiln::cuda::k {

namespace {

constexpr int kD = 64;              // head dim
constexpr int kTile = 64;           // queries per CTA, keys per step
constexpr int kWarps = kTile / 16;  // 16 query rows per warp
constexpr int kThreads = kWarps * 32;
constexpr int kLd = kD + 8;         // shared pitch in elements (144 bytes: 36 words, conflict-free)

struct NoMask {};  // the mask type of a launch without one

__device__ __forceinline__ float mask1(const float* p) { return *p; }
__device__ __forceinline__ float mask1(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float mask1(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ float2 mask2(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ float2 mask2(const __half* p) { return __half22float2(*reinterpret_cast<const __half2*>(p)); }
__device__ __forceinline__ float2 mask2(const __nv_bfloat16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}

__device__ __forceinline__ uint32_t pack(float lo, float hi, __half) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}
__device__ __forceinline__ uint32_t pack(float lo, float hi, __nv_bfloat16) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

__device__ __forceinline__ uint32_t ld32(const void* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Starts copying 64 rows x kD from src (row stride `stride` elements) into tile[row][d]; rows past
// count are zero-filled. Consecutive threads take consecutive 16-byte chunks of a row (coalesced).
template <class T>
__device__ __forceinline__ void load_rows_async(T* tile, const T* src, int64_t stride, int count) {
  constexpr int kChunks = kD / 8;  // 16-byte chunks per row
  for (int idx = int(threadIdx.x); idx < kTile * kChunks; idx += kThreads) {
    int row = idx / kChunks, ch = idx % kChunks;
    bool in = row < count;
    cp_async16(tile + row * kLd + ch * 8, in ? src + row * stride + ch * 8 : src, in ? 16 : 0);
  }
}

// M: the additive mask's element type, NoMask without one. `pairs`: the mask's keys are contiguous
// and pair-aligned, so a lane's two adjacent keys are one 2-element load.
// Blocks per SM: the mask's registers make 4 spill; measured on the H100 (2026-11-23): masked
// BERT/GPT-2 layers 46-48 us at 3 vs 50-53 us at 4, unmasked ViT 307 us at 4 vs 327 us at 3.
template <class T, class M>
__global__ void __launch_bounds__(kThreads, std::is_same_v<M, NoMask> ? 4 : 3) attention_kernel(const T* __restrict__ q, const T* __restrict__ k,
                                                                const T* __restrict__ v, const void* __restrict__ mask,
                                                                bool pairs, T* __restrict__ o, AttentionShape sh,
                                                                float scale) {
  constexpr bool kMasked = !std::is_same_v<M, NoMask>;
  // K and V double-buffered: the next key tile streams in (cp.async) while this one is used.
  __shared__ __align__(16) T qs[kTile * kLd];
  __shared__ __align__(16) T ks[2][kTile * kLd];
  __shared__ __align__(16) T vs[2][kTile * kLd];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane >> 2, t = lane & 3;
  const int b = int(blockIdx.z), h = int(blockIdx.y), q0 = int(blockIdx.x) * kTile;
  const T* kb = k + b * sh.k[0] + h * sh.k[1];
  const T* vb = v + b * sh.v[0] + h * sh.v[1];
  load_rows_async(qs, q + b * sh.q[0] + h * sh.q[1] + q0 * sh.q[2], sh.q[2], min(kTile, sh.sq - q0));
  load_rows_async(ks[0], kb, sh.k[2], min(kTile, sh.sk));
  load_rows_async(vs[0], vb, sh.v[2], min(kTile, sh.sk));
  cp_async_commit();
  const int row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  int64_t mrow[2];
  for (int r = 0; r < 2; ++r) {  // rows past the end read row sq-1's mask (their results are dropped)
    mrow[r] = int64_t(b) * sh.m[0] + int64_t(h) * sh.m[1] + int64_t(min(row[r], sh.sq - 1)) * sh.m[2];
  }
  float acc[kD / 8][4] = {};  // O: 8 column tiles of 8
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};  // l: this lane's partial sums
  uint32_t qa[kD / 16][4];  // this warp's 16 query rows as A fragments, for the whole loop
  const int tiles = (sh.sk + kTile - 1) / kTile;

  for (int j = 0; j < tiles; ++j) {
    const int j0 = j * kTile, buf = j & 1;
    // This tile's mask values for the lane's keys (2t, 2t+1 of each 8) and rows (g, g+8), requested
    // before the K/V wait so their latency hides behind it.
    float2 mk[kTile / 8][2];
    if constexpr (kMasked) {
      const M* mp = static_cast<const M*>(mask);
#pragma unroll
      for (int nt = 0; nt < kTile / 8; ++nt) {
        const int key = j0 + nt * 8 + 2 * t;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const M* p = mp + mrow[r] + int64_t(key) * sh.m[3];
          if (pairs) {
            mk[nt][r] = key < sh.sk ? mask2(p) : make_float2(0.0f, 0.0f);
          } else {
            mk[nt][r].x = key < sh.sk ? mask1(p) : 0.0f;
            mk[nt][r].y = key + 1 < sh.sk ? mask1(p + sh.m[3]) : 0.0f;
          }
        }
      }
    }
    if (j + 1 < tiles) {  // the next tile into the other buffer, freed by the last iteration's barrier
      int next = min(kTile, sh.sk - j0 - kTile);
      load_rows_async(ks[buf ^ 1], kb + (j0 + kTile) * sh.k[2], sh.k[2], next);
      load_rows_async(vs[buf ^ 1], vb + (j0 + kTile) * sh.v[2], sh.v[2], next);
      cp_async_commit();
      cp_async_wait<1>();  // everything but that newest group has landed
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (j == 0) {
      const T* qw = qs + warp * 16 * kLd;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        qa[kk][0] = ld32(qw + g * kLd + kk * 16 + 2 * t);
        qa[kk][1] = ld32(qw + (g + 8) * kLd + kk * 16 + 2 * t);
        qa[kk][2] = ld32(qw + g * kLd + kk * 16 + 8 + 2 * t);
        qa[kk][3] = ld32(qw + (g + 8) * kLd + kk * 16 + 8 + 2 * t);
      }
    }
    const T* kt = ks[buf];
    const T* vt = vs[buf];

    float s[kTile / 8][4];  // S: 8 key tiles of 8
#pragma unroll
    for (int nt = 0; nt < kTile / 8; ++nt) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
      const T* kr = kt + (nt * 8 + g) * kLd + 2 * t;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) mma(s[nt], qa[kk], ld32(kr + kk * 16), ld32(kr + kk * 16 + 8), T());
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < kTile / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int r = e >> 1, key = j0 + nt * 8 + 2 * t + (e & 1);
        float x = -INFINITY;
        if (key < sh.sk) {
          x = s[nt][e] * scale;
          if constexpr (kMasked) x += (e & 1) ? mk[nt][r].y : mk[nt][r].x;
        }
        s[nt][e] = x;
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
      alpha[r] = __expf(m_run[r] - base[r]);
      m_run[r] = m_new;
      l_run[r] *= alpha[r];
    }
#pragma unroll
    for (int nt = 0; nt < kTile / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float p = __expf(s[nt][e] - base[e >> 1]);
        s[nt][e] = p;
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
    for (int kk = 0; kk < kTile / 16; ++kk) {  // O += P . V, P straight from the S registers
      uint32_t pa[4] = {pack(s[2 * kk][0], s[2 * kk][1], T()), pack(s[2 * kk][2], s[2 * kk][3], T()),
                        pack(s[2 * kk + 1][0], s[2 * kk + 1][1], T()), pack(s[2 * kk + 1][2], s[2 * kk + 1][3], T())};
      // V's B fragments (key-major in shared memory) through ldmatrix.trans, two 8-wide d tiles at a time:
      // matrices {keys 0-7, keys 8-15} x {d tile 2dp, 2dp+1}.
      const int mi = lane >> 3;
      const T* vrow = vt + (kk * 16 + (mi & 1) * 8 + (lane & 7)) * kLd + (mi >> 1) * 8;
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

  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = l_run[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    inv[r] = 1.0f / l;  // 0 / 0 = NaN for a fully masked row, as the unfused softmax gives
  }
  // O goes out through this warp's 16 rows of qs (read only at j == 0, by this warp alone): the
  // fragments' 4-byte pieces become whole 16-byte chunks per lane, 128 contiguous bytes per row,
  // instead of half-used 32-byte sectors (ncu, BERT b64: 16 of 32 bytes per sector stored).
  T* ow = qs + warp * 16 * kLd;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt) {
      *reinterpret_cast<uint32_t*>(ow + (g + 8 * r) * kLd + dt * 8 + 2 * t) =
          pack(acc[dt][2 * r] * inv[r], acc[dt][2 * r + 1] * inv[r], T());
    }
  }
  __syncwarp();
  constexpr int kChunks = kD / 8;  // 16-byte chunks per row
#pragma unroll
  for (int i = lane; i < 16 * kChunks; i += 32) {
    const int rr = i / kChunks, ch = i % kChunks, qrow = q0 + warp * 16 + rr;
    if (qrow >= sh.sq) continue;
    *reinterpret_cast<uint4*>(o + b * sh.o[0] + h * sh.o[1] + int64_t(qrow) * sh.o[2] + ch * 8) =
        *reinterpret_cast<const uint4*>(ow + rr * kLd + ch * 8);
  }
}

template <class T, class M>
cudaError_t launch(const void* q, const void* k, const void* v, const void* mask, void* o, const AttentionShape& sh,
                   float scale, cudaStream_t s) {
  bool pairs = false;
  if constexpr (!std::is_same_v<M, NoMask>) {
    pairs = sh.m[3] == 1 && sh.sk % 2 == 0 && sh.m[0] % 2 == 0 && sh.m[1] % 2 == 0 && sh.m[2] % 2 == 0 &&
            reinterpret_cast<uintptr_t>(mask) % (2 * sizeof(M)) == 0;
  }
  dim3 grid(unsigned((sh.sq + kTile - 1) / kTile), unsigned(sh.h), unsigned(sh.b));
  attention_kernel<T, M><<<grid, kThreads, 0, s>>>(static_cast<const T*>(q), static_cast<const T*>(k),
                                                   static_cast<const T*>(v), mask, pairs, static_cast<T*>(o), sh, scale);
  return cudaGetLastError();
}

template <class T>
cudaError_t launch_masked(const void* q, const void* k, const void* v, const void* mask, DT mask_dt, void* o,
                          const AttentionShape& sh, float scale, cudaStream_t s) {
  if (!mask) return launch<T, NoMask>(q, k, v, mask, o, sh, scale, s);
  switch (mask_dt) {
    case DT::kF16: return launch<T, __half>(q, k, v, mask, o, sh, scale, s);
    case DT::kBF16: return launch<T, __nv_bfloat16>(q, k, v, mask, o, sh, scale, s);
    case DT::kF32: return launch<T, float>(q, k, v, mask, o, sh, scale, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

bool attention_supported(DT dt, int head_dim) { return (dt == DT::kF16 || dt == DT::kBF16) && head_dim == kD; }

cudaError_t attention(DT dt, const void* q, const void* k, const void* v, const void* mask, DT mask_dt, void* o,
                      const AttentionShape& sh, float scale, cudaStream_t s) {
  if (!attention_supported(dt, sh.d) || sh.b < 1 || sh.h < 1 || sh.sq < 1 || sh.sk < 1 || sh.h > 65535 || sh.b > 65535) {
    return cudaErrorInvalidValue;
  }
  // O is written in 16-byte chunks of rows.
  if (reinterpret_cast<uintptr_t>(o) % 16 != 0 || sh.o[0] % 8 != 0 || sh.o[1] % 8 != 0 || sh.o[2] % 8 != 0) {
    return cudaErrorInvalidValue;
  }
  if (dt == DT::kF16) return launch_masked<__half>(q, k, v, mask, mask_dt, o, sh, scale, s);
  return launch_masked<__nv_bfloat16>(q, k, v, mask, mask_dt, o, sh, scale, s);
}

}  // namespace kiln::cuda::k
