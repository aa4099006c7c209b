#include "serve/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#ifdef KILN_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>

#include "backends/cuda/device.h"
#include "serve/device_copy.h"
#endif

namespace kiln::serve {

struct ShmRegion {
  SharedMemory::Kind kind = SharedMemory::Kind::kSystem;
  SharedMemory::Status status;
  unsigned char* base = nullptr;  // the region's first byte (host mapping or device pointer)
  void* mapping = nullptr;        // system: the mapping (from a page boundary at or before offset)
  size_t mapped = 0;
  void* ipc = nullptr;            // CUDA: what cudaIpcOpenMemHandle returned

  ~ShmRegion() {
    if (mapping) munmap(mapping, mapped);
#ifdef KILN_HAVE_CUDA
    if (ipc) {
      std::lock_guard<std::recursive_mutex> lock(cuda::device_mutation_mutex());
      cudaIpcCloseMemHandle(ipc);
    }
#endif
  }
};

namespace {

const char* kind_name(SharedMemory::Kind k) { return k == SharedMemory::Kind::kSystem ? "system" : "CUDA"; }

#ifdef KILN_HAVE_CUDA
void cuda_try(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) throw HttpError{400, what + ": " + cudaGetErrorString(e)};
}
#endif

// Copies to and from CUDA regions made by a request's own thread (HTTP and gRPC handlers).
DeviceStaging& thread_staging() {
  thread_local DeviceStaging s;
  return s;
}

}  // namespace

SharedMemory::SharedMemory() = default;
SharedMemory::~SharedMemory() = default;

void SharedMemory::add(std::shared_ptr<ShmRegion> r) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string& name = r->status.name;
  if (regions_.count(name)) throw HttpError{400, "shared memory region '" + name + "' is already registered"};
  regions_.emplace(name, std::move(r));
}

void SharedMemory::register_system(const std::string& name, const std::string& key, uint64_t offset, uint64_t byte_size) {
  if (name.empty()) throw HttpError{400, "a shared memory region needs a name"};
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (regions_.count(name)) throw HttpError{400, "shared memory region '" + name + "' is already registered"};
  }
  const std::string what = "system shared memory region '" + name + "' (key '" + key + "')";
  if (byte_size == 0) throw HttpError{400, what + ": byte_size is 0"};
  const int fd = shm_open(key.c_str(), O_RDWR, 0);
  if (fd < 0) throw HttpError{400, what + ": cannot open the shared memory object: " + std::strerror(errno)};
  struct stat st {};
  const bool stat_ok = fstat(fd, &st) == 0;
  const uint64_t size = stat_ok ? uint64_t(st.st_size) : 0;
  if (!stat_ok || offset > size || byte_size > size - offset) {
    close(fd);
    throw HttpError{400, what + ": offset " + std::to_string(offset) + " + byte_size " + std::to_string(byte_size) +
                             " is past the object's " + std::to_string(size) + " bytes"};
  }
  // mmap maps from a page boundary: from the one at or before the offset.
  const uint64_t page = uint64_t(sysconf(_SC_PAGESIZE));
  const uint64_t start = offset / page * page;
  auto r = std::make_shared<ShmRegion>();
  r->mapped = size_t(offset - start + byte_size);
  void* m = mmap(nullptr, r->mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, off_t(start));
  const int err = errno;
  close(fd);  // the mapping keeps the object
  if (m == MAP_FAILED) throw HttpError{400, what + ": cannot map it: " + std::strerror(err)};
  r->mapping = m;
  r->base = static_cast<unsigned char*>(m) + (offset - start);
  r->kind = Kind::kSystem;
  r->status = {name, key, offset, byte_size, 0};
  add(std::move(r));
}

bool cuda_shared_memory_supported() {
#ifdef KILN_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

void SharedMemory::register_cuda(const std::string& name, const std::string& raw_handle, int64_t device_id,
                                 uint64_t byte_size) {
  if (name.empty()) throw HttpError{400, "a shared memory region needs a name"};
  const std::string what = "CUDA shared memory region '" + name + "'";
#ifdef KILN_HAVE_CUDA
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (regions_.count(name)) throw HttpError{400, "shared memory region '" + name + "' is already registered"};
  }
  if (raw_handle.size() != sizeof(cudaIpcMemHandle_t)) {
    throw HttpError{400, what + ": raw_handle has " + std::to_string(raw_handle.size()) + " bytes; a CUDA IPC handle has " +
                             std::to_string(sizeof(cudaIpcMemHandle_t))};
  }
  int current = 0;
  cuda_try(cudaGetDevice(&current), what);
  if (device_id != current) {
    throw HttpError{400, what + ": it is on GPU " + std::to_string(device_id) + "; kiln serves on GPU " + std::to_string(current)};
  }
  cudaIpcMemHandle_t h;
  std::memcpy(&h, raw_handle.data(), sizeof h);
  auto r = std::make_shared<ShmRegion>();
  {
    // Opening maps memory into the context, which must not happen while a session captures a graph.
    std::lock_guard<std::recursive_mutex> lock(cuda::device_mutation_mutex());
    cuda_try(cudaIpcOpenMemHandle(&r->ipc, h, cudaIpcMemLazyEnablePeerAccess), what + ": cannot open its IPC handle");
  }
  // The allocation behind the handle must hold byte_size (the driver knows its extent).
  // A region larger than its allocation would let requests read and write past it: refused, as is
  // one whose extent the driver does not tell.
  using GetRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  CUdeviceptr base = 0;
  size_t size = 0;
  if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess || !fn ||
      reinterpret_cast<GetRange>(fn)(&base, &size, CUdeviceptr(r->ipc)) != CUDA_SUCCESS) {
    throw HttpError{400, what + ": the driver does not tell the allocation's size, so byte_size cannot be checked"};
  }
  if (byte_size > size - (CUdeviceptr(r->ipc) - base)) {
    throw HttpError{400, what + ": byte_size " + std::to_string(byte_size) + " is past the allocation's " +
                             std::to_string(size - (CUdeviceptr(r->ipc) - base)) + " bytes"};
  }
  r->base = static_cast<unsigned char*>(r->ipc);
  r->kind = Kind::kCuda;
  r->status = {name, "", 0, byte_size, device_id};
  add(std::move(r));
