#include "backends/cpu/dnnl_lib.h"

#if KILN_HAVE_DNNL
#include <dlfcn.h>

#include <filesystem>
#include <mutex>
#include <vector>

#include <fmt/format.h>

namespace kiln {

namespace {

// The folder of the executable or shared library this function is linked into.
std::string own_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&own_dir), &info) == 0 || !info.dli_fname) return "";
  std::error_code ec;
  auto p = std::filesystem::weakly_canonical(info.dli_fname, ec);
  return ec ? "" : p.parent_path().string();
}

const DnnlLib* load(std::string* why) {
  std::vector<std::string> tried;
  std::vector<std::string> candidates;
  if (std::string d = own_dir(); !d.empty()) {
    candidates.push_back(d + "/libdnnl.so.3");
    candidates.push_back(d + "/../lib/libdnnl.so.3");
  }
#ifdef KILN_ONEDNN_LIB
  candidates.push_back(KILN_ONEDNN_LIB);  // where install-deps.sh unpacked it for this build
#endif
  candidates.push_back("libdnnl.so.3");  // the loader's search path
  void* h = nullptr;
  std::string from;
  for (const std::string& c : candidates) {
    if (c.find('/') != std::string::npos && !std::filesystem::exists(c)) continue;
    h = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h) {
      from = c;
      break;
    }
    const char* e = dlerror();
    tried.push_back(e ? e : c);
  }
  if (!h) {
    if (why) {
      *why = "oneDNN (libdnnl.so.3) not found";
      for (const std::string& t : tried) *why += "; " + t;
    }
    return nullptr;
  }
  auto* lib = new DnnlLib;  // lives as long as the process, as the library does
  lib->path = from;
#define KILN_DNNL_RESOLVE(name)                                                                      \
  lib->name = reinterpret_cast<decltype(lib->name)>(dlsym(h, "dnnl_" #name));                         \
  if (!lib->name) {                                                                                  \
    if (why) *why = fmt::format("{}: has no dnnl_" #name " (oneDNN 3.x expected)", from);            \
    delete lib;                                                                                      \
    return nullptr;                                                                                  \
  }
  KILN_DNNL_FUNCTIONS(KILN_DNNL_RESOLVE)
#undef KILN_DNNL_RESOLVE
  const dnnl_version_t* v = lib->version();
  lib->version_text = fmt::format("{}.{}.{}", v->major, v->minor, v->patch);
  if (v->major != 3) {
    if (why) *why = fmt::format("{}: oneDNN {}, kiln needs 3.x", from, lib->version_text);
    delete lib;
    return nullptr;
  }
  return lib;
}

}  // namespace

const DnnlLib* dnnl_lib(std::string* why) {
  static std::once_flag once;
  static const DnnlLib* lib = nullptr;
  static std::string reason;
  std::call_once(once, [] { lib = load(&reason); });
  if (!lib && why) *why = reason;
  return lib;
}

}  // namespace kiln

#endif
