// include/kiln/quantize.h over src/quant.
#include "kiln/quantize.h"

#include <atomic>
#include <filesystem>

#include <unistd.h>

#include "quant/quantize.h"

namespace kiln {

Expected<QuantizeReport> quantize(const std::string& onnx_path, const std::string& out_path, const QuantizeConfig& c) {
  quant::QuantizeOptions o;
  o.type = c.precision == QuantPrecision::kInt8 ? quant::QuantType::kInt8 : quant::QuantType::kFp8E4M3;
  switch (c.method) {
    case CalibrationMethod::kMinMax: o.method = quant::CalibMethod::kMinMax; break;
    case CalibrationMethod::kPercentile: o.method = quant::CalibMethod::kPercentile; break;
    case CalibrationMethod::kEntropy: o.method = quant::CalibMethod::kEntropy; break;
  }
  o.percentile = c.percentile;
  o.calib_dir = c.calib_dir;
  o.max_calib = c.max_calib_samples;
  o.eval_dir = c.eval_dir;
  o.max_eval = c.max_eval_samples;
  o.quantize_sensitive = c.quantize_sensitive;
  o.keep = c.keep;
  o.sensitivity = c.sensitivity;
  o.accuracy_budget = c.accuracy_budget;
  switch (c.metric) {
    case AccuracyMetric::kAuto: o.metric = quant::ErrorMetric::kAuto; break;
    case AccuracyMetric::kTop1: o.metric = quant::ErrorMetric::kTop1; break;
    case AccuracyMetric::kRelL2: o.metric = quant::ErrorMetric::kRelL2; break;
    case AccuracyMetric::kCosine: o.metric = quant::ErrorMetric::kCosine; break;
  }
  KILN_ASSIGN_OR_RETURN(quant::QuantizeReport r, quant::quantize_model(onnx_path, out_path, o));
  QuantizeReport out;
  out.text = r.to_text();
  out.json = r.to_json();
  for (const auto& l : r.layers) (l.quantized ? out.layers_quantized : out.layers_float) += 1;
  for (const auto& a : r.outputs) {
    out.outputs.push_back({a.name, a.rel_l2, a.cosine, a.max_abs, a.top1, a.top5, a.row_cosine_mean, a.row_cosine_min});
  }
  return out;
}

Expected<Engine> build_quantized(const std::string& onnx_path, const QuantizeConfig& quant, const BuildConfig& build_config,
                                 QuantizeReport* report, const std::string& qdq_path) {
  std::string path = qdq_path;
  struct Remove {  // the temporary QDQ model, removed on every path
    std::string path;
    ~Remove() {
      std::error_code ec;
      if (!path.empty()) std::filesystem::remove(path, ec);
    }
  } temp;
  if (path.empty()) {
    static std::atomic<int> serial{0};
    std::error_code ec;
    const std::filesystem::path dir = std::filesystem::temp_directory_path(ec);
    if (ec) return KILN_ERROR(kIo, "no temporary folder for the quantized model: {}", ec.message());
    path = (dir / fmt::format("kiln-qdq-{}-{}.onnx", getpid(), serial++)).string();
    temp.path = path;
  }
  KILN_ASSIGN_OR_RETURN(QuantizeReport r, quantize(onnx_path, path, quant));
  if (report) *report = std::move(r);
  return build(path, build_config);
}

}  // namespace kiln
