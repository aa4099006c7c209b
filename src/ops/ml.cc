// Op family: ml (the ai.onnx.ml domain). ArrayFeatureExtractor, Binarizer, LabelEncoder (opset 4,
// keys/values from lists or tensors) and TreeEnsemble (opset 5). The other ai.onnx.ml ops are not
// implemented yet (their .infer stays null, so they report as such). Scaler, Normalizer, Imputer,
// OneHotEncoder, LinearRegressor and FeatureVectorizer live in ml_transform.cc.
#include <algorithm>
#include <cmath>
#include <map>

#include "ops/elementwise_util.h"

namespace kiln {

void register_ml_transform_ops(OpRegistry& r);

namespace {

// ---- ArrayFeatureExtractor: gathers along the last axis; a 1-D X gives a [1, k] result ----------

Status infer_array_feature_extractor(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  KILN_ASSIGN_OR_RETURN(DType it, c.tensor_dtype(1));
  if (it != DType::kInt64) return c.error("Y must be int64, got {}", dtype_name(it));
  const Type& x = c.input_type(0);
  const Type& y = c.input_type(1);
  if (!x.has_rank() || !y.has_rank()) {
    c.set_output_tensor(0, dt, std::nullopt);
    return Status::ok();
  }
  if (x.shape->rank() == 0) return c.error("X must have rank >= 1, got {}", x.to_string());
  Shape out = x.shape->rank() == 1 ? Shape({Dim(1), Dim()}) : *x.shape;
  out.dims.back() = y.shape->numel();
  c.set_output_tensor(0, dt, out);
  return Status::ok();
}

Status array_feature_extractor_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const Tensor& idx = c.tensor(1);
  if (x.rank() == 0) return c.error("X must have rank >= 1, got {}", x.summary());
  const int64_t last = x.dims().back(), rows = x.numel() / std::max<int64_t>(last, 1), k = idx.numel();
  for (int64_t j = 0; j < k; ++j) {
    if (idx.as_int(j) < 0 || idx.as_int(j) >= last) return c.error("index {} is out of range [0, {})", idx.as_int(j), last);
  }
  std::vector<int64_t> out = x.rank() == 1 ? std::vector<int64_t>{1, k} : x.dims();
  out.back() = k;
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, x.dtype(), out));
  visit_dtype(x.dtype(), [&]<typename T>() {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < k; ++j) y->data<T>()[r * k + j] = x.data<T>()[r * last + idx.as_int(j)];
    }
  });
  return Status::ok();
}

// ---- Binarizer: 1 where X > threshold, else 0, in X's type -----------------------------------------

Status binarizer_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const double threshold = c.node().attr_float("threshold", 0.0f);
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, x.dtype(), x.dims()));
  return visit_dtype(x.dtype(), [&]<typename T>() -> Status {
    if constexpr (!is_numeric_v<T>) {
      return c.unsupported("Binarizer of {}", dtype_name(x.dtype()));
    } else {
      for (int64_t i = 0; i < x.numel(); ++i) y->data<T>()[i] = T(double(compute_t<T>(x.data<T>()[i])) > threshold ? 1 : 0);
      return Status::ok();
    }
  });
}

Status infer_binarizer(InferCtx& c) {
  KILN_RETURN_IF_ERROR(check_input_class(c, 0, TypeClass::kNumeric));
  return infer_same_as_input0(c);
}

// ---- LabelEncoder ----------------------------------------------------------------------------------

// One of the attribute triples (x_tensor, x_strings, x_int64s, x_floats) as a tensor.
std::optional<Tensor> attr_list_tensor(const Node& n, const std::string& prefix) {
  if (const Tensor* t = n.attr_tensor(prefix + "_tensor")) return *t;
  if (n.has_attr(prefix + "_strings")) {
    std::vector<std::string> v = n.attr_strings(prefix + "_strings");
    return Tensor::from_vector(v, {int64_t(v.size())});
  }
  if (n.has_attr(prefix + "_int64s")) {
    std::vector<int64_t> v = n.attr_ints(prefix + "_int64s");
    return Tensor::from_vector(v, {int64_t(v.size())});
  }
  if (n.has_attr(prefix + "_floats")) {
    std::vector<float> v = n.attr_floats(prefix + "_floats");
    return Tensor::from_vector(v, {int64_t(v.size())});
  }
  return std::nullopt;
}

