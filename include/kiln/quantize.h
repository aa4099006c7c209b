// Post-training quantization: calibrate a model on sample inputs and write it as QDQ ONNX (int8 or
// FP8 E4M3), with its accuracy against the fp32 model measured on evaluation samples.
//
//   kiln::QuantizeConfig q;
//   q.precision = kiln::QuantPrecision::kInt8;
//   q.calib_dir = "calib/";            // DIR/<sample>/<input>.npy, DIR/<input>.npy stacked, or DIR/*.npy
//   q.eval_dir = "eval/";              // disjoint from calib/
//   kiln::Expected<kiln::QuantizeReport> r = kiln::quantize("model.onnx", "model.qdq.onnx", q);
//   if (r) std::fputs(r->text.c_str(), stdout);
//
// The written model runs in kiln, onnxruntime and TensorRT: activations per-tensor symmetric
// (QuantizeLinear -> DequantizeLinear), weights quantized per output channel. Conv, Gemm and MatMul
// with a constant weight are quantized, except the first convolution and the classifier (the last
// GEMM before an output) unless quantize_sensitive; see docs/quantize.md.
#pragma once

#include <string>
#include <vector>

#include "kiln/engine.h"
#include "kiln/status.h"

namespace kiln {

enum class QuantPrecision { kInt8, kFp8 };                  // FP8: E4M3FN, scale = amax / 448
enum class CalibrationMethod { kMinMax, kPercentile, kEntropy };  // entropy: int8 only
// The error sensitivity and the budget use, in percent, on the first output: top-1 disagreement,
// relative L2, or 1 - the mean cosine of its rows (embeddings). kAuto: cosine when the float
// output's rows are L2-normalized (embeddings), top-1 for other [N, C>=10] outputs, else relative L2.
enum class AccuracyMetric { kAuto, kTop1, kRelL2, kCosine };

struct QuantizeConfig {
  QuantPrecision precision = QuantPrecision::kInt8;
  CalibrationMethod method = CalibrationMethod::kMinMax;  // the most accurate here (bench/RESULTS.md)
  double percentile = 99.99;          // for kPercentile
  std::string calib_dir;              // required
  size_t max_calib_samples = 0;       // 0: all
  std::string eval_dir;               // "": accuracy measured on the calibration samples
  size_t max_eval_samples = 0;
  bool quantize_sensitive = false;    // also the first convolution and the classifier
  std::vector<std::string> keep;      // ONNX node (or node output) names kept in float
  bool sensitivity = false;           // each layer's error when only it is quantized
  // > 0: keep the fewest, most sensitive layers in float that bring the error (metric) within this
  // many percent.
  double accuracy_budget = 0;
  AccuracyMetric metric = AccuracyMetric::kAuto;
};

// One output's accuracy against the fp32 model; top1/top5 (percent) are -1 unless it is [N, C>=10]
// with rows that are not L2-normalized (logits);
// row cosines are over the last axis (per embedding).
struct QuantizedOutput {
  std::string name;
  double rel_l2 = 0, cosine = 1, max_abs = 0, top1 = -1, top5 = -1;
  double row_cosine_mean = 1, row_cosine_min = 1;
};

struct QuantizeReport {
  std::string text;  // the report as `kiln quantize` prints it
  std::string json;  // the same, with every layer's range, sensitivity and reason
  int layers_quantized = 0, layers_float = 0;
  std::vector<QuantizedOutput> outputs;
};

// Errors name the file: an empty calibration folder, a sample of the wrong dtype or shape, one
// that is not finite, data that is one constant; a model below opset 13 or with external data.
Expected<QuantizeReport> quantize(const std::string& onnx_path, const std::string& out_path, const QuantizeConfig& config);

// Calibrate, quantize and build in one step (`kiln build model.onnx --int8|--fp8 --calib DIR`): the
// QDQ model `quantize` writes is built as `build` (kiln/engine.h) builds any model, its quantized
// products running on int8/fp8 kernels where the device has them. The QDQ model is kept at qdq_path
// when one is given (to inspect it or run it elsewhere), else written to a temporary file that is
// removed after the build. *report, when given, receives the quantization report.
Expected<Engine> build_quantized(const std::string& onnx_path, const QuantizeConfig& quant, const BuildConfig& build,
                                 QuantizeReport* report = nullptr, const std::string& qdq_path = "");

}  // namespace kiln
