// Fused attention (kernels.h): one CTA per (64 queries, head, batch), four warps of 16 query rows.
// Per 64-key step: S = Q.K^T on tensor cores (WMMA, f32 accumulate) into shared memory; each
// warp's rows get scale + mask and an online-softmax update (running max m, running sum l, the
// f32 output accumulator rescaled by exp(m_old - m_new)); then O += P.V on tensor cores. Nothing
// of size S x S ever reaches global memory. Q, K, V and O are read and written through strides,
// so the [B,S,H,D] projection outputs are consumed in place.
#include <mma.h>

#include <cmath>

#include "backends/cuda/kernels/common.cuh"

namespace kiln::cuda::k {

namespace {

using namespace nvcuda;

constexpr int kD = 64;              // head dim
constexpr int kTile = 64;           // queries per CTA, keys per step
constexpr int kWarps = kTile / 16;  // 16 query rows per warp
constexpr int kThreads = kWarps * 32;
constexpr int kLdH = kD + 8;        // pitch (elements) of the half-precision tiles Q, K, V and P
constexpr int kLdF = kD + 4;        // pitch of the f32 tiles S and O (kTile == kD)

constexpr size_t kTileBytes = size_t(kTile) * kLdH * 2;
constexpr size_t kWarpBytes = 16 * kLdF * 4 * 2 + 16 * kLdH * 2 + 16 * 4 * 2;  // S, O, P, m, l
constexpr size_t kSmemBytes = 3 * kTileBytes + kWarps * kWarpBytes;

__device__ __forceinline__ float load_mask(const void* m, DT dt, int64_t i) {
  switch (dt) {
    case DT::kF16: return __half2float(static_cast<const __half*>(m)[i]);
    case DT::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(m)[i]);
    default: return static_cast<const float*>(m)[i];
  }
}

// rows x kD elements from src (row stride `stride` elements) into a kLdH-pitched tile; rows past
// `count` are zero.
template <class T>
__device__ __forceinline__ void load_tile(T* tile, const T* src, int64_t stride, int count) {
  constexpr int kChunks = kD / 8;  // 16-byte chunks per row
  for (int idx = int(threadIdx.x); idx < kTile * kChunks; idx += kThreads) {
    int row = idx / kChunks, ch = idx % kChunks;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row < count) v = *reinterpret_cast<const uint4*>(src + row * stride + ch * 8);
    *reinterpret_cast<uint4*>(tile + row * kLdH + ch * 8) = v;
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) attention_kernel(const T* __restrict__ q, const T* __restrict__ k,
                                                             const T* __restrict__ v, const void* __restrict__ mask,
                                                             DT mask_dt, T* __restrict__ o, AttentionShape sh,
                                                             float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);
  T* ks = reinterpret_cast<T*>(smem + kTileBytes);
  T* vs = reinterpret_cast<T*>(smem + 2 * kTileBytes);
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  unsigned char* wbase = smem + 3 * kTileBytes + size_t(warp) * kWarpBytes;
  float* s_w = reinterpret_cast<float*>(wbase);
  float* o_w = s_w + 16 * kLdF;
  T* p_w = reinterpret_cast<T*>(o_w + 16 * kLdF);
  float* m_w = reinterpret_cast<float*>(p_w + 16 * kLdH);
  float* l_w = m_w + 16;

  const int b = int(blockIdx.z), h = int(blockIdx.y), q0 = int(blockIdx.x) * kTile;
  const T* qb = q + b * sh.q[0] + h * sh.q[1];
  const T* kb = k + b * sh.k[0] + h * sh.k[1];
  const T* vb = v + b * sh.v[0] + h * sh.v[1];
  load_tile(qs, qb + q0 * sh.q[2], sh.q[2], min(kTile, sh.sq - q0));
  for (int i = lane; i < 16 * kLdF; i += 32) o_w[i] = 0.0f;
  if (lane < 16) {
    m_w[lane] = -INFINITY;
    l_w[lane] = 0.0f;
  }
  __syncthreads();
  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> qa[kD / 16];
  for (int kk = 0; kk < kD / 16; ++kk) wmma::load_matrix_sync(qa[kk], qs + warp * 16 * kLdH + kk * 16, kLdH);

  const int r = lane >> 1, half = lane & 1;  // softmax: two lanes per row, 32 columns each
  const int qi = q0 + warp * 16 + r;
  const bool row_ok = qi < sh.sq;
  const int64_t mrow = int64_t(b) * sh.m[0] + int64_t(h) * sh.m[1] + int64_t(qi) * sh.m[2];

