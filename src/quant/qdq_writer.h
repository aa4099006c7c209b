// Writes a quantized model as QDQ ONNX: QuantizeLinear -> DequantizeLinear pairs on the activations
// a layer reads (per-tensor, symmetric: zero point 0), and weights stored quantized with a
// DequantizeLinear per output channel. The layout onnxruntime's quantize_static writes (S8S8) and
// TensorRT reads as explicit precision. Before / after, for one Conv:
//
//   y = Conv(x, W, b)
//
//   x_quantized = QuantizeLinear(x, x_scale, x_zero_point)          # x_scale = amax / 127, zp int8 0
//   x_dequantized = DequantizeLinear(x_quantized, x_scale, x_zero_point)
//   W_dequantized = DequantizeLinear(W_quantized, W_scale, W_zero_point, axis=0)  # W_quantized: int8
//   y = Conv(x_dequantized, W_dequantized, b)
//
// FP8 is the same with float8e4m3fn values and zero points (scale = amax / 448), which needs opset
// 19; int8 per-channel weights need opset 13. A model of opset 13..18 is raised to 19 for FP8 (the
// Reduce* ops take their axes as an input from opset 18 and are rewritten so); older ones are an
// error.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "quant/calibration.h"

namespace kiln::quant {

// One input of one ONNX node to replace with its quantized-then-dequantized form.
struct QdqInput {
  int node = -1;  // position in the ONNX graph's node list
  int slot = 0;   // input index
  bool weight = false;
};

struct QdqPlan {
  QuantType type = QuantType::kInt8;
  std::vector<QdqInput> inputs;
  std::map<std::string, double> act_amax;     // activation tensor name -> clipping range
  std::map<std::string, int> weight_axis;     // weight tensor name -> its output-channel axis
};

// `onnx_bytes` is the model as read; weight values come from `g`, the model imported by kiln (its
// constants carry the initializers' data). Returns the serialized QDQ model.
Expected<std::string> write_qdq_model(const std::string& onnx_bytes, const Graph& g, const QdqPlan& plan);

// Per-channel scales of w along `axis` (max |w| / the type's largest value; 1 for an all-zero
// channel) and w quantized with them (int8: round half to even, clamped to +-127; fp8: E4M3FN,
// saturating), as raw bytes.
struct QuantizedWeight {
  std::vector<float> scales;
  std::string bytes;
};
QuantizedWeight quantize_weight(const Tensor& w, int axis, QuantType type);

}  // namespace kiln::quant
