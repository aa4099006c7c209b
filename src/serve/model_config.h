// A model's serving configuration: DIR/<model>/config.pbtxt in Triton's format (the fields of
// src/serve/proto/model_config.proto; a field kiln does not know is skipped with a warning), read
// into ModelSettings, checked against the engine, and completed from it for the config endpoints
// (HTTP GET /v2/models/M/config, gRPC ModelConfig), as Triton completes a config it is given.
//
//   max_batch_size: 8                      # > 0: dim 0 of every input and output is the batch
//   dynamic_batching { max_queue_delay_microseconds: 500  preferred_batch_size: [4, 8]
//                      default_queue_policy { default_timeout_microseconds: 100000
//                                             allow_timeout_override: true  max_queue_size: 64 } }
//   instance_group [{ count: 2 }]          # sessions that run at once (default: --sessions)
//   version_policy { latest { num_versions: 2 } }   # or all {} or specific { versions: [1, 3] }
//   parameters { key: "precision" value { string_value: "fp16" } }  # model.onnx built at load
//
// No config.pbtxt: the newest version, no batching (a request runs as it comes), --sessions
// sessions: merging requests along dim 0 is only right when dim 0 really is a batch, which the
// model's author says by writing max_batch_size.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kiln/kiln.h"

namespace inference {
class ModelConfig;
}

namespace kiln::serve {

struct ModelSettings {
  int max_batch_size = 0;  // 0: dim 0 is not a batch dim; requests run one at a time
  bool dynamic_batching = false;
  std::vector<int> preferred_batch_sizes;
  // The sizes the batcher trims a batch to when its queue delay runs out before a preferred size is
  // reached (ascending; empty: any up to max_batch_size). For a GPU engine, the powers of two up to
  // max_batch_size, max_batch_size itself and the preferred sizes: a dynamic GPU engine makes a plan
  // and captures a graph per exact shape, so batches of every size from 1 to 64 thrash its caches
  // (bench/RESULTS.md, twenty-sixth session). Empty on the CPU.
  std::vector<int> batch_sizes;
  uint64_t max_queue_delay_us = 0;
  uint64_t default_timeout_us = 0;  // 0: requests wait as long as it takes
  bool allow_timeout_override = true;  // a request's own timeout wins (false only when a queue policy says so)
  bool reject_on_timeout = true;  // REJECT (else DELAY: a late request still runs)
  uint32_t max_queue_size = 0;    // 0: unbounded
  int instances = 0;              // 0: the server's --sessions
  enum class Policy { kLatest, kAll, kSpecific } policy = Policy::kLatest;
  uint32_t latest = 1;
  std::vector<int64_t> specific;
  std::optional<Precision> precision;  // for model.onnx built at load
  // The dims config.pbtxt gives each input (without the batch dim when max_batch_size > 0).
  std::map<std::string, std::vector<int64_t>> input_dims;
  std::optional<Device> device;
  std::string text;  // config.pbtxt as read (empty when there is none)

  // Everything here that shapes a loaded version (all but the version policy and the text), as
  // text: equal fingerprints load a version the same way.
  std::string fingerprint() const;
  // The versions to serve of those on disk (sorted ascending).
  std::vector<int64_t> select(const std::vector<int64_t>& on_disk) const;
  // The shape ranges a model.onnx is built with at load: with max_batch_size > 0, dim 0 of every
  // input whose other dims the file fixes takes 1..max_batch_size (a GPU engine then runs any batch
  // the batcher forms); inputs it does not list, or lists with -1, are left to the model.
  std::map<std::string, std::vector<DimRange>> build_ranges() const;
};

// Reads model_dir/config.pbtxt when it exists. Errors name the file and, for syntax, the line and
// column; `warnings` gets the fields kiln skips.
Expected<ModelSettings> read_model_settings(const std::string& model_dir, std::vector<std::string>* warnings);

// Fills settings.batch_sizes for an engine on `device` (see ModelSettings::batch_sizes).
void choose_batch_sizes(ModelSettings& s, Device device);

// Checks the settings against a loaded engine: with max_batch_size > 0 every input's and output's
// dim 0 must be open (and its built range must reach max_batch_size); inputs and outputs the file
// lists must exist with its data type and dims. Errors name the model, the tensor and the field.
Status check_settings(const ModelSettings& s, const Engine& e, const std::string& model);

// The configuration the server reports: the file's, with name, platform, the inputs and outputs
// (dims without the batch dim when max_batch_size > 0, -1 where open) and the instance count filled.
void complete_config(const ModelSettings& s, const Engine& e, const std::string& model, int sessions,
                     inference::ModelConfig* out);
// The same as Triton's JSON (proto field names).
std::string config_json(const inference::ModelConfig& c);

}  // namespace kiln::serve
