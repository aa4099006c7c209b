#include "serve/model_config.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "model_config.pb.h"
#include "support/status.h"

namespace kiln::serve {

namespace fs = std::filesystem;

namespace {

inference::DataType proto_type(DType t) {
  switch (t) {
    case DType::kBool: return inference::TYPE_BOOL;
    case DType::kUInt8: return inference::TYPE_UINT8;
    case DType::kUInt16: return inference::TYPE_UINT16;
    case DType::kUInt32: return inference::TYPE_UINT32;
    case DType::kUInt64: return inference::TYPE_UINT64;
    case DType::kInt8: return inference::TYPE_INT8;
    case DType::kInt16: return inference::TYPE_INT16;
    case DType::kInt32: return inference::TYPE_INT32;
    case DType::kInt64: return inference::TYPE_INT64;
    case DType::kFloat16: return inference::TYPE_FP16;
    case DType::kFloat32: return inference::TYPE_FP32;
    case DType::kFloat64: return inference::TYPE_FP64;
    case DType::kBFloat16: return inference::TYPE_BF16;
    case DType::kString: return inference::TYPE_STRING;
    default: return inference::TYPE_INVALID;
  }
}

// Collects the parser's first error (with its position) and every warning.
class Collector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column, const std::string& message) override {
    if (error.empty()) error = "line " + std::to_string(line + 1) + ", column " + std::to_string(column + 1) + ": " + message;
  }
  void AddWarning(int line, google::protobuf::io::ColumnNumber column, const std::string& message) override {
    warnings.push_back("line " + std::to_string(line + 1) + ", column " + std::to_string(column + 1) + ": " + message);
  }
  std::string error;
  std::vector<std::string> warnings;
};

Expected<Precision> precision_named(const std::string& p) {
  if (p == "fp32") return Precision::kFp32;
  if (p == "tf32") return Precision::kTf32;
  if (p == "fp16") return Precision::kFp16;
  if (p == "bf16") return Precision::kBf16;
  return Status(ErrorCode::kInvalidArgument, "parameter 'precision' is '" + p + "', not fp32, tf32, fp16 or bf16");
}

Expected<Device> device_named(const std::string& d) {
  if (d == "auto") return Device::kAuto;
  if (d == "cpu") return Device::kCpu;
  if (d == "cpu-ref") return Device::kCpuRef;
  if (d == "cuda") return Device::kCuda;
  return Status(ErrorCode::kInvalidArgument, "parameter 'device' is '" + d + "', not auto, cpu, cpu-ref or cuda");
}

std::string dims_text(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

// The dims a config states for an engine tensor: without the batch dim when batching, -1 where open.
std::vector<int64_t> config_dims(const TensorInfo& t, bool batched) {
  std::vector<int64_t> d;
  for (size_t k = batched ? 1 : 0; k < t.shape.size(); ++k) d.push_back(t.shape[k] < 0 ? -1 : t.shape[k]);
  return d;
}

// A tensor the file lists must name one of the engine's, with its type and dims (-1 matches any).
template <typename Listed>
Status check_listed(const Listed& listed, const std::vector<TensorInfo>& infos, bool batched, const char* what,
                    const std::string& model) {
  for (const auto& l : listed) {
    auto it = std::find_if(infos.begin(), infos.end(), [&](const TensorInfo& t) { return t.name == l.name(); });
    if (it == infos.end()) {
      return Status(ErrorCode::kInvalidArgument, "model '" + model + "': config.pbtxt lists " + what + " '" + l.name() +
                                                     "', which the model does not have");
    }
    if (l.data_type() != inference::TYPE_INVALID && l.data_type() != proto_type(it->dtype)) {
      return Status(ErrorCode::kInvalidArgument, "model '" + model + "': config.pbtxt gives " + what + " '" + l.name() + "' " +
                                                     inference::DataType_Name(l.data_type()) + ", the model has " +
                                                     inference::DataType_Name(proto_type(it->dtype)));
    }
    const std::vector<int64_t> have = config_dims(*it, batched);
    bool same = int64_t(have.size()) == l.dims_size();
    for (int k = 0; same && k < l.dims_size(); ++k) same = l.dims(k) == -1 || have[size_t(k)] == -1 || l.dims(k) == have[size_t(k)];
    if (!same && l.dims_size() > 0) {
      return Status(ErrorCode::kInvalidArgument, "model '" + model + "': config.pbtxt gives " + what + " '" + l.name() +
                                                     "' dims " + dims_text({l.dims().begin(), l.dims().end()}) +
                                                     ", the model has " + dims_text(have) +
                                                     (batched ? " (without the batch dim)" : ""));
    }
  }
  return Status::ok();
}

}  // namespace

