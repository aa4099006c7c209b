// Build-time timing inside a captured graph (tuning.h).
#include "backends/cuda/tuning.h"

#include <algorithm>
#include <vector>

namespace kiln::cuda {

namespace {

size_t l2_bytes() {
  int dev = 0, l2 = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev) != cudaSuccess ||
      l2 <= 0) {
    cudaGetLastError();
    l2 = 50 << 20;  // an H100's
  }
  return size_t(l2);
}

}  // namespace

RotatingCopies::RotatingCopies(size_t bytes, bool cold) {
  const size_t l2 = l2_bytes();
  pitch_ = std::max<size_t>((bytes + 255) / 256 * 256, 256);
  const size_t want = (2 * l2 + pitch_ - 1) / pitch_;
  copies_ = cold ? int(std::clamp<size_t>(want, 1, 64)) : 1;
  if (cudaMalloc(&base_, pitch_ * size_t(copies_)) != cudaSuccess ||
      cudaMemset(base_, 0x3c, pitch_ * size_t(copies_)) != cudaSuccess) {
    if (base_) cudaFree(base_);
    base_ = nullptr;
    cudaGetLastError();
  }
}

RotatingCopies::~RotatingCopies() {
  if (base_) cudaFree(base_);
}

ProductOperands::ProductOperands(size_t a_bytes, size_t w_bytes, size_t d_bytes, bool has_c)
    : cold_activations(a_bytes + w_bytes + (has_c ? 2 : 1) * d_bytes > l2_bytes() / 2),
      a(a_bytes, cold_activations),
      w(w_bytes),
      c(has_c ? d_bytes : 1, cold_activations && has_c),
      launches(std::max({a.launches(), w.launches(), c.launches()})) {}

Status finish_timing(const std::string& what) {
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
    cudaGetLastError();
    if (cudaDeviceSynchronize() != cudaSuccess) {
      return KILN_ERROR(kInternal, "timing {} broke the CUDA context: {}", what, cudaGetErrorString(e));
    }
  }
  cudaGetLastError();
  return Status::ok();
}

float time_in_graph(int launches, const std::function<bool(int, cudaStream_t)>& launch) {
  if (launches <= 0) return -1;
  cudaStream_t s = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  float result = -1;
  bool ok = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess && cudaEventCreate(&e0) == cudaSuccess &&
            cudaEventCreate(&e1) == cudaSuccess && launch(0, s) && cudaStreamSynchronize(s) == cudaSuccess &&
            cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
  if (ok) {
    bool launched = true;
    for (int i = 0; i < launches && launched; ++i) launched = launch(i, s);
    ok = cudaStreamEndCapture(s, &graph) == cudaSuccess && launched && graph != nullptr &&
         cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
  }
  std::vector<float> ms;
  float total = 0;
  while (ok && (ms.size() < 4 || total < 2.0f) && ms.size() < 64) {
    float t = 0;
    ok = cudaEventRecord(e0, s) == cudaSuccess && cudaGraphLaunch(exec, s) == cudaSuccess &&
         cudaEventRecord(e1, s) == cudaSuccess && cudaEventSynchronize(e1) == cudaSuccess &&
         cudaEventElapsedTime(&t, e0, e1) == cudaSuccess;
    ms.push_back(t);
    total += t;
  }
  if (ok) {
    std::vector<float> last(ms.end() - 3, ms.end());
    std::sort(last.begin(), last.end());
    result = last[1] / float(launches);
  }
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  if (s) {
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }
  cudaGetLastError();
  return result;
}

}  // namespace kiln::cuda
