// NHWC GroupNormalization (+SiLU) in fp16 on the GPU: the three launches (k::group_norm_nhwc: block
// statistics, merge, apply) against one cooperative launch (k::group_norm_nhwc_one_launch) at as many
// blocks as fit, a half and a quarter of them, on a diffusion UNet's shapes and larger ones; an empty
// kernel gives the launch floor.
// Each is captured 20 times in one CUDA graph and replayed 30 times after 200 warm-up replays; the
// median replay / 20 is printed in microseconds, with the largest difference between the paths'
// outputs (random inputs, per-channel scale and shift), and between one launch adding a per-image
// input bias (GroupNormArgs::x_bias) and three launches on x + bias. Not part of the build; on a GPU machine:
//   nvcc -O3 -std=c++17 -arch=sm_90a -I src bench/group_norm_bench.cu -o /tmp/gnb && /tmp/gnb
// Results: bench/RESULTS.md, "thirty-seventh session".
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include "backends/cuda/kernels/norm_group.cu"  // the kernels themselves, compiled into this program

namespace k = kiln::cuda::k;

namespace {

// Median microseconds of one f() (20 captured in a graph), or -1 when f fails.
float time_us(cudaStream_t s, const std::function<cudaError_t()>& f) {
  if (f() != cudaSuccess || cudaStreamSynchronize(s) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  cudaGraph_t g;
  cudaGraphExec_t ge;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  for (int i = 0; i < 20; ++i) f();
  if (cudaStreamEndCapture(s, &g) != cudaSuccess || cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) return -1;
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int r = 0; r < 200; ++r) cudaGraphLaunch(ge, s);
  std::vector<float> t;
  for (int r = 0; r < 30; ++r) {
    cudaEventRecord(a, s);
    cudaGraphLaunch(ge, s);
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms * 1000 / 20);
  }
  std::sort(t.begin(), t.end());
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  return t[t.size() / 2];
}

__global__ void empty_kernel() {}

__global__ void add_bias_kernel(const __half* x, const __half* b, __half* y, int64_t spatial, int64_t c, int64_t total) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t nb = i / (spatial * c), ch = i % c;
    y[i] = __float2half(__half2float(x[i]) + __half2float(b[nb * c + ch]));
  }
}

double max_diff(const std::vector<__half>& a, const std::vector<__half>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, double(std::fabs(__half2float(a[i]) - __half2float(b[i]))));
  return d;
}

}  // namespace

int main() {
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  struct Shape {
    int64_t n, c, hw;
  };
  const Shape shapes[] = {{1, 64, 4096},  {1, 128, 1024},  {1, 256, 256},  {1, 384, 1024}, {1, 192, 4096},
                          {16, 64, 4096}, {16, 192, 4096}, {1, 128, 16384}, {8, 320, 4096}, {2, 640, 1024}};
  const int64_t groups = 32;
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  std::printf("empty kernel (1 block): %.2f us\n", time_us(s, [&] {
                empty_kernel<<<1, 32, 0, s>>>();
                return cudaGetLastError();
              }));
  for (const Shape& sh : shapes) {
    const size_t elems = size_t(sh.n * sh.c * sh.hw), bytes = elems * sizeof(__half);
    std::vector<__half> hx(elems);
    for (size_t i = 0; i < elems; ++i) hx[i] = __float2half(float((i * 2654435761u) % 1000) / 250.f - 1.5f);
    std::vector<float> hp(size_t(sh.c));
    for (int64_t i = 0; i < sh.c; ++i) hp[size_t(i)] = 0.5f + 0.01f * float(i);
    const int64_t pixels = k::group_norm_nhwc_pixels(sh.n, sh.hw, 2 * int64_t(sms));
    const int most = k::group_norm_nhwc_one_blocks(k::DT::kF16, sh.n, sh.c, groups, sh.hw);
    const size_t scratch_bytes = std::max(k::group_norm_nhwc_scratch_bytes(sh.n, groups, sh.hw, pixels),
                                          k::group_norm_nhwc_one_scratch_bytes(sh.n, groups, std::max(most, 1)));
    std::vector<__half> hb(size_t(sh.n * sh.c));
    for (size_t i = 0; i < hb.size(); ++i) hb[i] = __float2half(float(i % 97) / 20.f - 2.f);
    void *x = nullptr, *y = nullptr, *xb = nullptr, *bias = nullptr, *scratch = nullptr;
    float* p = nullptr;
    if (cudaMalloc(&x, bytes) != cudaSuccess || cudaMalloc(&y, bytes) != cudaSuccess || cudaMalloc(&xb, bytes) != cudaSuccess ||
        cudaMalloc(&bias, hb.size() * sizeof(__half)) != cudaSuccess ||
        cudaMalloc(&scratch, scratch_bytes) != cudaSuccess || cudaMalloc(&p, hp.size() * sizeof(float)) != cudaSuccess) {
      std::printf("allocation failed\n");
      return 1;
    }
    cudaMemcpy(x, hx.data(), bytes, cudaMemcpyHostToDevice);
    cudaMemcpy(bias, hb.data(), hb.size() * sizeof(__half), cudaMemcpyHostToDevice);
    cudaMemcpy(p, hp.data(), hp.size() * sizeof(float), cudaMemcpyHostToDevice);
    k::GroupNormArgs a = k::group_norm_shape(k::DT::kF16, sh.n, sh.c, groups, sh.hw, 1e-5f, 2);
    a.x = x;
    a.scale = a.shift = p;
    a.y = y;
    a.scratch = scratch;
    auto three = [&] { return k::group_norm_nhwc(a, pixels, s); };
    auto one = [&](int b) { return k::group_norm_nhwc_one_launch(a, b, s); };
    auto fetch = [&] {
      std::vector<__half> h(elems);
      cudaMemcpy(h.data(), y, bytes, cudaMemcpyDeviceToHost);
      return h;
    };
    three();
    const std::vector<__half> y3 = fetch();
    double diff = -1, diff_bias = -1;
    if (most > 0 && one(most) == cudaSuccess) {
      diff = max_diff(fetch(), y3);
      // x + bias by hand, normalized by the three launches, against one launch adding the bias itself.
      add_bias_kernel<<<256, 256, 0, s>>>(static_cast<const __half*>(x), static_cast<const __half*>(bias),
                                          static_cast<__half*>(xb), sh.hw, sh.c, int64_t(elems));
      k::GroupNormArgs ab = a;
      ab.x = xb;
      k::group_norm_nhwc(ab, pixels, s);
      const std::vector<__half> yb3 = fetch();
      ab.x = x;
      ab.x_bias = bias;
      ab.bias_stride = sh.c;
      if (k::group_norm_nhwc_one_launch(ab, most, s) == cudaSuccess) diff_bias = max_diff(fetch(), yb3);
    }
    std::printf("n %2ld c %4ld pixels %6ld (%6.2f MB): three launches %7.2f us; one launch", long(sh.n), long(sh.c),
                long(sh.hw), double(bytes) / 1e6, time_us(s, three));
    for (int b : {most, most / 2, most / 4}) {
      if (b >= 1) std::printf(" %d blocks %7.2f us,", b, time_us(s, [&] { return one(b); }));
    }
    std::printf(" max |one - three| %.3g, |one biased - three of x + bias| %.3g\n", diff, diff_bias);
    cudaFree(x);
    cudaFree(y);
    cudaFree(xb);
    cudaFree(bias);
    cudaFree(scratch);
    cudaFree(p);
  }
  return 0;
}
