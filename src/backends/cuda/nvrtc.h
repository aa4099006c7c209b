// Runtime compilation of generated kernels (issue 4: "generated kernels compiled by NVRTC once and
// cached on disk").
//
//   NvrtcOptions o;                       // sm_90a, cache under $KILN_CACHE_DIR or ~/.cache/kiln
//   KILN_ASSIGN_OR_RETURN(CompiledKernel k, compile_cached(source, o));
//   // k.cubin: the ELF image for cuModuleLoadData; k.from_cache: no compilation happened
//
// NVRTC is opened at run time (dlopen of libnvrtc.so.13), so a kiln binary starts, and runs every
// library and hand-written kernel, on a machine without it; compile_cached then fails with an
// error that says so. A cache entry is named by a 64-bit hash of the source, the architecture,
// the options and NVRTC's version; it carries a header with that key and the image size, so a
// truncated or foreign file is recompiled (and rewritten) instead of loaded. Entries are written
// to a temporary name and renamed, so concurrent builds never read half a file.
//
// Loading the image and launching it (driver API) belong to the lowering that generates the
// source; this file needs no GPU and is tested on the build machine.
#pragma once

#include <string>
#include <vector>

#include "support/status.h"

namespace kiln::cuda {

struct NvrtcOptions {
  std::string arch = "sm_90a";           // --gpu-architecture (a real arch: NVRTC emits a CUBIN)
  std::vector<std::string> flags;        // extra options, e.g. "-default-device"
  // Header folders (-I). The toolkit's include folder of the build (cuda_fp16.h and friends) is
  // added when it exists at run time; generated code that includes nothing needs none.
  std::vector<std::string> include_dirs;
  std::string cache_dir;                 // empty: default_cache_dir()
};

struct CompiledKernel {
  std::string cubin;       // the ELF image
  bool from_cache = false; // read from the disk cache rather than compiled now
  std::string cache_path;  // where the entry is (written or read); empty when caching failed
};

// $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln, else /tmp/kiln-cache.
std::string default_cache_dir();

// Whether NVRTC can be opened here; `why` says what was tried when not.
bool nvrtc_available(std::string* why = nullptr);

// What compile_cached did in this process: kernels compiled (and the time NVRTC took) and read from
// the disk cache, for build reports.
struct NvrtcStats {
  int compiled = 0, cached = 0;
  double compile_ms = 0;
};
NvrtcStats nvrtc_stats();

// Compiles `source` (CUDA C++, kernels `extern "C"`) to a CUBIN, or reads it from the cache.
// Errors: NVRTC missing; a compilation error, with NVRTC's log. A cache directory that cannot be
// written only loses the caching (cache_path stays empty), never the compilation.
Expected<CompiledKernel> compile_cached(const std::string& source, const NvrtcOptions& opt = {});

}  // namespace kiln::cuda
