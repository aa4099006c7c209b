// The model repository `kiln serve` serves (Triton's layout): DIR/<model>/<version>/model.kiln, or
// model.onnx built when it loads, and an optional DIR/<model>/config.pbtxt (serve/model_config.h:
// version policy, batching, queue policy, instances). At start every model loads the versions its
// policy selects (the newest one by default); load() and unload() change that while serving, and a
// load that fails leaves the serving versions in place. Each loaded version runs its requests
// through a Scheduler (serve/scheduler.h) over its sessions.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

#include "kiln/kiln.h"
#include "serve/model_config.h"
#include "serve/scheduler.h"

namespace inference {
class ModelConfig;
}

namespace kiln::serve {

struct ServeConfig {
  std::string repository;
  Device device = Device::kAuto;
  Precision precision = Precision::kFp32;  // for model.onnx built at load
  int sessions = 2;                        // per model version, unless its config.pbtxt says
};

// A loaded version of a model: its engine, settings, metrics and the scheduler over its sessions.
class LoadedModel {
 public:
  LoadedModel(std::string name, int64_t version, Engine engine, std::vector<Session> sessions, ModelSettings settings);
  ~LoadedModel();
  const std::string& name() const { return name_; }
  int64_t version() const { return version_; }
  const Engine& engine() const { return engine_; }
  const ModelSettings& settings() const { return settings_; }
  const inference::ModelConfig& config() const { return *config_; }
  ModelMetrics& metrics() { return metrics_; }
  // What it was loaded from (model file, size, modification time, the settings but the version
  // policy): a reload keeps a version whose stamp has not changed (its sessions, graphs and
  // counters) instead of building it again.
  std::string stamp;
  // Runs a request through the scheduler. Throws HttpError as Scheduler::run does; engine errors
  // come back as the Status.
  Expected<std::vector<HostTensor>> infer(const std::vector<TensorView>& inputs, uint64_t timeout_us,
                                          Clock::time_point deadline = Clock::time_point::max(),
                                          const std::vector<OutputTarget>* targets = nullptr) {
    return scheduler_->run(inputs, timeout_us, deadline, targets);
  }
  // The same without waiting (Scheduler::submit): `done` gets the result.
  void submit(const std::vector<TensorView>& inputs, uint64_t timeout_us, Clock::time_point deadline,
              const std::vector<OutputTarget>* targets, Scheduler::Done done) {
    scheduler_->submit(inputs, timeout_us, deadline, targets, std::move(done));
  }

 private:
  std::string name_;
  int64_t version_;
  Engine engine_;
  ModelSettings settings_;
  std::unique_ptr<inference::ModelConfig> config_;
  ModelMetrics metrics_;
  std::unique_ptr<Scheduler> scheduler_;  // last: it drains before the rest goes
};

// Counts one inference request of a model, from its decoding to its answer, when it goes out of
// scope: a success once answered() was called, else a failure (whatever ended it).
class CountedRequest {
 public:
  explicit CountedRequest(LoadedModel& m) : m_(m), t0_(Clock::now()) {}
  ~CountedRequest();
  CountedRequest(const CountedRequest&) = delete;
  CountedRequest& operator=(const CountedRequest&) = delete;
  void answered() { ok_ = true; }

 private:
  LoadedModel& m_;
  Clock::time_point t0_;
  bool ok_ = false;
};

class Repository {
 public:
  explicit Repository(ServeConfig c) : config_(std::move(c)) {}
  // Loads every model folder; a model that fails to load is reported (errors name the folder) and
  // left out, the others serve.
  std::vector<std::string> load_all();
  // A loaded version of `name`: `version` (empty: the newest loaded). Throws HttpError 404 naming
  // what is missing.
  std::shared_ptr<LoadedModel> find(const std::string& name, const std::string& version = "") const;
  // The loaded versions of `name`, ascending (empty when none).
  std::vector<int64_t> loaded_versions(const std::string& name) const;
  // Loads the versions the model's policy selects; the old ones serve until the new ones are ready,
  // and stay when any of them fails. A version already loaded from unchanged files is kept as it is.
  Status load(const std::string& name);
  Status unload(const std::string& name);
  // Every model folder: name, versions on disk, the loaded versions and why it is not loaded.
  struct Entry {
    std::string name;
    std::vector<int64_t> versions;
    std::vector<int64_t> loaded;
    std::string reason;
  };
  std::vector<Entry> index() const;
  // Every loaded model's metrics as Prometheus text (Triton's metric names).
  std::string prometheus() const;

 private:
  Expected<std::shared_ptr<LoadedModel>> open(const std::string& name, int64_t version, const ModelSettings& s) const;
  std::vector<int64_t> versions(const std::string& name) const;
  std::vector<std::string> model_folders(std::error_code& ec) const;  // sorted
  ServeConfig config_;
  mutable std::mutex mu_;
  std::map<std::string, std::map<int64_t, std::shared_ptr<LoadedModel>>> loaded_;
  std::map<std::string, std::string> failed_;
  // Per model: held through a whole load or unload, so two on one model run one after the other
  // (an unload during a load's build cannot be undone by the load finishing after it).
  std::mutex& control(const std::string& name) const;
  mutable std::map<std::string, std::unique_ptr<std::mutex>> control_;
};

}  // namespace kiln::serve