// The value for keys not found: default_tensor, or the typed default attribute of the values' type.
Tensor label_default(const Node& n, DType values) {
  if (const Tensor* t = n.attr_tensor("default_tensor"); t && t->numel() == 1 && t->dtype() == values) return *t;
  switch (values) {
    case DType::kString: return Tensor::from_vector<std::string>({n.attr_string("default_string", "_Unused")}, {});
    case DType::kInt64: return Tensor::scalar<int64_t>(n.attr_int("default_int64", -1));
    case DType::kFloat32: return Tensor::scalar<float>(n.attr_float("default_float", -0.0f));
    default: {
      Tensor t = Tensor::create(values, {}).value();  // other value types default to zero
      return t;
    }
  }
}

template <typename Ctx>
Expected<std::pair<Tensor, Tensor>> label_keys_values(const Ctx& c) {
  std::optional<Tensor> keys = attr_list_tensor(c.node(), "keys");
  std::optional<Tensor> values = attr_list_tensor(c.node(), "values");
  if (!keys || !values) return c.error("LabelEncoder needs keys_* and values_* attributes");
  if (keys->numel() != values->numel()) {
    return c.error("{} keys but {} values", keys->numel(), values->numel());
  }
  return std::make_pair(*keys, *values);
}

Status infer_label_encoder(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  KILN_ASSIGN_OR_RETURN(auto kv, label_keys_values(c));
  if (kv.first.dtype() != dt) {
    return c.error("X is {} but the keys are {}", dtype_name(dt), dtype_name(kv.first.dtype()));
  }
  c.set_output_tensor(0, kv.second.dtype(), c.input_type(0).shape);
  return Status::ok();
}

// Ordering for keys that puts NaN last and equal to itself, so NaN keys can be looked up.
template <typename K>
struct KeyLess {
  bool operator()(const K& a, const K& b) const {
    if constexpr (std::is_floating_point_v<K>) {
      if (std::isnan(a) || std::isnan(b)) return !std::isnan(a) && std::isnan(b);
    }
    return a < b;
  }
};

Status label_encoder_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  KILN_ASSIGN_OR_RETURN(auto kv, label_keys_values(c));
  const Tensor& keys = kv.first;
  const Tensor& values = kv.second;
  if (keys.dtype() != x.dtype()) return c.error("X is {} but the keys are {}", dtype_name(x.dtype()), dtype_name(keys.dtype()));
  const Tensor dflt = label_default(c.node(), values.dtype());
  // Map each input element to an index into values (-1: the default).
  std::vector<int64_t> pick(size_t(x.numel()), -1);
  visit_dtype(x.dtype(), [&]<typename K>() {
    using C = compute_t<K>;
    std::map<C, int64_t, KeyLess<C>> index;
    for (int64_t i = 0; i < keys.numel(); ++i) index.emplace(C(keys.data<K>()[i]), i);
    for (int64_t i = 0; i < x.numel(); ++i) {
      auto it = index.find(C(x.data<K>()[i]));
      if (it != index.end()) pick[size_t(i)] = it->second;
    }
  });
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, values.dtype(), x.dims()));
  visit_dtype(values.dtype(), [&]<typename V>() {
    for (int64_t i = 0; i < x.numel(); ++i) {
      y->data<V>()[i] = pick[size_t(i)] < 0 ? dflt.data<V>()[0] : values.data<V>()[pick[size_t(i)]];
    }
  });
  return Status::ok();
}

// ---- TreeEnsemble ----------------------------------------------------------------------------------

enum class NodeMode { kLeq, kLt, kGte, kGt, kEq, kNeq, kMember };
enum class Aggregate { kAverage, kSum, kMin, kMax };

// The trees in flat arrays, as the attributes give them, plus the parsed membership sets.
struct Forest {
  std::vector<double> splits;
  std::vector<int64_t> features, true_ids, false_ids, true_leaf, false_leaf, missing_true;
  std::vector<NodeMode> modes;
  std::vector<std::vector<double>> members;  // per node; empty unless kMember
  std::vector<double> leaf_weights;
  std::vector<int64_t> leaf_targets, roots;
  int64_t n_targets;
  Aggregate aggregate;
  int64_t post_transform;
};

std::vector<double> tensor_doubles(const Tensor* t) {
  std::vector<double> v;
  for (int64_t i = 0; t && i < t->numel(); ++i) v.push_back(t->as_double(i));
  return v;
}

