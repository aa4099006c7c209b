// NVRTC through dlopen, and the on-disk cache of compiled images (nvrtc.h).
#include "backends/cuda/nvrtc.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <nvrtc.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>

namespace kiln::cuda {

namespace {

// The NVRTC entry points kiln uses, resolved once.
struct Nvrtc {
  void* lib = nullptr;
  std::string why;  // why lib is null
  decltype(&::nvrtcVersion) version = nullptr;
  decltype(&::nvrtcCreateProgram) create = nullptr;
  decltype(&::nvrtcCompileProgram) compile = nullptr;
  decltype(&::nvrtcGetProgramLogSize) log_size = nullptr;
  decltype(&::nvrtcGetProgramLog) log = nullptr;
  decltype(&::nvrtcGetCUBINSize) cubin_size = nullptr;
  decltype(&::nvrtcGetCUBIN) cubin = nullptr;
  decltype(&::nvrtcDestroyProgram) destroy = nullptr;
  decltype(&::nvrtcGetErrorString) error_string = nullptr;
  int major = 0, minor = 0;
};

template <typename F>
bool resolve(Nvrtc& n, F& f, const char* name) {
  f = reinterpret_cast<F>(dlsym(n.lib, name));
  if (!f) n.why = fmt::format("libnvrtc has no {}", name);
  return f != nullptr;
}

const Nvrtc& nvrtc() {
  static Nvrtc n;
  static std::once_flag once;
  std::call_once(once, [] {
    for (const char* name : {"libnvrtc.so.13", "libnvrtc.so"}) {
      n.lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (n.lib) break;
    }
    if (!n.lib) {
      n.why = "cannot open libnvrtc.so.13 (the CUDA 13 toolkit's runtime compiler; is it on the library path?)";
      return;
    }
    bool ok = resolve(n, n.version, "nvrtcVersion") && resolve(n, n.create, "nvrtcCreateProgram") &&
              resolve(n, n.compile, "nvrtcCompileProgram") && resolve(n, n.log_size, "nvrtcGetProgramLogSize") &&
              resolve(n, n.log, "nvrtcGetProgramLog") && resolve(n, n.cubin_size, "nvrtcGetCUBINSize") &&
              resolve(n, n.cubin, "nvrtcGetCUBIN") && resolve(n, n.destroy, "nvrtcDestroyProgram") &&
              resolve(n, n.error_string, "nvrtcGetErrorString");
    if (ok && n.version(&n.major, &n.minor) != NVRTC_SUCCESS) {
      ok = false;
      n.why = "nvrtcVersion failed";
    }
    if (!ok) {
      dlclose(n.lib);
      n.lib = nullptr;
    }
  });
  return n;
}

uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'C', 'B', 'N', '1'};

struct EntryHeader {
  char magic[8];
  uint64_t key;
  uint64_t size;
};

// The cached image for `key`, or nullopt when the file is absent, foreign or truncated.
std::optional<std::string> read_entry(const std::filesystem::path& p, uint64_t key) {
  std::ifstream f(p, std::ios::binary);
  EntryHeader h{};
  if (!f || !f.read(reinterpret_cast<char*>(&h), sizeof h)) return std::nullopt;
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 || h.key != key || h.size == 0 || h.size > (1u << 30)) {
    return std::nullopt;
  }
  std::string image(h.size, '\0');
  if (!f.read(image.data(), std::streamsize(h.size)) || f.peek() != std::char_traits<char>::eof()) return std::nullopt;
  return image;
}

// Writes the entry through a temporary file and a rename; false when anything fails.
bool write_entry(const std::filesystem::path& p, uint64_t key, const std::string& image) {
  std::error_code ec;
  std::filesystem::create_directories(p.parent_path(), ec);
  std::filesystem::path tmp = p;
  tmp += fmt::format(".tmp{}", static_cast<long>(getpid()));
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    EntryHeader h{};
    std::memcpy(h.magic, kMagic, sizeof kMagic);
    h.key = key;
    h.size = image.size();
    if (!f || !f.write(reinterpret_cast<const char*>(&h), sizeof h) || !f.write(image.data(), std::streamsize(image.size()))) {
      std::filesystem::remove(tmp, ec);
      return false;
    }
  }
  std::filesystem::rename(tmp, p, ec);
  if (ec) std::filesystem::remove(tmp, ec);
  return !ec;
}

