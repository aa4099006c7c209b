// NCCL through dlopen (nccl.h).
#include "backends/cuda/nccl.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "backends/cuda/cuda_check.h"

namespace kiln::cuda {

namespace {

struct Loaded {
  Nccl api;
  void* lib = nullptr;
  std::string why;
};

template <typename F>
bool resolve(Loaded& l, F& f, const char* name) {
  f = reinterpret_cast<F>(dlsym(l.lib, name));
  if (!f) l.why = fmt::format("libnccl has no {}", name);
  return f != nullptr;
}

const Loaded& loaded() {
  static Loaded l;
  static std::once_flag once;
  std::call_once(once, [] {
    for (const char* name : {"libnccl.so.2", "libnccl.so"}) {
      l.lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (l.lib) break;
    }
    if (!l.lib) {
      l.why = "cannot open libnccl.so.2 (NCCL 2, needed by tensor-parallel GPU sessions; is it on the library path?)";
      return;
    }
    Nccl& a = l.api;
    bool ok = resolve(l, a.comm_init_all, "ncclCommInitAll") && resolve(l, a.comm_destroy, "ncclCommDestroy") &&
              resolve(l, a.comm_abort, "ncclCommAbort") && resolve(l, a.all_reduce, "ncclAllReduce") &&
              resolve(l, a.all_gather, "ncclAllGather") && resolve(l, a.error_string, "ncclGetErrorString") &&
              resolve(l, a.get_version, "ncclGetVersion");
    if (ok && a.get_version(&a.version) != ncclSuccess) {
      ok = false;
      l.why = "ncclGetVersion failed";
    }
    if (!ok) {
      dlclose(l.lib);
      l.lib = nullptr;
    }
  });
  return l;
}

// Destroys a communicator when its last pointer goes, unless nccl_abort aborted it (which frees it).
struct CommDeleter {
  const Nccl* api;
  std::shared_ptr<std::atomic<bool>> aborted;
  void operator()(void* p) const {
    if (!aborted->load()) api->comm_destroy(static_cast<ncclComm_t>(p));
  }
};

}  // namespace

Expected<const Nccl*> nccl_library() {
  const Loaded& l = loaded();
  if (!l.lib) return KILN_ERROR(kUnsupported, "{}", l.why);
  return &l.api;
}

Status nccl_status(ncclResult_t r, const char* call) {
  if (r == ncclSuccess) return Status::ok();
  const Loaded& l = loaded();
  return KILN_ERROR(kInternal, "{} failed: {}", call, l.lib ? l.api.error_string(r) : "NCCL is not loaded");
}

Expected<std::vector<std::shared_ptr<void>>> nccl_comms(int n) {
  KILN_ASSIGN_OR_RETURN(const Nccl* api, nccl_library());
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < n) {
    return KILN_ERROR(kUnsupported, "{} ranks need {} GPUs; this process sees {}", n, n, count);
  }
  // NVLink multicast can take a host's shared GPUs down with a faulty fabric; kiln's collectives do
  // not need it, so it stays off unless whoever starts the process asks for it.
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  std::vector<ncclComm_t> comms(size_t(n), nullptr);
  std::vector<int> devs;
  for (int i = 0; i < n; ++i) devs.push_back(i);
  KILN_RETURN_IF_ERROR(nccl_status(api->comm_init_all(comms.data(), n, devs.data()), "ncclCommInitAll"));
  std::vector<std::shared_ptr<void>> out;
  for (ncclComm_t c : comms) out.emplace_back(c, CommDeleter{api, std::make_shared<std::atomic<bool>>(false)});
  return out;
}

void nccl_abort(const std::vector<std::shared_ptr<void>>& comms) {
  for (const std::shared_ptr<void>& c : comms) {
    const CommDeleter* d = std::get_deleter<CommDeleter>(c);
    if (d && !d->aborted->exchange(true)) d->api->comm_abort(static_cast<ncclComm_t>(c.get()));
  }
}

Expected<double> nccl_all_reduce_ms(int n, size_t bytes, int iterations) {
  KILN_ASSIGN_OR_RETURN(const Nccl* api, nccl_library());
  KILN_ASSIGN_OR_RETURN(auto comms, nccl_comms(n));
  const size_t count = std::max<size_t>(1, bytes / 2);
  std::vector<Status> status(static_cast<size_t>(n), Status::ok());
  std::vector<float> times;
  auto rank = [&](int r) -> Status {
    KILN_CUDA_TRY(cudaSetDevice(r));
    void* buf = nullptr;
    cudaStream_t s = nullptr;
    cudaEvent_t a = nullptr, b = nullptr;
    struct Free {
      void*& buf; cudaStream_t& s; cudaEvent_t& a; cudaEvent_t& b;
      ~Free() { cudaFree(buf); if (s) cudaStreamDestroy(s); if (a) cudaEventDestroy(a); if (b) cudaEventDestroy(b); }
    } f{buf, s, a, b};
    KILN_CUDA_TRY(cudaMalloc(&buf, count * 2));
    KILN_CUDA_TRY(cudaMemset(buf, 0, count * 2));
    KILN_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    KILN_CUDA_TRY(cudaEventCreate(&a));
    KILN_CUDA_TRY(cudaEventCreate(&b));
    auto comm = static_cast<ncclComm_t>(comms[size_t(r)].get());
    for (int i = 0; i < 5 + iterations; ++i) {
      KILN_CUDA_TRY(cudaEventRecord(a, s));
      KILN_RETURN_IF_ERROR(nccl_status(api->all_reduce(buf, buf, count, ncclFloat16, ncclSum, comm, s), "ncclAllReduce"));
      KILN_CUDA_TRY(cudaEventRecord(b, s));
      KILN_CUDA_TRY(cudaEventSynchronize(b));
      float ms = 0;
      KILN_CUDA_TRY(cudaEventElapsedTime(&ms, a, b));
      if (r == 0 && i >= 5) times.push_back(ms);
    }
    return Status::ok();
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { status[size_t(r)] = rank(r); });
  for (std::thread& t : threads) t.join();
  for (const Status& s : status) KILN_RETURN_IF_ERROR(s);
  std::sort(times.begin(), times.end());
  return times.empty() ? 0.0 : double(times[times.size() / 2]);
}

}  // namespace kiln::cuda