#else
  (void)raw_handle;
  (void)device_id;
  (void)byte_size;
  throw HttpError{400, what + ": this kiln serve was built without CUDA"};
#endif
}

void SharedMemory::unregister(Kind kind, const std::string& name) {
  std::vector<std::shared_ptr<ShmRegion>> gone;  // unmapped after the lock, once no request holds them
  std::lock_guard<std::mutex> lock(mu_);
  if (name.empty()) {
    for (auto it = regions_.begin(); it != regions_.end();) {
      if (it->second->kind == kind) {
        gone.push_back(it->second);
        it = regions_.erase(it);
      } else {
        ++it;
      }
    }
    return;
  }
  auto it = regions_.find(name);
  if (it == regions_.end() || it->second->kind != kind) {
    throw HttpError{400, std::string("no ") + kind_name(kind) + " shared memory region '" + name + "' is registered"};
  }
  gone.push_back(it->second);
  regions_.erase(it);
}

std::vector<SharedMemory::Status> SharedMemory::status(Kind kind, const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Status> out;
  for (const auto& [n, r] : regions_) {
    if (r->kind == kind && (name.empty() || n == name)) out.push_back(r->status);
  }
  if (!name.empty() && out.empty()) {
    throw HttpError{400, std::string("no ") + kind_name(kind) + " shared memory region '" + name + "' is registered"};
  }
  return out;
}

std::shared_ptr<ShmRegion> SharedMemory::find(const std::string& name, const std::string& what) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = regions_.find(name);
  if (it == regions_.end()) throw HttpError{400, what + ": no shared memory region '" + name + "' is registered"};
  return it->second;
}

unsigned char* SharedMemory::range(const ShmRegion& r, const ShmRef& ref, uint64_t size, const std::string& what) const {
  const uint64_t cap = r.status.byte_size;
  if (ref.offset > cap || ref.byte_size > cap - ref.offset) {
    throw HttpError{400, what + ": shared_memory_offset " + std::to_string(ref.offset) + " + shared_memory_byte_size " +
                             std::to_string(ref.byte_size) + " is past region '" + ref.region + "''s " +
                             std::to_string(cap) + " bytes"};
  }
  if (size > ref.byte_size) {
    throw HttpError{400, what + " needs " + std::to_string(size) + " bytes; shared_memory_byte_size is " +
                             std::to_string(ref.byte_size)};
  }
  return r.base + ref.offset;
}

void SharedMemory::attach(std::vector<Input>& inputs) const {
  for (Input& in : inputs) {
    if (!in.info || !in.shm) continue;
    const std::string what = "input '" + in.info->name + "'";
    std::shared_ptr<ShmRegion> r = find(in.shm->region, what);
    unsigned char* p = range(*r, *in.shm, in.shm->byte_size, what);
    const bool device = r->kind == Kind::kCuda;
    if (in.info->dtype == DType::kString) {
      // Strings are decoded out of the region (4-byte lengths before each), as binary data is.
      std::string host(in.shm->byte_size, '\0');
      if (device) {
        DeviceStaging& s = thread_staging();
        s.copy(host.data(), p, host.size());
        s.sync();
      } else {
        std::memcpy(host.data(), p, host.size());
      }
      decode_raw(in, host.data(), host.size(), in.count);
      continue;
    }
    const uint64_t want = uint64_t(in.count) * dtype_size(in.info->dtype);
    if (in.shm->byte_size != want) {
      throw HttpError{400, what + ": shared_memory_byte_size is " + std::to_string(in.shm->byte_size) +
                               " bytes, shape and datatype need " + std::to_string(want)};
    }
    in.external = p;
    in.on_device = device;
    in.keep = r;
  }
}

