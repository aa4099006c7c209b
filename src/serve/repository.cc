#include "serve/repository.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "model_config.pb.h"

#include "frontend/onnx/importer.h"
#include "support/status.h"

namespace kiln::serve {

namespace fs = std::filesystem;

LoadedModel::LoadedModel(std::string name, int64_t version, Engine engine, std::vector<Session> sessions,
                         ModelSettings settings)
    : name_(std::move(name)), version_(version), engine_(std::move(engine)), settings_(std::move(settings)),
      config_(std::make_unique<inference::ModelConfig>()) {
  complete_config(settings_, engine_, name_, int(sessions.size()), config_.get());
  scheduler_ = std::make_unique<Scheduler>(std::move(sessions), settings_, metrics_, engine_.outputs(),
                                           engine_.device() == Device::kCuda);
}

LoadedModel::~LoadedModel() = default;

CountedRequest::~CountedRequest() {
  (ok_ ? m_.metrics().success : m_.metrics().failure) += 1;
  m_.metrics().request_us += uint64_t(std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0_).count());
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

namespace {

// The model file a version folder serves, its size and modification time, and the settings'
// fingerprint ("" when the folder has no model file).
std::string version_stamp(const fs::path& dir, const std::string& fingerprint) {
  std::error_code ec;
  for (const char* f : {"model.kiln", "model.onnx"}) {
    const fs::path p = dir / f;
    if (!fs::exists(p, ec)) continue;
    const auto size = fs::file_size(p, ec);
    const auto time = fs::last_write_time(p, ec).time_since_epoch().count();
    return p.string() + "\n" + std::to_string(size) + "\n" + std::to_string(time) + "\n" + fingerprint;
  }
  return "";
}

// With max_batch_size > 0 and no `input` entry for some of a model.onnx's inputs (Triton's
// auto-completed configuration), their dims past the batch come from the model file, so the build
// ranges dim 0 of every input (ModelSettings::build_ranges).
Status complete_input_dims(const fs::path& onnx, ModelSettings& s) {
  if (s.max_batch_size <= 0) return Status::ok();
  ImportOptions opt;
  opt.infer = false;
  KILN_ASSIGN_OR_RETURN(Model m, import_onnx_file(onnx.string(), opt));
  for (const Value* v : m.graph->inputs) {
    // A fixed dim 0 is not a batch: check_settings says so once the model is built.
    if (s.input_dims.count(v->name) || !v->type.shape || v->type.shape->rank() == 0 || v->type.shape->dims[0].is_static()) {
      continue;
    }
    std::vector<int64_t> dims;
    for (size_t k = 1; k < v->type.shape->rank(); ++k) {
      const Dim& d = v->type.shape->dims[k];
      dims.push_back(d.is_static() ? d.value() : -1);
    }
    s.input_dims[v->name] = std::move(dims);
  }
  return Status::ok();
}

}  // namespace

Expected<std::shared_ptr<LoadedModel>> Repository::open(const std::string& name, int64_t version,
                                                       const ModelSettings& settings) const {
  fs::path dir = fs::path(config_.repository) / name / std::to_string(version);
  Expected<Engine> e = [&] {
    if (fs::exists(dir / "model.kiln")) return Engine::load((dir / "model.kiln").string());
    BuildConfig c;
    c.device = settings.device.value_or(config_.device);
    c.precision = settings.precision.value_or(config_.precision);
    ModelSettings full = settings;
    if (Status st = complete_input_dims(dir / "model.onnx", full); !st) return Expected<Engine>(st);
    c.shape_ranges = full.build_ranges();
    return build((dir / "model.onnx").string(), c);
  }();
  if (!e) return e.status();
  KILN_RETURN_IF_ERROR(check_settings(settings, *e, name));
  ModelSettings chosen = settings;
  choose_batch_sizes(chosen, e->device());
  std::vector<Session> sessions;
  for (int i = 0; i < std::max(1, settings.instances ? settings.instances : config_.sessions); ++i) {
    KILN_ASSIGN_OR_RETURN(Session s, e->create_session());
    sessions.push_back(std::move(s));
  }
  return std::make_shared<LoadedModel>(name, version, std::move(*e), std::move(sessions), chosen);
}

std::mutex& Repository::control(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto& m = control_[name];
  if (!m) m = std::make_unique<std::mutex>();
  return *m;
}

Status Repository::load(const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
    return Status(ErrorCode::kInvalidArgument, "'" + name + "' is not a model name");
  }
  if (std::error_code ec; !fs::is_directory(fs::path(config_.repository) / name, ec)) {
    return Status(ErrorCode::kInvalidArgument, "model '" + name + "': no folder " +
                                                   (fs::path(config_.repository) / name).string());
  }
  std::lock_guard<std::mutex> serial(control(name));  // only names with a folder get one
  const fs::path folder = fs::path(config_.repository) / name;
  auto fail = [&](Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    failed_[name] = s.message();
    return s;
  };
  std::vector<std::string> warnings;
  Expected<ModelSettings> settings = read_model_settings(folder.string(), &warnings);
  for (const std::string& w : warnings) std::fprintf(stderr, "kiln: warning: %s\n", w.c_str());
  if (!settings) return fail(settings.status().with_context("model '" + name + "'"));
  const std::vector<int64_t> on_disk = versions(name);
  if (on_disk.empty()) {
    return fail(Status(ErrorCode::kInvalidArgument,
                       "model '" + name + "': no version folder with model.kiln or model.onnx in " + folder.string()));
  }
  const std::vector<int64_t> wanted = settings->select(on_disk);
  if (wanted.empty()) {
    return fail(Status(ErrorCode::kInvalidArgument, "model '" + name + "': its version_policy selects none of the versions on disk"));
  }
  std::map<int64_t, std::shared_ptr<LoadedModel>> current;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = loaded_.find(name); it != loaded_.end()) current = it->second;
  }
  // Outside the lock: the serving versions keep serving meanwhile.
  std::map<int64_t, std::shared_ptr<LoadedModel>> fresh;
  for (int64_t v : wanted) {
    const std::string stamp = version_stamp(folder / std::to_string(v), settings->fingerprint());
    if (auto it = current.find(v); it != current.end() && !stamp.empty() && it->second->stamp == stamp) {
      fresh[v] = it->second;
      continue;
    }
    auto m = open(name, v, *settings);
    if (!m) return fail(m.status().with_context("model '" + name + "' version " + std::to_string(v)));
    (*m)->stamp = stamp;
    fresh[v] = std::move(*m);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed_.erase(name);
    loaded_[name].swap(fresh);  // `fresh` now holds the old versions: they go when their last request is answered
  }
  return Status::ok();
}