Expected<Forest> read_forest(const KernelCtx& c) {
  const Node& n = c.node();
  Forest f;
  f.splits = tensor_doubles(n.attr_tensor("nodes_splits"));
  f.features = n.attr_ints("nodes_featureids");
  f.true_ids = n.attr_ints("nodes_truenodeids");
  f.false_ids = n.attr_ints("nodes_falsenodeids");
  f.true_leaf = n.attr_ints("nodes_trueleafs");
  f.false_leaf = n.attr_ints("nodes_falseleafs");
  const size_t nn = f.features.size();
  f.missing_true = n.attr_ints("nodes_missing_value_tracks_true", std::vector<int64_t>(nn, 0));
  for (double m : tensor_doubles(n.attr_tensor("nodes_modes"))) {
    if (m < 0 || m > 6) return c.error("nodes_modes has an unknown mode {}", m);
    f.modes.push_back(NodeMode(int(m)));
  }
  f.leaf_weights = tensor_doubles(n.attr_tensor("leaf_weights"));
  f.leaf_targets = n.attr_ints("leaf_targetids");
  f.roots = n.attr_ints("tree_roots");
  f.n_targets = n.attr_int("n_targets", 1);
  const int64_t agg = n.attr_int("aggregate_function", 1);
  if (agg < 0 || agg > 3) return c.error("aggregate_function {} is not 0..3", agg);
  f.aggregate = Aggregate(agg);
  f.post_transform = n.attr_int("post_transform", 0);
  if (f.splits.size() != nn || f.true_ids.size() != nn || f.false_ids.size() != nn || f.true_leaf.size() != nn ||
      f.false_leaf.size() != nn || f.modes.size() != nn || f.missing_true.size() != nn ||
      f.leaf_weights.size() != f.leaf_targets.size() || f.n_targets < 1) {
    return c.error("the nodes_* attributes (and the leaf_* ones) must all have the same length");
  }
  for (int64_t t : f.leaf_targets) {
    if (t < 0 || t >= f.n_targets) return c.error("leaf_targetids has {} outside [0, {})", t, f.n_targets);
  }
  // Membership sets follow the order of the BRANCH_MEMBER nodes, each ended by a NaN.
  std::vector<double> mv = tensor_doubles(n.attr_tensor("membership_values"));
  f.members.resize(nn);
  size_t pos = 0;
  for (size_t i = 0; i < nn; ++i) {
    if (f.modes[i] != NodeMode::kMember) continue;
    for (; pos < mv.size() && !std::isnan(mv[pos]); ++pos) f.members[i].push_back(mv[pos]);
    ++pos;  // the NaN
  }
  return f;
}

bool goes_true(const Forest& f, size_t node, double x) {
  if (std::isnan(x) && f.missing_true[node]) return true;
  const double s = f.splits[node];
  switch (f.modes[node]) {
    case NodeMode::kLeq: return x <= s;
    case NodeMode::kLt: return x < s;
    case NodeMode::kGte: return x >= s;
    case NodeMode::kGt: return x > s;
    case NodeMode::kEq: return x == s;
    case NodeMode::kNeq: return x != s;
    case NodeMode::kMember:
      return std::find(f.members[node].begin(), f.members[node].end(), x) != f.members[node].end();
  }
  return false;
}

// Walks one tree for one sample; returns the leaf index, or -1 on a malformed tree.
int64_t find_leaf(const Forest& f, int64_t root, const double* x, int64_t num_features) {
  const int64_t nn = int64_t(f.features.size());
  if (root < 0 || root >= nn) return -1;
  // A tree that is one leaf: both branches of its only node name the same leaf.
  if (f.true_leaf[size_t(root)] && f.false_leaf[size_t(root)] && f.true_ids[size_t(root)] == f.false_ids[size_t(root)]) {
    return f.true_ids[size_t(root)];
  }
  int64_t node = root;
  for (int64_t steps = 0; steps <= nn; ++steps) {  // a longer walk would be a cycle
    const size_t k = size_t(node);
    const int64_t feat = f.features[k];
    if (feat < 0 || feat >= num_features) return -1;
    const bool t = goes_true(f, k, x[feat]);
    const int64_t next = t ? f.true_ids[k] : f.false_ids[k];
    if (t ? f.true_leaf[k] : f.false_leaf[k]) return next;
    if (next < 0 || next >= nn) return -1;
    node = next;
  }
  return -1;
}

Status infer_tree_ensemble(InferCtx& c) {
  KILN_RETURN_IF_ERROR(check_input_class(c, 0, TypeClass::kFloat));
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  const Type& x = c.input_type(0);
  const Dim n = x.has_rank() && x.shape->rank() >= 1 ? (*x.shape)[0] : Dim();
  c.set_output_tensor(0, dt, Shape({n, Dim(c.node().attr_int("n_targets", 1))}));
  return Status::ok();
}