std::vector<int64_t> ModelSettings::select(const std::vector<int64_t>& on_disk) const {
  switch (policy) {
    case Policy::kAll: return on_disk;
    case Policy::kSpecific: {
      std::vector<int64_t> v;
      for (int64_t x : on_disk) {
        if (std::find(specific.begin(), specific.end(), x) != specific.end()) v.push_back(x);
      }
      return v;
    }
    case Policy::kLatest:
    default: {
      size_t n = std::min<size_t>(on_disk.size(), std::max<uint32_t>(latest, 1));
      return std::vector<int64_t>(on_disk.end() - std::ptrdiff_t(n), on_disk.end());
    }
  }
}

std::string ModelSettings::fingerprint() const {
  std::string f = std::to_string(max_batch_size) + "|" + std::to_string(dynamic_batching) + "|" +
                  std::to_string(max_queue_delay_us) + "|" + std::to_string(default_timeout_us) + "|" +
                  std::to_string(allow_timeout_override) + "|" + std::to_string(reject_on_timeout) + "|" +
                  std::to_string(max_queue_size) + "|" + std::to_string(instances) + "|" +
                  (precision ? std::string(precision_name(*precision)) : "-") + "|" +
                  (device ? std::string(device_name(*device)) : "-") + "|";
  for (int b : preferred_batch_sizes) f += std::to_string(b) + ",";
  for (const auto& [name, dims] : input_dims) {
    f += "|" + name + ":";
    for (int64_t d : dims) f += std::to_string(d) + ",";
  }
  return f;
}

std::map<std::string, std::vector<DimRange>> ModelSettings::build_ranges() const {
  std::map<std::string, std::vector<DimRange>> out;
  if (max_batch_size <= 0) return out;
  for (const auto& [name, dims] : input_dims) {
    std::vector<DimRange> r = {DimRange{1, max_batch_size, 0}};
    bool fixed = true;
    for (int64_t d : dims) {
      fixed = fixed && d > 0;
      r.push_back(DimRange{d, d, 0});
    }
    if (fixed) out[name] = std::move(r);
  }
  return out;
}