Status Repository::unload(const std::string& name) {
  if (loaded_versions(name).empty()) return Status(ErrorCode::kInvalidArgument, "model '" + name + "' is not loaded");
  std::lock_guard<std::mutex> serial(control(name));
  std::map<int64_t, std::shared_ptr<LoadedModel>> gone;  // destroyed after the lock is released
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = loaded_.find(name);
    if (it == loaded_.end()) return Status(ErrorCode::kInvalidArgument, "model '" + name + "' is not loaded");
    gone.swap(it->second);
    loaded_.erase(it);
  }
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

std::shared_ptr<LoadedModel> Repository::find(const std::string& name, const std::string& version) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = loaded_.find(name);
  if (it == loaded_.end() || it->second.empty()) {
    throw HttpError{404, "model '" + name + "' is not loaded (`POST /v2/repository/index` lists the repository)"};
  }
  if (version.empty()) return it->second.rbegin()->second;
  const bool number = version.size() <= 18 && version.find_first_not_of("0123456789") == std::string::npos;
  auto v = number ? it->second.find(std::stoll(version)) : it->second.end();
  if (v == it->second.end()) {
    std::string have;
    for (const auto& [k, m] : it->second) have += (have.empty() ? "" : ", ") + std::to_string(k);
    throw HttpError{404, "model '" + name + "' version " + version + " is not loaded (loaded: " + have + ")"};
  }
  return v->second;
}

std::vector<int64_t> Repository::loaded_versions(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> v;
  if (auto it = loaded_.find(name); it != loaded_.end()) {
    for (const auto& [k, m] : it->second) v.push_back(k);
  }
  return v;
}

std::vector<Repository::Entry> Repository::index() const {
  std::vector<Entry> out;
  std::error_code ec;
  const std::vector<std::string> names = model_folders(ec);
  for (const std::string& n : names) {
    Entry e{n, versions(n), loaded_versions(n), ""};
    std::lock_guard<std::mutex> lock(mu_);
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
      {"nv_inference_count", "Number of inferences performed (batch rows; one per request for unbatched models)",
       &ModelMetrics::inferences},
      {"nv_inference_exec_count", "Number of model executions performed (a batch of requests is one)", &ModelMetrics::executions},
      {"nv_inference_request_duration_us", "Cumulative inference request duration in microseconds", &ModelMetrics::request_us},
      {"nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds", &ModelMetrics::queue_us},
      {"nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds",
       &ModelMetrics::compute_us},
  };
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const Metric& m : kMetrics) {
    out += std::string("# HELP ") + m.name + " " + m.help + "\n# TYPE " + m.name + " counter\n";
    for (const auto& [name, versions] : loaded_) {
      for (const auto& [v, model] : versions) {
        out += std::string(m.name) + "{model=\"" + name + "\",version=\"" + std::to_string(v) + "\"} " +
               std::to_string((model->metrics().*m.field).load()) + "\n";
      }
    }
  }
  return out;
}

}  // namespace kiln::serve
