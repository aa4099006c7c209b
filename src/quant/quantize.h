// Post-training quantization (issue 25): calibrate a model's activations on sample inputs, write it
// as QDQ ONNX (qdq_writer.h), and measure what quantizing cost against the fp32 model.
//
// Which layers: the inputs of Conv, Gemm and MatMul (activations per-tensor, constant weights per
// output channel). Kept in float unless asked otherwise: the first convolution (it reads the raw
// input, whose range quantizes worst) and the last GEMM before an output (the classifier, whose
// errors reach the result directly); Softmax, normalization statistics and everything else are
// never quantized, since only GEMM and convolution inputs are. Calibration and evaluation run the
// model on the CPU reference backend (a GPU observer is later work).
#pragma once

#include <string>
#include <vector>

#include "quant/accuracy.h"
#include "quant/calibration.h"

namespace kiln::quant {

struct QuantizeOptions {
  QuantType type = QuantType::kInt8;
  CalibMethod method = CalibMethod::kMinMax;
  double percentile = 99.99;        // for CalibMethod::kPercentile
  std::string calib_dir;            // required
  size_t max_calib = 0;             // 0: every sample
  std::string eval_dir;             // accuracy measured here; empty: on the calibration samples
  size_t max_eval = 0;
  bool quantize_sensitive = false;  // quantize the first convolution and the classifier too
  std::vector<std::string> keep;    // ONNX node names (or output tensor names) kept in float
  bool sensitivity = false;         // measure each layer's error when only it is quantized
  // > 0: keep the fewest layers in float (most sensitive first) that bring the error within this
  // budget, in percent: top-1 disagreement for classifier outputs, else relative L2 error.
  double accuracy_budget = 0;
  ErrorMetric metric = ErrorMetric::kAuto;
};

struct LayerReport {
  std::string node;       // Node::describe() of the ONNX node
  std::string activation, weight;
  bool quantized = false;
  std::string why_not;    // when kept in float
  double act_amax = 0, act_max = 0;  // the calibrated range, and the largest |x| seen
  double sensitivity = -1;  // the error metric with only this layer quantized (-1: not measured)
};

struct QuantizeReport {
  std::string model, output, calib_dir, eval_dir;
  QuantType type = QuantType::kInt8;
  CalibMethod method = CalibMethod::kMinMax;
  size_t calib_samples = 0, eval_samples = 0;
  std::vector<LayerReport> layers;
  std::vector<OutputAccuracy> outputs;
  std::string metric;    // "top-1 disagreement %", "relative L2 %" or "1 - row cosine %": what sensitivity and the budget use
  double error = 0;      // that metric for the written model
  std::vector<std::string> budget_kept;  // layers the budget kept in float, in the order added
  double calib_ms = 0, eval_ms = 0;
  size_t bytes_in = 0, bytes_out = 0;
  std::string to_text() const;
  std::string to_json() const;
};

// Quantizes the ONNX model at `model_path` and writes the QDQ model to `out_path` (atomically).
Expected<QuantizeReport> quantize_model(const std::string& model_path, const std::string& out_path,
                                        const QuantizeOptions& opt);

}  // namespace kiln::quant