Expected<std::string> compile(const Nvrtc& n, const std::string& source, const std::vector<std::string>& options) {
  nvrtcProgram prog = nullptr;
  nvrtcResult r = n.create(&prog, source.c_str(), "kiln_generated.cu", 0, nullptr, nullptr);
  if (r != NVRTC_SUCCESS) return KILN_ERROR(kInternal, "nvrtcCreateProgram: {}", n.error_string(r));
  std::vector<const char*> argv;
  for (const std::string& o : options) argv.push_back(o.c_str());
  r = n.compile(prog, int(argv.size()), argv.data());
  if (r != NVRTC_SUCCESS) {
    size_t len = 0;
    std::string log;
    if (n.log_size(prog, &len) == NVRTC_SUCCESS && len > 1) {
      log.resize(len);
      if (n.log(prog, log.data()) != NVRTC_SUCCESS) log.clear();
      while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
    }
    n.destroy(&prog);
    return KILN_ERROR(kInternal, "NVRTC could not compile a generated kernel ({}): {}", n.error_string(r), log);
  }
  size_t size = 0;
  std::string image;
  r = n.cubin_size(prog, &size);
  if (r == NVRTC_SUCCESS) {
    image.resize(size);
    r = n.cubin(prog, image.data());
  }
  n.destroy(&prog);
  if (r != NVRTC_SUCCESS || image.empty()) {
    return KILN_ERROR(kInternal, "NVRTC gave no CUBIN ({}): is --gpu-architecture a real architecture (sm_XX)?",
                      n.error_string(r));
  }
  return image;
}

}  // namespace

std::string default_cache_dir() {
  if (const char* d = std::getenv("KILN_CACHE_DIR"); d && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return std::string(d) + "/kiln";
  if (const char* d = std::getenv("HOME"); d && *d) return std::string(d) + "/.cache/kiln";
  return "/tmp/kiln-cache";
}

bool nvrtc_available(std::string* why) {
  const Nvrtc& n = nvrtc();
  if (!n.lib && why) *why = n.why;
  return n.lib != nullptr;
}

namespace {
std::mutex stats_mu;
NvrtcStats stats;
}  // namespace

NvrtcStats nvrtc_stats() {
  std::lock_guard<std::mutex> lock(stats_mu);
  return stats;
}

Expected<CompiledKernel> compile_cached(const std::string& source, const NvrtcOptions& opt) {
  const Nvrtc& n = nvrtc();
  if (!n.lib) return KILN_ERROR(kUnsupported, "generated kernels need NVRTC: {}", n.why);
  std::vector<std::string> options = {"--gpu-architecture=" + opt.arch, "-std=c++17"};
  options.insert(options.end(), opt.flags.begin(), opt.flags.end());
  for (const std::string& d : opt.include_dirs) options.push_back("-I" + d);
#ifdef KILN_CUDA_INCLUDE_DIR
  if (std::error_code ec; std::filesystem::exists(KILN_CUDA_INCLUDE_DIR "/cuda_fp16.h", ec)) {
    options.push_back("-I" KILN_CUDA_INCLUDE_DIR);
  }
#endif
  std::string key_text = fmt::format("nvrtc {}.{}\n", n.major, n.minor);
  for (const std::string& o : options) key_text += o + "\n";
  const uint64_t key = fnv1a(source, fnv1a(key_text));
  const std::filesystem::path path =
      std::filesystem::path(opt.cache_dir.empty() ? default_cache_dir() : opt.cache_dir) /
      fmt::format("nvrtc-{}-{:016x}.cubin", opt.arch, key);
  CompiledKernel out;
  if (std::optional<std::string> hit = read_entry(path, key)) {
    out.cubin = std::move(*hit);
    out.from_cache = true;
    out.cache_path = path.string();
    std::lock_guard<std::mutex> lock(stats_mu);
    ++stats.cached;
    return out;
  }
  const auto t0 = std::chrono::steady_clock::now();
  KILN_ASSIGN_OR_RETURN(out.cubin, compile(n, source, options));
  {
    std::lock_guard<std::mutex> lock(stats_mu);
    ++stats.compiled;
    stats.compile_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  if (write_entry(path, key, out.cubin)) out.cache_path = path.string();
  return out;
}

}  // namespace kiln::cuda
