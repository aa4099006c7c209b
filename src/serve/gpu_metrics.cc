#include "serve/gpu_metrics.h"

#include <dlfcn.h>

#include <cstdio>
#include <mutex>

namespace kiln::serve {

namespace {

// The few NVML entry points used, with the C API's (stable) types.
using Device = void*;
struct Memory {
  unsigned long long total, free, used;
};
struct Utilization {
  unsigned int gpu, memory;
};

struct Nvml {
  int (*init)() = nullptr;
  int (*count)(unsigned int*) = nullptr;
  int (*handle)(unsigned int, Device*) = nullptr;
  int (*uuid)(Device, char*, unsigned int) = nullptr;
  int (*memory)(Device, Memory*) = nullptr;
  int (*utilization)(Device, Utilization*) = nullptr;
  int (*power)(Device, unsigned int*) = nullptr;
  int (*power_limit)(Device, unsigned int*) = nullptr;
  bool ok = false;
};

template <typename F>
bool resolve(void* lib, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  return f != nullptr;
}

const Nvml& nvml() {
  static Nvml n;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    n.ok = resolve(lib, "nvmlInit_v2", n.init) && resolve(lib, "nvmlDeviceGetCount_v2", n.count) &&
           resolve(lib, "nvmlDeviceGetHandleByIndex_v2", n.handle) && resolve(lib, "nvmlDeviceGetUUID", n.uuid) &&
           resolve(lib, "nvmlDeviceGetMemoryInfo", n.memory) &&
           resolve(lib, "nvmlDeviceGetUtilizationRates", n.utilization) &&
           resolve(lib, "nvmlDeviceGetPowerUsage", n.power) &&
           resolve(lib, "nvmlDeviceGetEnforcedPowerLimit", n.power_limit) && n.init() == 0;
  });
  return n;
}

}  // namespace

std::string gpu_metrics_text() {
  const Nvml& n = nvml();
  unsigned int count = 0;
  if (!n.ok || n.count(&count) != 0 || count == 0) return "";
  struct Gauge {
    const char* name;
    const char* help;
    std::string lines;
  };
  Gauge g[] = {{"nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", ""},
               {"nv_gpu_memory_total_bytes", "GPU total memory, in bytes", ""},
               {"nv_gpu_memory_used_bytes", "GPU used memory, in bytes", ""},
               {"nv_gpu_power_usage", "GPU power usage in watts", ""},
               {"nv_gpu_power_limit", "GPU power management limit in watts", ""}};
  char buf[160];
  for (unsigned int i = 0; i < count; ++i) {
    Device d = nullptr;
    char uuid[96] = {0};
    if (n.handle(i, &d) != 0 || n.uuid(d, uuid, sizeof uuid) != 0) continue;
    auto put = [&](Gauge& x, double v) {
      std::snprintf(buf, sizeof buf, "%s{gpu_uuid=\"%s\"} %.17g\n", x.name, uuid, v);
      x.lines += buf;
    };
    Utilization u{};
    if (n.utilization(d, &u) == 0) put(g[0], u.gpu / 100.0);
    Memory m{};
    if (n.memory(d, &m) == 0) {
      put(g[1], double(m.total));
      put(g[2], double(m.used));
    }
    unsigned int mw = 0;
    if (n.power(d, &mw) == 0) put(g[3], mw / 1000.0);
    if (n.power_limit(d, &mw) == 0) put(g[4], mw / 1000.0);
  }
  std::string out;
  for (const Gauge& x : g) {
    if (x.lines.empty()) continue;
    out += std::string("# HELP ") + x.name + " " + x.help + "\n# TYPE " + x.name + " gauge\n" + x.lines;
  }
  return out;
}

}  // namespace kiln::serve
