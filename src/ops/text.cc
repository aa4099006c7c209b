// Op family: text. StringNormalizer, TfIdfVectorizer, RegexFullMatch, StringConcat, StringSplit.
//
// Case changes are ASCII-only (bytes >= 0x80 pass through unchanged), and RegexFullMatch uses
// std::regex's ECMAScript grammar, which agrees with RE2 on the common subset (classes, \w \d \b,
// groups, alternation, bounded repetition) but not on RE2-only syntax such as (?P<name>...).
#include <algorithm>
#include <cctype>
#include <map>
#include <regex>
#include <set>

#include "ops/elementwise_util.h"

namespace kiln {

namespace {

Status require_string(const InferCtx& c, size_t i) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(i));
  if (dt != DType::kString) return c.error("input {} must be a string tensor, got {}", i, dtype_name(dt));
  return Status::ok();
}

std::string ascii_lower(std::string s) {
  for (char& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}
std::string ascii_upper(std::string s) {
  for (char& ch : s) ch = char(std::toupper(static_cast<unsigned char>(ch)));
  return s;
}

// ---- StringNormalizer ------------------------------------------------------------------------

Status infer_string_normalizer(InferCtx& c) {
  KILN_RETURN_IF_ERROR(require_string(c, 0));
  const std::string action = c.node().attr_string("case_change_action", "NONE");
  if (action != "NONE" && action != "LOWER" && action != "UPPER") {
    return c.error("case_change_action must be NONE, LOWER or UPPER, got '{}'", action);
  }
  const Type& x = c.input_type(0);
  if (x.has_rank() && x.shape->rank() != 1 && !(x.shape->rank() == 2 && (*x.shape)[0].compatible(Dim(1)))) {
    return c.error("X must be [C] or [1, C], got {}", x.to_string());
  }
  // Stop words are removed, so the length along C depends on the data.
  std::optional<Shape> out;
  if (x.has_rank()) out = x.shape->rank() == 1 ? Shape({Dim()}) : Shape({Dim(1), Dim()});
  c.set_output_tensor(0, DType::kString, out);
  return Status::ok();
}

Status string_normalizer_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  if (x.rank() != 1 && !(x.rank() == 2 && x.dim(0) == 1)) return c.error("X must be [C] or [1, C], got {}", x.summary());
  const Node& n = c.node();
  const std::string action = n.attr_string("case_change_action", "NONE");
  const bool case_sensitive = n.attr_int("is_case_sensitive", 0) != 0;
  std::set<std::string> stops;
  for (const std::string& s : n.attr_strings("stopwords")) stops.insert(case_sensitive ? s : ascii_lower(s));
  std::vector<std::string> kept;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const std::string& s = x.data<std::string>()[i];
    if (stops.count(case_sensitive ? s : ascii_lower(s))) continue;
    kept.push_back(action == "LOWER" ? ascii_lower(s) : action == "UPPER" ? ascii_upper(s) : s);
  }
  // An all-stopwords input gives one empty string rather than an empty tensor (as ONNX Runtime).
  if (kept.empty()) kept.emplace_back();
  std::vector<int64_t> dims = x.rank() == 1 ? std::vector<int64_t>{int64_t(kept.size())}
                                            : std::vector<int64_t>{1, int64_t(kept.size())};
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, DType::kString, dims));
  std::move(kept.begin(), kept.end(), y->data<std::string>());
  return Status::ok();
}

// ---- StringConcat ----------------------------------------------------------------------------

Status infer_string_concat(InferCtx& c) {
  KILN_RETURN_IF_ERROR(require_string(c, 0));
  KILN_RETURN_IF_ERROR(require_string(c, 1));
  return infer_broadcast_same_dtype(c);
}

Status string_concat_cpu(KernelCtx& c) {
  const Tensor& a = c.tensor(0);
  const Tensor& b = c.tensor(1);
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> dims, broadcast_dims(c, {a.dims(), b.dims()}));
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, DType::kString, dims));
  std::string* out = y->data<std::string>();
  int64_t i = 0;
  for (StridedIter it(dims, {broadcast_strides(a.dims(), dims), broadcast_strides(b.dims(), dims)}); !it.done(); it.next()) {
    out[i++] = a.data<std::string>()[it.offset(0)] + b.data<std::string>()[it.offset(1)];
  }
  return Status::ok();
}

