// The model repository `kiln serve` serves (Triton's layout): DIR/<model>/<version>/model.kiln, or
// model.onnx built when it loads. Every model's highest version is loaded at start; load() and
// unload() change that while serving, and a load that fails leaves the serving version in place.
// A loaded model keeps a pool of sessions; requests take one each (so `sessions` run at once).
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

#include "kiln/kiln.h"

namespace kiln::serve {

struct ServeConfig {
  std::string repository;
  Device device = Device::kAuto;
  Precision precision = Precision::kFp32;  // for model.onnx built at load
  int sessions = 2;                        // per model: requests that run at once
};

// Triton's per-model counters (its names and meanings, so dashboards built for Triton read them):
// requests answered and failed, inferences (batch rows) and executions, and cumulative microseconds
// in the whole request, waiting for a session, and running it.
struct ModelMetrics {
  std::atomic<uint64_t> success{0}, failure{0}, inferences{0}, executions{0};
  std::atomic<uint64_t> request_us{0}, queue_us{0}, compute_us{0};
};

// A loaded version of a model with its session pool.
class LoadedModel {
 public:
  LoadedModel(std::string name, int64_t version, Engine engine, std::vector<Session> sessions)
      : name_(std::move(name)), version_(version), engine_(std::move(engine)), free_(std::move(sessions)) {}
  const std::string& name() const { return name_; }
  int64_t version() const { return version_; }
  const Engine& engine() const { return engine_; }
  // Runs on a free session (waiting for one), counting the wait and the run in metrics().
  Expected<std::vector<HostTensor>> run(const std::vector<TensorView>& inputs);
  ModelMetrics& metrics() { return metrics_; }

 private:
  std::string name_;
  int64_t version_;
  Engine engine_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Session> free_;
  ModelMetrics metrics_;
};

class Repository {
 public:
  explicit Repository(ServeConfig c) : config_(std::move(c)) {}
  // Loads every model folder's highest version; errors name the folder. A model that fails to load
  // is reported and left out (the others serve).
  std::vector<std::string> load_all();
  // The serving version of `name` (null when none is loaded).
  std::shared_ptr<LoadedModel> get(const std::string& name) const;
  // Loads the highest version of `name` (or `version` when > 0); the old one serves until the new
  // one is ready, and stays when the new one fails.
  Status load(const std::string& name, int64_t version = 0);
  Status unload(const std::string& name);
  // Every model folder: name, versions on disk, the loaded version (0 when none) and its state.
  struct Entry {
    std::string name;
    std::vector<int64_t> versions;
    int64_t loaded = 0;
    std::string reason;  // why it is not loaded
  };
  std::vector<Entry> index() const;
  // Every loaded model's metrics as Prometheus text (Triton's metric names).
  std::string prometheus() const;

 private:
  Expected<std::shared_ptr<LoadedModel>> open(const std::string& name, int64_t version) const;
  std::vector<int64_t> versions(const std::string& name) const;
  std::vector<std::string> model_folders(std::error_code& ec) const;  // sorted
  ServeConfig config_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<LoadedModel>> loaded_;
  std::map<std::string, std::string> failed_;
};

}  // namespace kiln::serve
