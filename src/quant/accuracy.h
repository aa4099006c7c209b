// Accuracy of a model's outputs against a reference (the fp32 model): relative L2, cosine (whole
// tensor and per row), max |error|, and top-1 / top-5 agreement for classifier-shaped outputs;
// and the one number a budget is checked against (ErrorMetric). Shared by post-training
// quantization (quantize.h) and `kiln optimize`'s validation of candidate engines.
//
//   quant::Metrics m;
//   for (each sample) quant::accumulate(m, reference_output, candidate_output);
//   quant::OutputAccuracy a = quant::finish(m);
//   double err = quant::error_of(quant::ErrorMetric::kAuto, {a});   // percent
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln::quant {

// What "error" means for sensitivity and the accuracy budget, in percent, on the first output:
// top-1 disagreement with fp32, relative L2 error, or 1 - the mean cosine similarity of its rows
// (embeddings). kAuto: cosine when the fp32 output's rows are L2-normalized (embeddings), top-1 for
// other [N, C>=10] outputs (logits), else relative L2.
enum class ErrorMetric { kAuto, kTop1, kRelL2, kCosine };

struct OutputAccuracy {
  std::string name;
  double rel_l2 = 0, cosine = 1, max_abs = 0;
  // Cosine similarity of each row (the last axis: a sentence embedding, a token's features), mean
  // and least over the rows of every sample.
  double row_cosine_mean = 1, row_cosine_min = 1;
  double top1 = -1, top5 = -1;  // agreement with fp32 in percent, for classifier-shaped outputs
  bool unit_rows = false;       // the fp32 rows are L2-normalized (embeddings)
};

// Sums over the samples of one output.
struct Metrics {
  OutputAccuracy acc;
  double sum_d2 = 0, sum_r2 = 0, sum_q2 = 0, dot = 0, top1_hits = 0, top5_hits = 0, rows = 0;
  double row_cos_sum = 0, row_cos_min = 1, row_count = 0;
  bool classifier = false;
  bool unit_rows = true;  // every reference row has L2 norm 1: normalized embeddings, not logits
};

// Adds one sample's output (`got`) against its reference; float tensors of equal dims only.
void accumulate(Metrics& m, const Tensor& ref, const Tensor& got);
OutputAccuracy finish(Metrics& m);
// kAuto resolved for these outputs (by the first one).
ErrorMetric resolve(ErrorMetric m, const std::vector<OutputAccuracy>& outs);
std::string metric_name(ErrorMetric m);  // "top-1 disagreement %", ...
// The metric on the first output, in percent.
double error_of(ErrorMetric m, const std::vector<OutputAccuracy>& outs);

}  // namespace kiln::quant