// ---- RegexFullMatch --------------------------------------------------------------------------

template <typename Ctx>
Expected<std::regex> compile_pattern(const Ctx& c) {
  const std::string p = c.node().attr_string("pattern", "");
  try {
    return std::regex(p, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return c.error("pattern '{}' is not a valid regular expression: {}", p, e.what());
  }
}

Status infer_regex_full_match(InferCtx& c) {
  KILN_RETURN_IF_ERROR(require_string(c, 0));
  if (Expected<std::regex> re = compile_pattern(c); !re) return re.status();
  c.set_output_tensor(0, DType::kBool, c.input_type(0).shape);
  return Status::ok();
}

Status regex_full_match_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  KILN_ASSIGN_OR_RETURN(std::regex re, compile_pattern(c));
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, DType::kBool, x.dims()));
  for (int64_t i = 0; i < x.numel(); ++i) y->data<bool>()[i] = std::regex_match(x.data<std::string>()[i], re);
  return Status::ok();
}

// ---- StringSplit -----------------------------------------------------------------------------

// Python's str.split(delimiter, maxsplit): with a delimiter, exact splits (empty fields kept);
// without one, runs of whitespace separate fields and leading/trailing whitespace is dropped.
std::vector<std::string> split_string(const std::string& s, const std::string& delim, int64_t maxsplit) {
  std::vector<std::string> parts;
  if (!delim.empty()) {
    size_t start = 0;
    for (;;) {
      size_t pos = maxsplit >= 0 && int64_t(parts.size()) >= maxsplit ? std::string::npos : s.find(delim, start);
      if (pos == std::string::npos) break;
      parts.push_back(s.substr(start, pos - start));
      start = pos + delim.size();
    }
    parts.push_back(s.substr(start));
    return parts;
  }
  auto space = [](char ch) { return std::isspace(static_cast<unsigned char>(ch)) || (ch >= 0x1c && ch <= 0x1f); };
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && space(s[i])) ++i;
    if (i == s.size()) break;
    if (maxsplit >= 0 && int64_t(parts.size()) >= maxsplit) {
      parts.push_back(s.substr(i));  // the remainder keeps its inner and trailing whitespace
      break;
    }
    size_t j = i;
    while (j < s.size() && !space(s[j])) ++j;
    parts.push_back(s.substr(i, j - i));
    i = j;
  }
  return parts;
}

Status infer_string_split(InferCtx& c) {
  KILN_RETURN_IF_ERROR(require_string(c, 0));
  const Type& x = c.input_type(0);
  std::optional<Shape> y, z = x.shape;
  if (x.has_rank()) {
    y = *x.shape;
    y->dims.push_back(Dim());  // the most fields any string splits into
  }
  c.set_output_tensor(0, DType::kString, y);
  c.set_output_tensor(1, DType::kInt64, z);
  return Status::ok();
}

Status string_split_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const std::string delim = c.node().attr_string("delimiter", "");
  const int64_t maxsplit = c.node().attr_int("maxsplit", -1);
  std::vector<std::vector<std::string>> parts(size_t(x.numel()));
  size_t widest = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    parts[size_t(i)] = split_string(x.data<std::string>()[i], delim, maxsplit);
    widest = std::max(widest, parts[size_t(i)].size());
  }
  std::vector<int64_t> dims = x.dims();
  KILN_ASSIGN_OR_RETURN(Tensor * z, c.alloc_output(1, DType::kInt64, dims));
  dims.push_back(int64_t(widest));
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, DType::kString, dims));
  for (int64_t i = 0; i < x.numel(); ++i) {
    const auto& p = parts[size_t(i)];
    z->data<int64_t>()[i] = int64_t(p.size());
    std::copy(p.begin(), p.end(), y->data<std::string>() + i * int64_t(widest));
  }
  return Status::ok();
}

// ---- TfIdfVectorizer -------------------------------------------------------------------------

// The attributes, with the pool of n-grams indexed for lookup. K is int64_t or std::string.
template <typename K>
struct NgramPool {
  std::map<std::vector<K>, int64_t> index;  // n-gram -> output column
  int64_t min_n, max_n, max_skip, columns;
};