Expected<ModelSettings> read_model_settings(const std::string& model_dir, std::vector<std::string>* warnings) {
  ModelSettings s;
  const fs::path file = fs::path(model_dir) / "config.pbtxt";
  std::error_code ec;
  if (!fs::exists(file, ec)) return s;
  std::ifstream in(file, std::ios::binary);
  std::stringstream buf;
  buf << in.rdbuf();
  if (!in && !in.eof()) return Status(ErrorCode::kIo, file.string() + ": cannot be read");
  s.text = buf.str();
  if (s.text.size() > (size_t(1) << 20)) return Status(ErrorCode::kInvalidArgument, file.string() + ": larger than 1 MiB");

  inference::ModelConfig c;
  google::protobuf::TextFormat::Parser parser;
  Collector errors;
  parser.RecordErrorsTo(&errors);
  parser.AllowUnknownField(true);
  if (!parser.ParseFromString(s.text, &c)) {
    return Status(ErrorCode::kInvalidArgument, file.string() + ": " + (errors.error.empty() ? "not a model configuration" : errors.error));
  }
  if (warnings) {
    for (const std::string& w : errors.warnings) warnings->push_back(file.string() + ": " + w);
  }
  auto bad = [&](const std::string& m) { return Status(ErrorCode::kInvalidArgument, file.string() + ": " + m); };
  const std::string folder = fs::path(model_dir).filename().string();
  if (!c.name().empty() && c.name() != folder) {
    return bad("name '" + c.name() + "' is not the model's folder name '" + folder + "'");
  }
  if (c.max_batch_size() < 0) return bad("max_batch_size " + std::to_string(c.max_batch_size()) + " is negative");
  s.max_batch_size = c.max_batch_size();
  if (c.has_dynamic_batching()) {
    const auto& d = c.dynamic_batching();
    if (s.max_batch_size == 0) return bad("dynamic_batching needs max_batch_size > 0 (dim 0 of the inputs is the batch)");
    s.dynamic_batching = true;
    for (int p : d.preferred_batch_size()) {
      if (p < 1 || p > s.max_batch_size) {
        return bad("preferred_batch_size " + std::to_string(p) + " is not in 1.." + std::to_string(s.max_batch_size));
      }
      s.preferred_batch_sizes.push_back(p);
    }
    std::sort(s.preferred_batch_sizes.begin(), s.preferred_batch_sizes.end());
    if (d.max_queue_delay_microseconds() > 60'000'000) {
      return bad("max_queue_delay_microseconds " + std::to_string(d.max_queue_delay_microseconds()) + " is over a minute");
    }
    s.max_queue_delay_us = d.max_queue_delay_microseconds();
    if (d.has_default_queue_policy()) {
      const auto& q = d.default_queue_policy();
      s.default_timeout_us = q.default_timeout_microseconds();
      s.allow_timeout_override = q.allow_timeout_override();
      s.reject_on_timeout = q.timeout_action() == inference::ModelQueuePolicy::REJECT;
      s.max_queue_size = q.max_queue_size();
    }
  }
  int instances = 0;
  for (const auto& g : c.instance_group()) {
    if (g.count() < 0 || g.count() > 1024) return bad("instance_group count " + std::to_string(g.count()) + " is not in 0..1024");
    instances += g.count() ? g.count() : 1;
  }
  if (instances > 1024) return bad("instance_group counts add up to " + std::to_string(instances) + ", over 1024");
  s.instances = instances;
  if (c.has_version_policy()) {
    const auto& v = c.version_policy();
    if (v.has_all()) {
      s.policy = ModelSettings::Policy::kAll;
    } else if (v.has_specific()) {
      s.policy = ModelSettings::Policy::kSpecific;
      s.specific.assign(v.specific().versions().begin(), v.specific().versions().end());
      if (s.specific.empty()) return bad("version_policy specific lists no versions");
    } else if (v.has_latest()) {
      if (v.latest().num_versions() < 1) return bad("version_policy latest num_versions must be at least 1");
      s.latest = v.latest().num_versions();
    }
  }
  for (const auto& i : c.input()) s.input_dims[i.name()] = {i.dims().begin(), i.dims().end()};
  for (const auto& [key, value] : c.parameters()) {
    if (key == "precision") {
      auto p = precision_named(value.string_value());
      if (!p) return bad(p.status().message());
      s.precision = *p;
    } else if (key == "device") {
      auto d = device_named(value.string_value());
      if (!d) return bad(d.status().message());
      s.device = *d;
    } else if (warnings) {
      warnings->push_back(file.string() + ": parameter '" + key + "' means nothing to kiln; skipped");
    }
  }
  return s;
}

