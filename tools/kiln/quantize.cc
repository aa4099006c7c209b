// `kiln quantize model.onnx --calib DIR --precision int8|fp8 -o model.qdq.onnx [--report r.json]`:
// post-training quantization through include/kiln/quantize.h; prints the accuracy report.
#include <cstdio>

#include "cli.h"
#include "kiln/quantize.h"
#include "support/mapped_file.h"

namespace kiln::cli {

Expected<QuantizeConfig> quantize_config(const QuantizeCliOptions& opt) {
  QuantizeConfig c;
  if (opt.precision == "int8") c.precision = QuantPrecision::kInt8;
  else if (opt.precision == "fp8") c.precision = QuantPrecision::kFp8;
  else return KILN_ERROR(kInvalidArgument, "--precision is int8 or fp8, not '{}'", opt.precision);
  if (opt.method == "minmax") {
    c.method = CalibrationMethod::kMinMax;
  } else if (opt.method == "percentile") {
    c.method = CalibrationMethod::kPercentile;
  } else if (opt.method == "entropy") {
    c.method = CalibrationMethod::kEntropy;
  } else {
    return KILN_ERROR(kInvalidArgument, "--method is minmax, percentile or entropy, not '{}'", opt.method);
  }
  c.percentile = opt.percentile;
  c.calib_dir = opt.calib;
  c.eval_dir = opt.eval;
  c.max_calib_samples = opt.max_calib;
  c.max_eval_samples = opt.max_eval;
  c.keep = opt.keep;
  c.quantize_sensitive = opt.quantize_sensitive;
  c.sensitivity = opt.sensitivity;
  c.accuracy_budget = opt.accuracy_budget;
  if (opt.metric == "auto") c.metric = AccuracyMetric::kAuto;
  else if (opt.metric == "top1") c.metric = AccuracyMetric::kTop1;
  else if (opt.metric == "rel-l2") c.metric = AccuracyMetric::kRelL2;
  else if (opt.metric == "cosine") c.metric = AccuracyMetric::kCosine;
  else return KILN_ERROR(kInvalidArgument, "--metric is auto, top1, rel-l2 or cosine, not '{}'", opt.metric);
  return c;
}

int quantize_main(const std::string& model, const QuantizeCliOptions& opt) {
  auto cfg = quantize_config(opt);
  if (!cfg) return fail(cfg.status());
  const QuantizeConfig& c = *cfg;
  auto r = quantize(model, opt.output, c);
  if (!r) return fail(r.status());
  std::fputs(r->text.c_str(), stdout);
  if (!opt.report.empty()) {
    if (Status s = write_file_atomic(opt.report, r->json + "\n"); !s) return fail(s);
    std::printf("report: %s\n", opt.report.c_str());
  }
  return 0;
}

}  // namespace kiln::cli
