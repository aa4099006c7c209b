#include "serve/repository.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "support/status.h"

namespace kiln::serve {

namespace fs = std::filesystem;

namespace {

uint64_t us_since(std::chrono::steady_clock::time_point t) {
  return uint64_t(std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t).count());
}

}  // namespace

Expected<std::vector<HostTensor>> LoadedModel::run(const std::vector<TensorView>& inputs) {
  auto t0 = std::chrono::steady_clock::now();
  Session s = [&] {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !free_.empty(); });
    Session taken = std::move(free_.back());
    free_.pop_back();
    return taken;
  }();
  metrics_.queue_us += us_since(t0);
  auto t1 = std::chrono::steady_clock::now();
  auto out = s.run(inputs);
  metrics_.compute_us += us_since(t1);
  metrics_.executions += 1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(std::move(s));
  }
  cv_.notify_one();
  return out;
}

std::vector<int64_t> Repository::versions(const std::string& name) const {
  std::vector<int64_t> v;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(config_.repository) / name, ec)) {
    const std::string s = e.path().filename().string();
    if (!e.is_directory() || s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string::npos) continue;
    if (fs::exists(e.path() / "model.kiln") || fs::exists(e.path() / "model.onnx")) v.push_back(std::stoll(s));
  }
  std::sort(v.begin(), v.end());
  return v;
}

Expected<std::shared_ptr<LoadedModel>> Repository::open(const std::string& name, int64_t version) const {
  fs::path dir = fs::path(config_.repository) / name / std::to_string(version);
  Expected<Engine> e = [&] {
    if (fs::exists(dir / "model.kiln")) return Engine::load((dir / "model.kiln").string());
    BuildConfig c;
    c.device = config_.device;
    c.precision = config_.precision;
    return build((dir / "model.onnx").string(), c);
  }();
  if (!e) return e.status();
  std::vector<Session> sessions;
  for (int i = 0; i < std::max(1, config_.sessions); ++i) {
    KILN_ASSIGN_OR_RETURN(Session s, e->create_session());
    sessions.push_back(std::move(s));
  }
  return std::make_shared<LoadedModel>(name, version, std::move(*e), std::move(sessions));
}

Status Repository::load(const std::string& name, int64_t version) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
    return Status(ErrorCode::kInvalidArgument, "'" + name + "' is not a model name");
  }
  std::vector<int64_t> v = versions(name);
  if (v.empty()) {
    return Status(ErrorCode::kInvalidArgument, "model '" + name + "': no version folder with model.kiln or model.onnx in " +
                                                   (fs::path(config_.repository) / name).string());
  }
  if (version <= 0) version = v.back();
  else if (std::find(v.begin(), v.end(), version) == v.end()) {
    return Status(ErrorCode::kInvalidArgument, "model '" + name + "' has no version " + std::to_string(version));
  }
  auto m = open(name, version);  // outside the lock: the serving version keeps serving meanwhile
  std::lock_guard<std::mutex> lock(mu_);
  if (!m) {
    Status s = m.status().with_context("model '" + name + "' version " + std::to_string(version));
    failed_[name] = s.message();
    return s;
  }
  failed_.erase(name);
  loaded_[name] = std::move(*m);
  return Status::ok();
}

Status Repository::unload(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!loaded_.erase(name)) return Status(ErrorCode::kInvalidArgument, "model '" + name + "' is not loaded");
  return Status::ok();
}

std::vector<std::string> Repository::model_folders(std::error_code& ec) const {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(config_.repository, ec)) {
    if (e.is_directory()) names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> Repository::load_all() {
  std::vector<std::string> errors;
  std::error_code ec;
  const std::vector<std::string> names = model_folders(ec);
  if (ec) errors.push_back(config_.repository + ": " + ec.message());
  for (const std::string& n : names) {
    if (Status s = load(n); !s) errors.push_back(s.message());
  }
  return errors;
}

std::shared_ptr<LoadedModel> Repository::get(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = loaded_.find(name);
  return it == loaded_.end() ? nullptr : it->second;
}

std::vector<Repository::Entry> Repository::index() const {
  std::vector<Entry> out;
  std::error_code ec;
  const std::vector<std::string> names = model_folders(ec);
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& n : names) {
    Entry e{n, versions(n), 0, ""};
    if (auto it = loaded_.find(n); it != loaded_.end()) e.loaded = it->second->version();
    if (auto it = failed_.find(n); it != failed_.end()) e.reason = it->second;
    out.push_back(std::move(e));
  }
  return out;
}

std::string Repository::prometheus() const {
  struct Metric {
    const char* name;
    const char* help;
    std::atomic<uint64_t> ModelMetrics::*field;
  };
  static const Metric kMetrics[] = {
      {"nv_inference_request_success", "Number of successful inference requests, all batch sizes", &ModelMetrics::success},
      {"nv_inference_request_failure", "Number of failed inference requests, all batch sizes", &ModelMetrics::failure},
      {"nv_inference_count", "Number of inferences performed (batch rows)", &ModelMetrics::inferences},
      {"nv_inference_exec_count", "Number of model executions performed", &ModelMetrics::executions},
      {"nv_inference_request_duration_us", "Cumulative inference request duration in microseconds", &ModelMetrics::request_us},
      {"nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds", &ModelMetrics::queue_us},
      {"nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds",
       &ModelMetrics::compute_us},
  };
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const Metric& m : kMetrics) {
    out += std::string("# HELP ") + m.name + " " + m.help + "\n# TYPE " + m.name + " counter\n";
    for (const auto& [name, model] : loaded_) {
      out += std::string(m.name) + "{model=\"" + name + "\",version=\"" + std::to_string(model->version()) + "\"} " +
             std::to_string((model->metrics().*m.field).load()) + "\n";
    }
  }
  return out;
}

}  // namespace kiln::serve