OutputTarget SharedMemory::target(const ShmRef& ref, std::shared_ptr<const void>& keep, const std::string& output_name) const {
  const std::string what = "output '" + output_name + "'";
  std::shared_ptr<ShmRegion> r = find(ref.region, what);
  OutputTarget t{range(*r, ref, 0, what), ref.byte_size, r->kind == Kind::kCuda};
  keep = r;
  return t;
}

std::vector<OutputTarget> SharedMemory::targets(const std::vector<std::pair<size_t, const ShmRef*>>& wanted,
                                                const std::vector<TensorInfo>& outputs,
                                                std::vector<std::shared_ptr<const void>>& keep) const {
  std::vector<OutputTarget> t(outputs.size());
  for (const auto& [k, ref] : wanted) {
    if (!ref || outputs[k].dtype == DType::kString) continue;
    keep.emplace_back();
    t[k] = target(*ref, keep.back(), outputs[k].name);
  }
  return t;
}

uint64_t SharedMemory::write(const ShmRef& ref, const HostTensor& t, const std::string& output_name) const {
  const std::string what = "output '" + output_name + "'";
  std::shared_ptr<ShmRegion> r = find(ref.region, what);
  const std::string strings = t.dtype() == DType::kString ? encode_binary(t) : std::string();
  const void* src = t.dtype() == DType::kString ? static_cast<const void*>(strings.data()) : t.raw();
  const uint64_t size = t.dtype() == DType::kString ? strings.size() : t.bytes();
  unsigned char* p = range(*r, ref, size, what);
  if (size == 0) return 0;
  if (r->kind == Kind::kCuda) {
    DeviceStaging& s = thread_staging();
    s.copy(p, src, size);
    s.sync();
  } else {
    std::memcpy(p, src, size);
  }
  return size;
}

// ---- DeviceStaging ----------------------------------------------------------------------------

#ifdef KILN_HAVE_CUDA
DeviceStaging::DeviceStaging() {
  {
    std::lock_guard<std::recursive_mutex> lock(cuda::device_mutation_mutex());
    load_device_copy();
  }
  cudaStream_t s = nullptr;
  cuda_try(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "a staging stream for shared memory");
  stream_ = s;
}

DeviceStaging::~DeviceStaging() {
  cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
  if (mark_) cudaEventDestroy(static_cast<cudaEvent_t>(mark_));
  // Freeing synchronizes the device: not while a session captures a graph.
  std::lock_guard<std::recursive_mutex> lock(cuda::device_mutation_mutex());
  for (auto& [p, n] : buffers_) cudaFree(p);
  cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

unsigned char* DeviceStaging::buffer(size_t k, size_t bytes) {
  if (buffers_.size() <= k) buffers_.resize(k + 1, {nullptr, 0});
  auto& [p, n] = buffers_[k];
  if (n < bytes) {
    std::lock_guard<std::recursive_mutex> lock(cuda::device_mutation_mutex());
    sync();
    const size_t want = std::max(bytes, n * 2);
    if (p) cudaFree(p);
    p = nullptr;
    n = 0;
    if (cudaMalloc(&p, want) != cudaSuccess) {
      p = nullptr;
      throw HttpError{500, "out of device memory staging a batch of " + std::to_string(bytes) + " bytes"};
    }
    n = want;
  }
  return static_cast<unsigned char*>(p);
}

void DeviceStaging::copy(void* dst, const void* src, size_t bytes) {
  if (bytes) cuda_try(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream_)), "a shared memory copy");
}

void DeviceStaging::copy_all(const DeviceCopies& c) {
  if (c.dsts.size() == 1) return copy(c.dsts[0], c.srcs[0], c.sizes[0]);
  if (std::string err = copy_on_device(c.dsts, c.srcs, c.sizes, stream_); !err.empty()) {
    throw HttpError{500, "copying a batch's tensors on the device: " + err};
  }
}

void DeviceStaging::sync() { cuda_try(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)), "a shared memory copy"); }

void DeviceStaging::mark() {
  if (!mark_) {
    cudaEvent_t e = nullptr;
    cuda_try(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "an event for a queued batch");
    mark_ = e;
  }
  cuda_try(cudaEventRecord(static_cast<cudaEvent_t>(mark_), static_cast<cudaStream_t>(stream_)), "marking a queued batch");
}

void DeviceStaging::wait() { cuda_try(cudaEventSynchronize(static_cast<cudaEvent_t>(mark_)), "a queued batch"); }
#else
namespace {
[[noreturn]] void no_cuda() { throw HttpError{400, "this kiln serve was built without CUDA"}; }
}  // namespace
DeviceStaging::DeviceStaging() = default;
DeviceStaging::~DeviceStaging() = default;
unsigned char* DeviceStaging::buffer(size_t, size_t) { no_cuda(); }
void DeviceStaging::copy(void*, const void*, size_t) { no_cuda(); }
void DeviceStaging::copy_all(const DeviceCopies&) { no_cuda(); }
void DeviceStaging::sync() { no_cuda(); }
void DeviceStaging::mark() { no_cuda(); }
void DeviceStaging::wait() { no_cuda(); }
#endif

}  // namespace kiln::serve
