// `kiln plan-parallel model.onnx --gpus 1,2,4,8 [--shapes ...|--batch N] [--fp16] [--link-gbps G]`:
// per GPU count, what one GPU holds and what the ranks exchange (api/plan_parallel.h), the
// communication time from a link bandwidth, and, where this machine has the GPUs, the all-reduce
// measured through NCCL at the model's message size beside the estimate.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "api/plan_parallel.h"
#include "cli.h"

namespace kiln::cli {

int plan_parallel_main(const LoadOptions& load, const EngineOptions& eng, const PlanParallelOptions& opt) {
  auto config = build_config(load, eng, opt.batch);
  if (!config) return fail(config.status());
  auto rows = estimate_parallel(load.model, *config, opt.gpus);
  if (!rows) return fail(rows.status());
  const double mib = 1 << 20;
  std::printf("tensor-parallel estimate for %s (%s; %.0f tokens per forward)\n", load.model.c_str(),
              std::string(precision_name(config->precision)).c_str(), rows->front().tokens);
  std::printf("%5s %12s %12s %12s %6s %6s %12s %12s %12s %14s %14s\n", "gpus", "weights/GPU", "activ./GPU", "KV/token/GPU",
              "allred", "gather", "payload/fwd", "bus/GPU/fwd", "bus/token", "est. comm/fwd", "measured/fwd");
  nlohmann::json out = nlohmann::json::array();
  for (const ParallelEstimate& e : *rows) {
    std::string est = "-", measured = "-";
    double est_ms = -1, measured_ms = -1, busbw = -1;
    if (e.gpus > 1 && opt.link_gbps > 0) {
      est_ms = e.bus_bytes / (opt.link_gbps * 1e9) * 1e3;
      est = fmt::format("{:.3f} ms", est_ms);
    }
    if (e.gpus > 1 && e.all_reduces > 0 && !opt.no_measure) {
      const size_t msg = e.payload_bytes / size_t(e.all_reduces + e.all_gathers);
      auto ms = measure_all_reduce_ms(e.gpus, msg, 50);
      if (ms) {
        measured_ms = *ms * double(e.all_reduces + e.all_gathers);
        busbw = 2.0 * (e.gpus - 1) / e.gpus * double(msg) / (*ms * 1e-3) / 1e9;
        measured = fmt::format("{:.3f} ms", measured_ms);
      } else if (ms.status().code() != ErrorCode::kUnsupported) {
        return fail(ms.status());
      }
    }
    std::printf("%5d %9.1f MiB %9.1f MiB %9.1f KiB %6d %6d %8.2f MiB %8.2f MiB %8.1f KiB %14s %14s\n", e.gpus,
                double(e.weight_bytes) / mib, double(e.activation_bytes) / mib, e.kv_bytes_per_token / 1024, e.all_reduces,
                e.all_gathers, double(e.payload_bytes) / mib, e.bus_bytes / mib, e.bus_bytes / e.tokens / 1024, est.c_str(),
                measured.c_str());
    if (busbw > 0) std::printf("      measured: %d collectives of %.2f MiB, NCCL bus bandwidth %.1f GB/s\n",
                               e.all_reduces + e.all_gathers, double(e.payload_bytes) / (e.all_reduces + e.all_gathers) / mib, busbw);
    for (const std::string& k : e.kept_whole) std::printf("      kept whole: %s\n", k.c_str());
    out.push_back({{"gpus", e.gpus}, {"weight_bytes", e.weight_bytes}, {"activation_bytes", e.activation_bytes},
                   {"kv_bytes_per_token", e.kv_bytes_per_token}, {"tokens", e.tokens}, {"all_reduces", e.all_reduces},
                   {"all_gathers", e.all_gathers}, {"payload_bytes", e.payload_bytes}, {"bus_bytes", e.bus_bytes},
                   {"estimated_comm_ms", est_ms}, {"measured_comm_ms", measured_ms}, {"measured_bus_gbps", busbw},
                   {"kept_whole", e.kept_whole}});
  }
  if (opt.link_gbps <= 0) std::printf("(--link-gbps G gives the estimate a link bandwidth)\n");
  if (!opt.json.empty()) {
    std::ofstream f(opt.json);
    f << out.dump(2) << "\n";
    if (!f) return fail(KILN_ERROR(kInvalidArgument, "cannot write {}", opt.json));
  }
  return 0;
}

}  // namespace kiln::cli