template <typename K>
Expected<NgramPool<K>> build_pool(const KernelCtx& c, const std::vector<K>& pool) {
  const Node& n = c.node();
  NgramPool<K> p;
  p.min_n = n.attr_int("min_gram_length", 1);
  p.max_n = n.attr_int("max_gram_length", 1);
  p.max_skip = n.attr_int("max_skip_count", 0);
  if (p.min_n < 1 || p.max_n < p.min_n || p.max_skip < 0) {
    return c.error("need 1 <= min_gram_length ({}) <= max_gram_length ({}) and max_skip_count ({}) >= 0",
                   p.min_n, p.max_n, p.max_skip);
  }
  const std::vector<int64_t> counts = n.attr_ints("ngram_counts");
  const std::vector<int64_t> indexes = n.attr_ints("ngram_indexes");
  p.columns = indexes.empty() ? 0 : *std::max_element(indexes.begin(), indexes.end()) + 1;
  // ngram_counts[i] is where the (i+1)-grams start in the pool; ngram ids count across all sizes.
  int64_t id = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const int64_t size = int64_t(i) + 1;
    const int64_t begin = counts[i], end = i + 1 < counts.size() ? counts[i + 1] : int64_t(pool.size());
    if (begin < 0 || end < begin || end > int64_t(pool.size())) return c.error("ngram_counts {} do not fit the pool", i);
    for (int64_t s = begin; s + size <= end; s += size, ++id) {
      if (id >= int64_t(indexes.size()) || indexes[size_t(id)] < 0) return c.error("ngram_indexes has no valid entry {}", id);
      if (size >= p.min_n && size <= p.max_n) {
        p.index.emplace(std::vector<K>(pool.begin() + s, pool.begin() + s + size), indexes[size_t(id)]);
      }
    }
  }
  return p;
}

// Counts pool n-grams in each row: every start, every skip (gap) 0..max_skip, every size; a
// unigram is counted once, not once per skip.
template <typename K>
void count_ngrams(const std::vector<K>& row, const NgramPool<K>& p, int64_t* counts) {
  const int64_t len = int64_t(row.size());
  std::vector<K> gram;
  // A gap past the row's end matches nothing: bounding it keeps a huge max_skip_count (an
  // attribute, so any int64) from looping for ever or overflowing (found by kiln_fuzz_run).
  const int64_t max_skip = std::min(p.max_skip, len);
  for (int64_t start = 0; start < len; ++start) {
    for (int64_t d = 1; d <= max_skip + 1; ++d) {
      if (d > 1 && start + d >= len) break;  // not even a 2-gram with this gap fits
      for (int64_t size = std::max<int64_t>(p.min_n, d > 1 ? 2 : 1); size <= p.max_n; ++size) {
        if (size - 1 > (len - 1 - start) / d) break;  // its last element, start + (size - 1) * d, is past the end
        gram.clear();
        for (int64_t k = 0; k < size; ++k) gram.push_back(row[size_t(start + k * d)]);
        auto it = p.index.find(gram);
        if (it != p.index.end()) ++counts[it->second];
      }
    }
  }
}

Status infer_tfidf(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  if (dt != DType::kString && dt != DType::kInt32 && dt != DType::kInt64) {
    return c.error("X must be string, int32 or int64, got {}", dtype_name(dt));
  }
  const std::string mode = c.node().attr_string("mode", "");
  if (mode != "TF" && mode != "IDF" && mode != "TFIDF") return c.error("mode must be TF, IDF or TFIDF, got '{}'", mode);
  std::vector<int64_t> idx = c.node().attr_ints("ngram_indexes");
  Dim cols = idx.empty() ? Dim(int64_t{0}) : Dim(*std::max_element(idx.begin(), idx.end()) + 1);
  const Type& x = c.input_type(0);
  std::optional<Shape> out;
  if (x.has_rank()) {
    if (x.shape->rank() > 2) return c.error("X must be [C] or [B, C], got {}", x.to_string());
    out = x.shape->rank() == 2 ? Shape({(*x.shape)[0], cols}) : Shape({cols});
  }
  c.set_output_tensor(0, DType::kFloat32, out);
  return Status::ok();
}

