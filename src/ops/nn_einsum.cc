// Einsum (matmul family): numpy.einsum semantics. The equation gives every dim of every operand a
// label; labels in the output are kept, the others are summed over. A label repeated within one
// operand takes its diagonal; "..." stands for the leading broadcast dims (right-aligned across
// operands). Without "->", the output is the ellipsis dims then the labels used exactly once, in
// ASCII order (as numpy does).
//
// The kernel is the definition: each output element sums, over every value of the summed labels,
// the product of the operands' elements, with per-operand strides per label (a repeated label adds
// its strides, which walks the diagonal; a broadcast dim of size 1 has stride 0).
#include <algorithm>
#include <string>

#include "ops/nn_util.h"

namespace kiln {
namespace {

constexpr int kLetters = 52;  // a-z -> 0..25, A-Z -> 26..51, ellipsis dim j -> 52 + j

int label_of(char ch) { return ch >= 'a' && ch <= 'z' ? ch - 'a' : ch >= 'A' && ch <= 'Z' ? ch - 'A' + 26 : -1; }

struct EinsumSpec {
  std::vector<std::vector<int>> inputs;  // the label of each dim of each operand
  std::vector<int> output;               // the labels of the output dims
  int num_labels = kLetters;             // letters plus the ellipsis dims
};

// One term: its letters, and where "..." stood (-1 if absent).
struct Term {
  std::vector<int> letters;
  int ellipsis_at = -1;
};

template <typename Ctx>
Expected<Term> parse_term(const Ctx& c, const std::string& s) {
  Term t;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '.') {
      if (s.compare(i, 3, "...") != 0 || t.ellipsis_at >= 0) return c.error("bad ellipsis in einsum term '{}'", s);
      t.ellipsis_at = int(t.letters.size());
      i += 2;
    } else if (label_of(s[i]) >= 0) {
      t.letters.push_back(label_of(s[i]));
    } else {
      return c.error("einsum term '{}' has the character '{}'; only letters and '...' are allowed", s, s[i]);
    }
  }
  return t;
}

// The labels of a term's dims, with its ellipsis covering `ell` dims right-aligned in `total`.
std::vector<int> expand_term(const Term& t, int ell, int total) {
  std::vector<int> labels(t.letters.begin(), t.letters.end());
  if (t.ellipsis_at >= 0) {
    std::vector<int> e;
    for (int j = total - ell; j < total; ++j) e.push_back(kLetters + j);
    labels.insert(labels.begin() + t.ellipsis_at, e.begin(), e.end());
  }
  return labels;
}

std::string strip_spaces(std::string s) {
  s.erase(std::remove(s.begin(), s.end(), ' '), s.end());
  return s;
}

