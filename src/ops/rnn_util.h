// Pieces of the rnn family (RNN, GRU, LSTM) shared by inference and the kernels: the cell kind,
// its gate and activation counts, and the named activation functions with alpha/beta.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ops/op_util.h"

namespace kiln {

enum class RnnCell { kRnn, kGru, kLstm };

inline int rnn_num_gates(RnnCell c) { return c == RnnCell::kRnn ? 1 : c == RnnCell::kGru ? 3 : 4; }
inline int rnn_num_activations(RnnCell c) { return c == RnnCell::kRnn ? 1 : c == RnnCell::kGru ? 2 : 3; }

// One activation of the ONNX RNN activation list ("Sigmoid", "ScaledTanh", ...).
struct RnnActivation {
  enum class Kind { kRelu, kTanh, kSigmoid, kAffine, kLeakyRelu, kThresholdedRelu, kScaledTanh, kHardSigmoid,
                    kElu, kSoftsign, kSoftplus };
  Kind kind = Kind::kTanh;
  double alpha = 0, beta = 0;

  template <typename A>
  A operator()(A x) const {
    const A a = A(alpha), b = A(beta);
    switch (kind) {
      case Kind::kRelu: return std::max(x, A(0));
      case Kind::kTanh: return std::tanh(x);
      case Kind::kSigmoid: return x >= A(0) ? A(1) / (A(1) + std::exp(-x)) : std::exp(x) / (A(1) + std::exp(x));
      case Kind::kAffine: return a * x + b;
      case Kind::kLeakyRelu: return x >= A(0) ? x : a * x;
      case Kind::kThresholdedRelu: return x >= a ? x : A(0);
      case Kind::kScaledTanh: return a * std::tanh(b * x);
      case Kind::kHardSigmoid: return std::min(std::max(a * x + b, A(0)), A(1));
      case Kind::kElu: return x >= A(0) ? x : a * (std::exp(x) - A(1));
      case Kind::kSoftsign: return x / (A(1) + std::abs(x));
      case Kind::kSoftplus: return std::max(x, A(0)) + std::log1p(std::exp(-std::abs(x)));
    }
    return x;
  }
};

// The activations of every direction, in the order of the `activations` attribute (defaults
// when it is absent); `activation_alpha`/`activation_beta` are consumed in order by the
// activations that take them, as onnxruntime does.
Expected<std::vector<RnnActivation>> rnn_parse_activations(const Node& n, RnnCell cell, int64_t num_directions);

// 1 or 2 for the `direction` attribute; an error for an unknown direction.
Expected<int64_t> rnn_num_directions(const Node& n);

// Shape and type inference of RNN, GRU and LSTM: checks dtypes, attributes and weight shapes.
Status infer_rnn_common(InferCtx& c, RnnCell cell);

}  // namespace kiln