template <typename K>
Status tfidf_rows(KernelCtx& c, const std::vector<K>& pool_values, const std::vector<std::vector<K>>& rows, bool batched) {
  KILN_ASSIGN_OR_RETURN(NgramPool<K> p, build_pool(c, pool_values));
  const int64_t B = int64_t(rows.size());
  std::vector<int64_t> counts(size_t(B * p.columns), 0);
  for (int64_t b = 0; b < B; ++b) count_ngrams(rows[size_t(b)], p, counts.data() + b * p.columns);
  std::vector<int64_t> dims = batched ? std::vector<int64_t>{B, p.columns} : std::vector<int64_t>{p.columns};
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, DType::kFloat32, dims));
  const std::string mode = c.node().attr_string("mode", "TF");
  const std::vector<float> w = c.node().attr_floats("weights");
  if (!w.empty() && int64_t(w.size()) < p.columns) return c.error("weights has {} values, need {}", w.size(), p.columns);
  for (int64_t i = 0; i < int64_t(counts.size()); ++i) {
    const double f = double(counts[size_t(i)]);
    const double wi = w.empty() ? 1.0 : double(w[size_t(i % std::max<int64_t>(p.columns, 1))]);
    double v = f;                                    // TF: the raw count
    if (mode == "IDF") v = f > 0 ? wi : 0.0;         // IDF: the weight where the n-gram occurs
    else if (mode == "TFIDF") v = wi * f;            // TFIDF: count times weight
    y->data<float>()[i] = float(v);
  }
  return Status::ok();
}

Status tfidf_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  if (x.rank() > 2) return c.error("X must be [C] or [B, C], got {}", x.summary());
  const bool batched = x.rank() == 2;
  const int64_t B = batched ? x.dim(0) : 1, C = x.rank() == 0 ? 1 : x.dims().back();
  if (x.dtype() == DType::kString) {
    std::vector<std::vector<std::string>> rows(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) rows[size_t(b)].assign(x.data<std::string>() + b * C, x.data<std::string>() + (b + 1) * C);
    return tfidf_rows<std::string>(c, c.node().attr_strings("pool_strings"), rows, batched);
  }
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < C; ++i) rows[size_t(b)].push_back(x.as_int(b * C + i));
  }
  return tfidf_rows<int64_t>(c, c.node().attr_ints("pool_int64s"), rows, batched);
}

}  // namespace

void register_text_ops(OpRegistry& r) {
  using K = Attribute::Kind;
  r.def(OpKind::kStringNormalizer, {.inputs = {1, 1},
                                    .attrs = {{"case_change_action", K::kString},
                                              {"is_case_sensitive", K::kInt},
                                              {"locale", K::kString},
                                              {"stopwords", K::kStrings}},
                                    .infer = infer_string_normalizer,
                                    .cpu = string_normalizer_cpu});
  r.def(OpKind::kStringConcat, {.inputs = {2, 2}, .infer = infer_string_concat, .cpu = string_concat_cpu});
  r.def(OpKind::kRegexFullMatch, {.inputs = {1, 1},
                                  .attrs = {{"pattern", K::kString}},
                                  .infer = infer_regex_full_match,
                                  .cpu = regex_full_match_cpu});
  r.def(OpKind::kStringSplit, {.inputs = {1, 1},
                               .outputs = {2, 2},
                               .attrs = {{"delimiter", K::kString}, {"maxsplit", K::kInt}},
                               .infer = infer_string_split,
                               .cpu = string_split_cpu});
  r.def(OpKind::kTfIdfVectorizer, {.inputs = {1, 1},
                                   .attrs = {{"max_gram_length", K::kInt, true},
                                             {"max_skip_count", K::kInt, true},
                                             {"min_gram_length", K::kInt, true},
                                             {"mode", K::kString, true},
                                             {"ngram_counts", K::kInts, true},
                                             {"ngram_indexes", K::kInts, true},
                                             {"pool_int64s", K::kInts},
                                             {"pool_strings", K::kStrings},
                                             {"weights", K::kFloats}},
                                   .infer = infer_tfidf,
                                   .cpu = tfidf_cpu});
}

}  // namespace kiln