template <typename Ctx>
Expected<EinsumSpec> parse_einsum(const Ctx& c, const std::vector<size_t>& ranks) {
  const std::string eq = strip_spaces(c.node().attr_string("equation", ""));
  const size_t arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow);
  std::vector<Term> terms;
  for (size_t start = 0;;) {
    size_t comma = lhs.find(',', start);
    KILN_ASSIGN_OR_RETURN(Term t, parse_term(c, lhs.substr(start, comma == std::string::npos ? comma : comma - start)));
    terms.push_back(std::move(t));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (terms.size() != ranks.size()) {
    return c.error("equation '{}' has {} operands but the node has {} inputs", eq, terms.size(), ranks.size());
  }
  // The ellipsis of each operand covers the dims its letters do not.
  std::vector<int> ell(terms.size(), 0);
  int total_ell = 0;
  bool any_ellipsis = false;
  for (size_t i = 0; i < terms.size(); ++i) {
    const int letters = int(terms[i].letters.size()), rank = int(ranks[i]);
    const bool has = terms[i].ellipsis_at >= 0;
    if (has ? letters > rank : letters != rank) {
      return c.error("operand {} has rank {} but its einsum term has {} labels{}", i, rank, letters,
                     has ? " and an ellipsis" : "");
    }
    ell[i] = has ? rank - letters : 0;
    total_ell = std::max(total_ell, ell[i]);
    any_ellipsis = any_ellipsis || has;
  }
  EinsumSpec spec;
  spec.num_labels = kLetters + total_ell;
  std::vector<int> count(size_t(kLetters), 0);
  for (size_t i = 0; i < terms.size(); ++i) {
    spec.inputs.push_back(expand_term(terms[i], ell[i], total_ell));
    for (int l : terms[i].letters) ++count[size_t(l)];
  }
  if (arrow == std::string::npos) {
    for (int j = 0; any_ellipsis && j < total_ell; ++j) spec.output.push_back(kLetters + j);
    for (int l : {26, 0}) {  // ASCII order: A-Z before a-z
      for (int k = l; k < l + 26; ++k) {
        if (count[size_t(k)] == 1) spec.output.push_back(k);
      }
    }
    return spec;
  }
  KILN_ASSIGN_OR_RETURN(Term out, parse_term(c, eq.substr(arrow + 2)));
  for (int l : out.letters) {
    if (count[size_t(l)] == 0) return c.error("output label of equation '{}' is not in any operand", eq);
    if (std::count(out.letters.begin(), out.letters.end(), l) > 1) {
      return c.error("equation '{}' repeats an output label", eq);
    }
  }
  spec.output = expand_term(out, out.ellipsis_at >= 0 ? total_ell : 0, total_ell);
  return spec;
}

// The size of every label: the operands' dims, which must agree (or be 1, which broadcasts).
template <typename D, typename Ctx>
Expected<std::vector<D>> label_sizes(const Ctx& c, const EinsumSpec& spec, const std::vector<std::vector<D>>& dims) {
  std::vector<D> size(size_t(spec.num_labels), D(int64_t{1}));
  std::vector<bool> seen(size.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    for (size_t k = 0; k < dims[i].size(); ++k) {
      const size_t l = size_t(spec.inputs[i][k]);
      const D& d = dims[i][k];
      if constexpr (std::is_same_v<D, Dim>) {
        if (d.is_static() && d.value() == 1) continue;
        if (!seen[l] || (!size[l].is_static() && d.is_static())) size[l] = d;
        else if (!size[l].compatible(d)) return c.error("einsum operand {} dim {} is {}, expected {}", i, k, d.to_string(), size[l].to_string());
      } else {
        if (d == 1) continue;
        if (seen[l] && size[l] != d) return c.error("einsum operand {} dim {} is {}, expected {}", i, k, d, size[l]);
        size[l] = d;
      }
      seen[l] = true;
    }
  }
  return size;
}

std::vector<size_t> operand_ranks(const std::vector<std::vector<int64_t>>& dims) {
  std::vector<size_t> r;
  for (const auto& d : dims) r.push_back(d.size());
  return r;
}

Status infer_einsum(InferCtx& c) {
  KILN_RETURN_IF_ERROR(check_same_dtype(c, 0, c.num_inputs()));
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  if (!visit_dtype(dt, [&]<typename T>() { return is_numeric_v<T>; })) {
    return c.error("Einsum does not accept element type {}", dtype_name(dt));
  }
  std::vector<std::vector<Dim>> dims;
  std::vector<size_t> ranks;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    const Type& t = c.input_type(i);
    if (!t.has_rank()) {
      c.set_output_tensor(0, dt, std::nullopt);
      return Status::ok();
    }
    dims.push_back(t.shape->dims);
    ranks.push_back(t.shape->rank());
  }
  KILN_ASSIGN_OR_RETURN(EinsumSpec spec, parse_einsum(c, ranks));
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> size, label_sizes<Dim>(c, spec, dims));
  std::vector<Dim> out;
  for (int l : spec.output) out.push_back(size[size_t(l)]);
  c.set_output_tensor(0, dt, Shape(out));
  return Status::ok();
}

