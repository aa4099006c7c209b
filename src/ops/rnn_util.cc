#include "ops/rnn_util.h"

#include <cctype>

namespace kiln {

namespace {

struct ActivationInfo {
  const char* name;  // lower case
  RnnActivation::Kind kind;
  bool uses_alpha, uses_beta;
  double alpha, beta;  // defaults, those of the same-named ONNX ops
};

constexpr ActivationInfo kActivationTable[] = {
    {"relu", RnnActivation::Kind::kRelu, false, false, 0, 0},
    {"tanh", RnnActivation::Kind::kTanh, false, false, 0, 0},
    {"sigmoid", RnnActivation::Kind::kSigmoid, false, false, 0, 0},
    {"affine", RnnActivation::Kind::kAffine, true, true, 1.0, 0.0},
    {"leakyrelu", RnnActivation::Kind::kLeakyRelu, true, false, 0.01, 0},
    {"thresholdedrelu", RnnActivation::Kind::kThresholdedRelu, true, false, 1.0, 0},
    {"scaledtanh", RnnActivation::Kind::kScaledTanh, true, true, 1.0, 1.0},
    {"hardsigmoid", RnnActivation::Kind::kHardSigmoid, true, true, 0.2, 0.5},
    {"elu", RnnActivation::Kind::kElu, true, false, 1.0, 0},
    {"softsign", RnnActivation::Kind::kSoftsign, false, false, 0, 0},
    {"softplus", RnnActivation::Kind::kSoftplus, false, false, 0, 0},
};

std::vector<std::string> default_activations(RnnCell cell) {
  switch (cell) {
    case RnnCell::kRnn: return {"Tanh"};
    case RnnCell::kGru: return {"Sigmoid", "Tanh"};
    case RnnCell::kLstm: return {"Sigmoid", "Tanh", "Tanh"};
  }
  return {};
}

std::string lower(std::string s) {
  for (char& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

}  // namespace

Expected<int64_t> rnn_num_directions(const Node& n) {
  std::string d = n.attr_string("direction", "forward");
  if (d == "forward" || d == "reverse") return 1;
  if (d == "bidirectional") return 2;
  return KILN_ERROR(kInvalidModel, "{}: direction must be forward, reverse or bidirectional, got '{}'", n.describe(), d);
}

Expected<std::vector<RnnActivation>> rnn_parse_activations(const Node& n, RnnCell cell, int64_t num_directions) {
  std::vector<std::string> names = n.attr_strings("activations");
  size_t want = size_t(rnn_num_activations(cell) * num_directions);
  if (names.empty()) {
    for (int64_t d = 0; d < num_directions; ++d) {
      for (const std::string& s : default_activations(cell)) names.push_back(s);
    }
  }
  if (names.size() != want) {
    return KILN_ERROR(kInvalidModel, "{}: activations has {} entries, expected {} ({} per direction)", n.describe(),
                      names.size(), want, rnn_num_activations(cell));
  }
  std::vector<float> alphas = n.attr_floats("activation_alpha"), betas = n.attr_floats("activation_beta");
  size_t next_alpha = 0, next_beta = 0;
  std::vector<RnnActivation> out;
  for (const std::string& name : names) {
    const ActivationInfo* info = nullptr;
    for (const ActivationInfo& a : kActivationTable) {
      if (lower(name) == a.name) info = &a;
    }
    if (!info) return KILN_ERROR(kUnsupported, "{}: unknown activation function '{}'", n.describe(), name);
    RnnActivation act{info->kind, info->alpha, info->beta};
    if (info->uses_alpha && next_alpha < alphas.size()) act.alpha = alphas[next_alpha++];
    if (info->uses_beta && next_beta < betas.size()) act.beta = betas[next_beta++];
    out.push_back(act);
  }
  return out;
}

namespace {

// Requires input i (when present and typed) to be a tensor of dtype `dt`.
Status check_input_dtype(InferCtx& c, size_t i, DType dt, const char* name) {
  if (!c.has_input(i) || !c.input_type(i).is_known()) return Status::ok();
  const Type& t = c.input_type(i);
  if (!t.is_tensor() || t.dtype != dt) return c.error("{} must be {}, got {}", name, dtype_name(dt), t.to_string());
  return Status::ok();
}

// Dim `k` of input i's shape when its rank is `rank`; unknown otherwise.
Expected<Dim> input_dim(InferCtx& c, size_t i, size_t rank, size_t k, const char* name) {
  const Type& t = c.input_type(i);
  if (!t.has_rank()) return Dim();
  if (t.shape->rank() != rank) return c.error("{} must have rank {}, got {}", name, rank, t.to_string());
  return (*t.shape)[k];
}

}  // namespace

Status infer_rnn_common(InferCtx& c, RnnCell cell) {
  const Node& n = c.node();
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  if (!dtype_is_float(dt) || dtype_is_f8(dt)) return c.error("X must be f16, bf16, f32 or f64, got {}", dtype_name(dt));
  static const char* kNames[] = {"X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"};
  for (size_t i = 1; i < c.num_inputs() && i < 8; ++i) {
    KILN_RETURN_IF_ERROR(check_input_dtype(c, i, i == 4 ? DType::kInt32 : dt, kNames[i]));
  }
  KILN_ASSIGN_OR_RETURN(int64_t dirs, rnn_num_directions(n));
  KILN_RETURN_IF_ERROR(rnn_parse_activations(n, cell, dirs).status());
  int64_t layout = n.attr_int("layout", 0);
  if (layout != 0 && layout != 1) return c.error("layout must be 0 or 1, got {}", layout);
  int64_t gates = rnn_num_gates(cell);

  KILN_ASSIGN_OR_RETURN(Dim x0, input_dim(c, 0, 3, 0, "X"));
  KILN_ASSIGN_OR_RETURN(Dim x1, input_dim(c, 0, 3, 1, "X"));
  KILN_ASSIGN_OR_RETURN(Dim w_dirs, input_dim(c, 1, 3, 0, "W"));
  KILN_ASSIGN_OR_RETURN(Dim w_rows, input_dim(c, 1, 3, 1, "W"));
  KILN_ASSIGN_OR_RETURN(Dim r_hidden, input_dim(c, 2, 3, 2, "R"));
  if (!w_dirs.compatible(Dim(dirs))) {
    return c.error("W has {} directions but direction '{}' needs {}", w_dirs.to_string(),
                   n.attr_string("direction", "forward"), dirs);
  }
  Dim seq = layout == 0 ? x0 : x1, batch = layout == 0 ? x1 : x0;
  Dim hidden = r_hidden;
  if (int64_t hs = n.attr_int("hidden_size", 0); hs > 0) {
    if (!r_hidden.compatible(Dim(hs))) return c.error("hidden_size is {} but R has {}", hs, r_hidden.to_string());
    hidden = Dim(hs);
  } else if (hidden.is_unknown() && w_rows.is_static()) {
    hidden = Dim(w_rows.value() / gates);
  }
  if (!w_rows.compatible(Dim(gates) * hidden)) {
    return c.error("W has {} rows, expected {} gates x hidden size {}", w_rows.to_string(), gates, hidden.to_string());
  }
  Dim d(dirs);
  c.set_output_tensor(0, dt, layout == 0 ? Shape{seq, d, batch, hidden} : Shape{batch, seq, d, hidden});
  Shape state = layout == 0 ? Shape{d, batch, hidden} : Shape{batch, d, hidden};
  c.set_output_tensor(1, dt, state);
  if (cell == RnnCell::kLstm) c.set_output_tensor(2, dt, state);
  return Status::ok();
}

}  // namespace kiln
