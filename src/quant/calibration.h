// Calibration for post-training quantization: the sample inputs activations are measured on, and
// the observer that turns what one tensor held over every sample into a clipping range (amax).
//
//   KILN_ASSIGN_OR_RETURN(auto samples, quant::load_samples(graph, "calib/"));
//   quant::Observer o;  o.add(tensor);  ...
//   double amax = o.range(quant::CalibMethod::kEntropy, 99.99, quant::QuantType::kInt8);
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln::quant {

enum class QuantType { kInt8, kFp8E4M3 };
enum class CalibMethod { kMinMax, kPercentile, kEntropy };

std::string_view quant_type_name(QuantType t);     // "int8", "fp8"
std::string_view calib_method_name(CalibMethod m);  // "minmax", "percentile", "entropy"
// The largest magnitude the type holds: 127 (symmetric int8), 448 (E4M3FN).
double quant_type_max(QuantType t);

// One forward's inputs, in graph-input order, and the file(s) they came from.
struct Sample {
  std::vector<Tensor> inputs;
  std::string source;
};

// Reads calibration or evaluation samples from `dir`, in one of three layouts:
//   DIR/<sample>/<input>.npy   a folder per sample holding a file per input;
//   DIR/<input>.npy            a file per input, samples stacked on a new leading axis (rank + 1)
//                              or along the input's own leading axis (same rank);
//   DIR/<anything>.npy         (single-input models) a file per sample, or stacked as above.
// <input> is the input's name with characters outside [A-Za-z0-9._-] as '_'. Each sample must
// match the input's dtype and its fixed dims; floats must be finite. Errors name the file.
// max_samples > 0 keeps the first that many (in file-name order).
Expected<std::vector<Sample>> load_samples(const Graph& g, const std::string& dir, size_t max_samples = 0);

// Fails when every value of a float input is one constant over all samples (a range of zero,
// nothing to calibrate on), naming the input and the folder.
Status check_not_constant(const Graph& g, const std::vector<Sample>& samples, const std::string& dir);

// A histogram of |x| for one tensor over every sample it was given: 2048 bins over [0, top), top
// doubling (bins merged in pairs) whenever a larger value arrives, so one pass over the data
// suffices. Non-finite values are counted, not binned.
class Observer {
 public:
  void add(const Tensor& t);
  double amax() const { return amax_; }
  int64_t count() const { return count_; }
  int64_t nonfinite() const { return nonfinite_; }
  // The clipping range by `method`: the largest |x| (minmax), the |x| below which `percentile`
  // percent of values fall, or the threshold whose int8 quantization of the histogram loses the
  // least information (KL divergence, as TensorRT's entropy calibrator; int8 only).
  double range(CalibMethod method, double percentile, QuantType type) const;

  static constexpr int kBins = 2048;

 private:
  void grow_to(double v);
  double percentile_range(double p) const;
  double entropy_range(int levels) const;
  std::vector<double> hist_ = std::vector<double>(kBins, 0.0);
  double top_ = 0;  // the histogram covers [0, top_)
  double amax_ = 0;
  int64_t count_ = 0, nonfinite_ = 0;
};

}  // namespace kiln::quant