template <typename T>
Status einsum_typed(KernelCtx& c, const EinsumSpec& spec, const std::vector<int64_t>& size) {
  using A = nn_acc_t<T>;
  const size_t n_in = c.num_inputs();
  // The labels summed over: in some operand but not in the output.
  std::vector<bool> in_output(size.size(), false), used(size.size(), false);
  for (int l : spec.output) in_output[size_t(l)] = true;
  std::vector<int> summed;
  for (const auto& labels : spec.inputs) {
    for (int l : labels) {
      if (!in_output[size_t(l)] && !used[size_t(l)]) summed.push_back(l);
      used[size_t(l)] = true;
    }
  }
  // Per operand: its stride along each output label and each summed label (0 where it lacks it).
  std::vector<std::vector<int64_t>> out_strides(n_in), sum_strides(n_in);
  for (size_t i = 0; i < n_in; ++i) {
    std::vector<int64_t> label_stride(size.size(), 0);
    const std::vector<int64_t> st = strides_of(c.tensor(i).dims());
    for (size_t k = 0; k < st.size(); ++k) {
      if (c.tensor(i).dim(k) != 1) label_stride[size_t(spec.inputs[i][k])] += st[k];
    }
    for (int l : spec.output) out_strides[i].push_back(label_stride[size_t(l)]);
    for (int l : summed) sum_strides[i].push_back(label_stride[size_t(l)]);
  }
  std::vector<int64_t> out_dims, sum_dims;
  for (int l : spec.output) out_dims.push_back(size[size_t(l)]);
  for (int l : summed) sum_dims.push_back(size[size_t(l)]);
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, c.tensor(0).dtype(), out_dims));
  std::vector<const T*> data;
  for (size_t i = 0; i < n_in; ++i) data.push_back(c.tensor(i).data<T>());
  T* out = y->data<T>();
  const int64_t inner = prod_from(sum_dims, 0);
  parallel_for(y->numel(), std::max<int64_t>(1, 4096 / std::max<int64_t>(inner, 1)), [&](int64_t o0, int64_t o1) {
    std::vector<int64_t> base(n_in);
    for (int64_t o = o0; o < o1; ++o) {
      // Decompose the output index into label values to find each operand's base offset.
      std::fill(base.begin(), base.end(), 0);
      for (int64_t rem = o, k = int64_t(out_dims.size()) - 1; k >= 0; --k) {
        const int64_t v = rem % out_dims[size_t(k)];
        rem /= out_dims[size_t(k)];
        for (size_t i = 0; i < n_in; ++i) base[i] += v * out_strides[i][size_t(k)];
      }
      A acc = 0;
      for (StridedIter it(sum_dims, sum_strides); !it.done(); it.next()) {
        A p = 1;
        for (size_t i = 0; i < n_in; ++i) p = mul_add(A(0), p, nn_to_acc(data[i][base[i] + it.offset(i)]));
        acc = mul_add(acc, p, A(1));
      }
      out[o] = nn_from_acc<T>(acc);
    }
  });
  return Status::ok();
}

Status einsum_cpu(KernelCtx& c) {
  std::vector<std::vector<int64_t>> dims;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    if (c.tensor(i).dtype() != c.tensor(0).dtype()) {
      return c.error("operands must share a type: {} vs {}", c.tensor(0).summary(), c.tensor(i).summary());
    }
    dims.push_back(c.tensor(i).dims());
  }
  KILN_ASSIGN_OR_RETURN(EinsumSpec spec, parse_einsum(c, operand_ranks(dims)));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> size, label_sizes<int64_t>(c, spec, dims));
  return visit_dtype(c.tensor(0).dtype(), [&]<typename T>() -> Status {
    if constexpr (!is_numeric_v<T>) return c.unsupported("Einsum on {}", dtype_name(c.tensor(0).dtype()));
    else return einsum_typed<T>(c, spec, size);
  });
}

}  // namespace

void register_einsum_op(OpRegistry& r) {
  r.def(OpKind::kEinsum, {.inputs = {1, kVariadic},
                          .attrs = {{"equation", Attribute::Kind::kString, true}},
                          .infer = infer_einsum, .cpu = einsum_cpu});
}

}  // namespace kiln
