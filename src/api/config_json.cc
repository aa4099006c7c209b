// BuildConfig as JSON (the engine file's record of how it was built) and the names of its enums.
#include <set>

#include "api/engine_impl.h"
#include "support/status.h"

namespace kiln {

nlohmann::json config_to_json(const BuildConfig& c) {
  nlohmann::json j;
  j["device"] = std::string(device_name(c.device));
  j["precision"] = std::string(precision_name(c.precision));
  j["shapes"] = c.shapes;
  j["batch"] = c.batch;
  nlohmann::json ranges = nlohmann::json::object();
  for (const auto& [name, dims] : c.shape_ranges) {
    nlohmann::json a = nlohmann::json::array();
    for (const DimRange& r : dims) a.push_back({r.min, r.max, r.opt});
    ranges[name] = a;
  }
  j["shape_ranges"] = ranges;
  if (!c.warm_shapes.empty()) j["warm_shapes"] = c.warm_shapes;
  j["disabled_passes"] = c.disabled_passes;
  j["autotune"] = c.autotune;
  j["cuda_graph"] = c.cuda_graph;
  j["workspace_bytes"] = c.workspace_bytes;
  j["memory_budget_bytes"] = c.memory_budget_bytes;
  j["tensor_parallel"] = c.tensor_parallel;
  j["micro_batches"] = c.micro_batches;
  j["deterministic"] = c.deterministic;
  j["target"] = std::string(target_name(c.target));
  j["timing_cache"] = c.timing_cache;
  j["gemm_sm90"] = c.gemm_sm90;
  j["gemm_sm90_tile"] = c.gemm_sm90_tile;
  return j;
}

Expected<BuildConfig> config_from_json(const nlohmann::json& j) {
  if (!j.is_object()) return KILN_ERROR(kInvalidModel, "build configuration is not a JSON object");
  static const std::set<std::string> kKeys = {"device", "precision", "shapes", "batch", "shape_ranges", "warm_shapes", "disabled_passes", "autotune",
                                              "cuda_graph", "workspace_bytes", "memory_budget_bytes", "timing_cache", "gemm_sm90",
                                              "gemm_sm90_tile", "tensor_parallel", "micro_batches",
                                              "deterministic", "target"};
  for (const auto& [k, v] : j.items()) {
    if (!kKeys.count(k)) return KILN_ERROR(kInvalidModel, "build configuration has an unknown field '{}'", k);
  }
  BuildConfig c;
  try {
    std::string dev = j.at("device").get<std::string>();
    if (dev == "auto") c.device = Device::kAuto;
    else if (dev == "cpu") c.device = Device::kCpu;
    else if (dev == "cuda") c.device = Device::kCuda;
    else if (dev == "cpu-ref") c.device = Device::kCpuRef;
    else return KILN_ERROR(kInvalidModel, "build configuration: unknown device '{}'", dev);
    std::string prec = j.at("precision").get<std::string>();
    bool found = false;
    for (Precision p : {Precision::kFp32, Precision::kTf32, Precision::kFp16, Precision::kBf16}) {
      if (prec == precision_name(p)) c.precision = p, found = true;
    }
    if (!found) return KILN_ERROR(kInvalidModel, "build configuration: unknown precision '{}'", prec);
    c.shapes = j.at("shapes").get<std::map<std::string, std::vector<int64_t>>>();
    c.batch = j.at("batch").get<int64_t>();
    if (j.contains("shape_ranges")) {  // engine files written before ranges existed have none
      for (const auto& [name, a] : j.at("shape_ranges").items()) {
        std::vector<DimRange> dims;
        for (const auto& r : a) dims.push_back(DimRange{r.at(0).get<int64_t>(), r.at(1).get<int64_t>(), r.at(2).get<int64_t>()});
        c.shape_ranges[name] = std::move(dims);
      }
    }
    if (j.contains("warm_shapes")) {
      c.warm_shapes = j.at("warm_shapes").get<std::vector<std::map<std::string, std::vector<int64_t>>>>();
    }
    c.disabled_passes = j.at("disabled_passes").get<std::vector<std::string>>();
    c.autotune = j.at("autotune").get<bool>();
    c.cuda_graph = j.at("cuda_graph").get<bool>();
    c.workspace_bytes = j.at("workspace_bytes").get<size_t>();
    c.memory_budget_bytes = j.at("memory_budget_bytes").get<size_t>();
    c.timing_cache = j.at("timing_cache").get<std::string>();
    c.gemm_sm90 = j.at("gemm_sm90").get<int>();
    c.gemm_sm90_tile = j.at("gemm_sm90_tile").get<int>();
    c.tensor_parallel = j.value("tensor_parallel", 1);  // absent in engine files of one rank before it existed
    c.micro_batches = j.value("micro_batches", 1);       // absent before micro-batches existed
    c.deterministic = j.value("deterministic", false);   // absent before it existed
    const std::string target = j.value("target", "server");
    if (target == "edge") c.target = Target::kEdge;
    else if (target != "server") return KILN_ERROR(kInvalidModel, "build configuration: unknown target '{}'", target);
  } catch (const nlohmann::json::exception& e) {
    return KILN_ERROR(kInvalidModel, "build configuration: {}", e.what());
  }
  if (Status s = validate_config(c); !s) return KILN_ERROR(kInvalidModel, "build configuration: {}", s.message());
  return c;
}

}  // namespace kiln