void choose_batch_sizes(ModelSettings& s, Device device) {
  s.batch_sizes.clear();
  if (!s.dynamic_batching) return;
  if (device != Device::kCuda) return;
  for (int64_t b = 1; b < s.max_batch_size; b *= 2) s.batch_sizes.push_back(int(b));
  s.batch_sizes.push_back(s.max_batch_size);
  s.batch_sizes.insert(s.batch_sizes.end(), s.preferred_batch_sizes.begin(), s.preferred_batch_sizes.end());
  std::sort(s.batch_sizes.begin(), s.batch_sizes.end());
  s.batch_sizes.erase(std::unique(s.batch_sizes.begin(), s.batch_sizes.end()), s.batch_sizes.end());
}

Status check_settings(const ModelSettings& s, const Engine& e, const std::string& model) {
  const bool batched = s.max_batch_size > 0;
  if (batched) {
    for (const auto* list : {&e.inputs(), &e.outputs()}) {
      for (const TensorInfo& t : *list) {
        const char* what = list == &e.inputs() ? "input" : "output";
        if (t.shape.empty() || t.shape[0] >= 0) {
          return Status(ErrorCode::kInvalidArgument,
                        "model '" + model + "': max_batch_size " + std::to_string(s.max_batch_size) + " needs dim 0 of " + what +
                            " '" + t.name + "' open (a batch dim), but the engine has it " +
                            (t.shape.empty() ? std::string("as a scalar") : "fixed at " + std::to_string(t.shape[0])));
        }
        if (!t.max_shape.empty() && t.max_shape[0] > 0 && t.max_shape[0] < s.max_batch_size) {
          return Status(ErrorCode::kInvalidArgument, "model '" + model + "': max_batch_size " + std::to_string(s.max_batch_size) +
                                                         " is over " + what + " '" + t.name + "''s built range " +
                                                         std::to_string(t.min_shape[0]) + ".." + std::to_string(t.max_shape[0]));
        }
      }
    }
  }
  if (s.text.empty()) return Status::ok();
  inference::ModelConfig c;
  google::protobuf::TextFormat::Parser parser;
  parser.AllowUnknownField(true);
  if (!parser.ParseFromString(s.text, &c)) return Status(ErrorCode::kInternal, "config.pbtxt no longer parses");
  KILN_RETURN_IF_ERROR(check_listed(c.input(), e.inputs(), batched, "input", model));
  return check_listed(c.output(), e.outputs(), batched, "output", model);
}

void complete_config(const ModelSettings& s, const Engine& e, const std::string& model, int sessions,
                     inference::ModelConfig* out) {
  inference::ModelConfig& c = *out;
  c.Clear();
  if (!s.text.empty()) {
    google::protobuf::TextFormat::Parser parser;
    parser.AllowUnknownField(true);
    parser.ParseFromString(s.text, &c);
  }
  c.set_name(model);
  c.set_platform("kiln");
  c.set_backend("kiln");
  const bool batched = s.max_batch_size > 0;
  c.clear_input();
  for (const TensorInfo& t : e.inputs()) {
    auto* i = c.add_input();
    i->set_name(t.name);
    i->set_data_type(proto_type(t.dtype));
    for (int64_t d : config_dims(t, batched)) i->add_dims(d);
  }
  c.clear_output();
  for (const TensorInfo& t : e.outputs()) {
    auto* o = c.add_output();
    o->set_name(t.name);
    o->set_data_type(proto_type(t.dtype));
    for (int64_t d : config_dims(t, batched)) o->add_dims(d);
  }
  c.clear_instance_group();
  auto* g = c.add_instance_group();
  g->set_count(sessions);
  g->set_kind(e.device() == Device::kCuda ? inference::ModelInstanceGroup::KIND_GPU : inference::ModelInstanceGroup::KIND_CPU);
  if (!c.has_version_policy()) c.mutable_version_policy()->mutable_latest()->set_num_versions(1);
}

std::string config_json(const inference::ModelConfig& c) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(c, &out, o);
  return out;
}

}  // namespace kiln::serve