  for (int j0 = 0; j0 < sh.sk; j0 += kTile) {
    __syncthreads();  // the previous step is done with ks / vs
    int count = min(kTile, sh.sk - j0);
    load_tile(ks, kb + j0 * sh.k[2], sh.k[2], count);
    load_tile(vs, vb + j0 * sh.v[2], sh.v[2], count);
    __syncthreads();

    for (int nb = 0; nb < kTile / 16; ++nb) {  // S = Q . K^T
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int kk = 0; kk < kD / 16; ++kk) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> kf;
        wmma::load_matrix_sync(kf, ks + nb * 16 * kLdH + kk * 16, kLdH);
        wmma::mma_sync(acc, qa[kk], kf, acc);
      }
      wmma::store_matrix_sync(s_w + nb * 16, acc, kLdF, wmma::mem_row_major);
    }
    __syncwarp();

    float* srow = s_w + r * kLdF + half * 32;
    float mx = -INFINITY;
    for (int c = 0; c < 32; ++c) {
      int key = j0 + half * 32 + c;
      float x = -INFINITY;
      if (key < sh.sk) {
        x = srow[c] * scale;
        if (mask && row_ok) x += load_mask(mask, mask_dt, mrow + int64_t(key) * sh.m[3]);
      }
      srow[c] = x;
      mx = fmaxf(mx, x);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_old = m_w[r], m_new = fmaxf(m_old, mx);
    const float base = m_new == -INFINITY ? 0.0f : m_new;  // a row masked so far stays all-zero
    const float alpha = __expf(m_old - base);
    float sum = 0.0f;
    T* prow = p_w + r * kLdH + half * 32;
    for (int c = 0; c < 32; ++c) {
      float p = __expf(srow[c] - base);
      sum += p;
      prow[c] = from_f<T>(p);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    float* orow = o_w + r * kLdF + half * 32;
    for (int c = 0; c < 32; ++c) orow[c] *= alpha;
    __syncwarp();
    if (half == 0) {
      m_w[r] = m_new;
      l_w[r] = l_w[r] * alpha + sum;
    }
    __syncwarp();

    for (int db = 0; db < kD / 16; ++db) {  // O += P . V
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, o_w + db * 16, kLdF, wmma::mem_row_major);
      for (int kk = 0; kk < kTile / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> pf;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> vf;
        wmma::load_matrix_sync(pf, p_w + kk * 16, kLdH);
        wmma::load_matrix_sync(vf, vs + kk * 16 * kLdH + db * 16, kLdH);
        wmma::mma_sync(acc, pf, vf, acc);
      }
      wmma::store_matrix_sync(o_w + db * 16, acc, kLdF, wmma::mem_row_major);
    }
    __syncwarp();
  }

  if (!row_ok) return;
  const float inv = 1.0f / l_w[r];  // 0 / 0 = NaN for a fully masked row, as the unfused softmax
  T* dst = o + b * sh.o[0] + h * sh.o[1] + int64_t(qi) * sh.o[2] + half * 32;
  const float* orow = o_w + r * kLdF + half * 32;
  for (int c = 0; c < 32; c += 8) {
    alignas(16) T vals[8];
    for (int e = 0; e < 8; ++e) vals[e] = from_f<T>(orow[c + e] * inv);
    *reinterpret_cast<uint4*>(dst + c) = *reinterpret_cast<const uint4*>(vals);
  }
}

template <class T>
cudaError_t launch(const void* q, const void* k, const void* v, const void* mask, DT mask_dt, void* o,
                   const AttentionShape& sh, float scale, cudaStream_t s) {
  static const cudaError_t attr = cudaFuncSetAttribute(attention_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       int(kSmemBytes));
  if (attr != cudaSuccess) return attr;
  dim3 grid(unsigned((sh.sq + kTile - 1) / kTile), unsigned(sh.h), unsigned(sh.b));
  attention_kernel<T><<<grid, kThreads, kSmemBytes, s>>>(static_cast<const T*>(q), static_cast<const T*>(k),
                                                         static_cast<const T*>(v), mask, mask_dt, static_cast<T*>(o), sh,
                                                         scale);
  return cudaGetLastError();
}

}  // namespace

bool attention_supported(DT dt, int head_dim) { return (dt == DT::kF16 || dt == DT::kBF16) && head_dim == kD; }

cudaError_t attention(DT dt, const void* q, const void* k, const void* v, const void* mask, DT mask_dt, void* o,
                      const AttentionShape& sh, float scale, cudaStream_t s) {
  if (!attention_supported(dt, sh.d) || sh.b < 1 || sh.h < 1 || sh.sq < 1 || sh.sk < 1 || sh.h > 65535 || sh.b > 65535) {
    return cudaErrorInvalidValue;
  }
  if (mask && mask_dt != DT::kF32 && mask_dt != DT::kF16 && mask_dt != DT::kBF16) return cudaErrorInvalidValue;
  if (dt == DT::kF16) return launch<__half>(q, k, v, mask, mask_dt, o, sh, scale, s);
  return launch<__nv_bfloat16>(q, k, v, mask, mask_dt, o, sh, scale, s);
}

}  // namespace kiln::cuda::k