Status tree_ensemble_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  KILN_ASSIGN_OR_RETURN(Forest f, read_forest(c));
  if (f.post_transform != 0) return c.unsupported("TreeEnsemble post_transform {} (only NONE)", f.post_transform);
  const int64_t N = x.rank() == 0 ? 1 : x.dim(0), F = N == 0 ? 0 : x.numel() / N;
  std::vector<double> xs(size_t(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) xs[size_t(i)] = x.as_double(i);
  std::vector<double> out(size_t(N * f.n_targets), 0.0);
  const double init = f.aggregate == Aggregate::kMin ? HUGE_VAL : f.aggregate == Aggregate::kMax ? -HUGE_VAL : 0.0;
  for (int64_t s = 0; s < N; ++s) {
    double* o = &out[size_t(s * f.n_targets)];
    std::fill(o, o + f.n_targets, init);
    for (int64_t root : f.roots) {
      const int64_t leaf = find_leaf(f, root, &xs[size_t(s * F)], F);
      if (leaf < 0 || leaf >= int64_t(f.leaf_weights.size())) return c.error("tree at node {} is malformed", root);
      double& dst = o[f.leaf_targets[size_t(leaf)]];
      const double w = f.leaf_weights[size_t(leaf)];
      switch (f.aggregate) {
        case Aggregate::kAverage: dst += w / double(f.roots.size()); break;
        case Aggregate::kSum: dst += w; break;
        case Aggregate::kMin: dst = std::min(dst, w); break;
        case Aggregate::kMax: dst = std::max(dst, w); break;
      }
    }
  }
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, x.dtype(), {N, f.n_targets}));
  return visit_dtype(x.dtype(), [&]<typename T>() -> Status {
    if constexpr (!is_float_v<T>) {
      return c.unsupported("TreeEnsemble of {}", dtype_name(x.dtype()));
    } else {
      for (size_t i = 0; i < out.size(); ++i) {
        // Targets no leaf reached under MIN/MAX keep the type's extreme, as the reference does.
        double v = std::isinf(out[i]) ? (out[i] > 0 ? double(std::numeric_limits<compute_t<T>>::max())
                                                    : double(std::numeric_limits<compute_t<T>>::lowest()))
                                      : out[i];
        y->data<T>()[i] = static_cast<T>(static_cast<compute_t<T>>(v));
      }
      return Status::ok();
    }
  });
}

}  // namespace

void register_ml_ops(OpRegistry& r) {
  using K = Attribute::Kind;
  register_ml_transform_ops(r);
  r.def(OpKind::kArrayFeatureExtractor, {.inputs = {2, 2},
                                         .infer = infer_array_feature_extractor,
                                         .cpu = array_feature_extractor_cpu});
  r.def(OpKind::kBinarizer, {.inputs = {1, 1},
                             .attrs = {{"threshold", K::kFloat}},
                             .infer = infer_binarizer,
                             .cpu = binarizer_cpu});
  r.def(OpKind::kLabelEncoder, {.inputs = {1, 1},
                                .attrs = {{"default_float", K::kFloat}, {"default_int64", K::kInt},
                                          {"default_string", K::kString}, {"default_tensor", K::kTensor},
                                          {"keys_floats", K::kFloats}, {"keys_int64s", K::kInts},
                                          {"keys_strings", K::kStrings}, {"keys_tensor", K::kTensor},
                                          {"values_floats", K::kFloats}, {"values_int64s", K::kInts},
                                          {"values_strings", K::kStrings}, {"values_tensor", K::kTensor}},
                                .infer = infer_label_encoder,
                                .cpu = label_encoder_cpu});
  r.def(OpKind::kTreeEnsemble, {.inputs = {1, 1},
                                .attrs = {{"aggregate_function", K::kInt}, {"leaf_targetids", K::kInts, true},
                                          {"leaf_weights", K::kTensor, true}, {"membership_values", K::kTensor},
                                          {"n_targets", K::kInt}, {"nodes_falseleafs", K::kInts, true},
                                          {"nodes_falsenodeids", K::kInts, true}, {"nodes_featureids", K::kInts, true},
                                          {"nodes_hitrates", K::kTensor}, {"nodes_missing_value_tracks_true", K::kInts},
                                          {"nodes_modes", K::kTensor, true}, {"nodes_splits", K::kTensor, true},
                                          {"nodes_trueleafs", K::kInts, true}, {"nodes_truenodeids", K::kInts, true},
                                          {"post_transform", K::kInt}, {"tree_roots", K::kInts, true}},
                                .infer = infer_tree_ensemble,
                                .cpu = tree_ensemble_cpu});
}

}  // namespace kiln
