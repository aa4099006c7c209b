#include "ops/control_util.h"

#include <algorithm>
#include <cstring>

namespace kiln {

Type join_types(const Type& a, const Type& b) {
  // An unknown type carries no information: the other side is the answer.
  if (!a.is_known()) return b;
  if (!b.is_known()) return a;
  if (a.kind != b.kind) {
    if (a.kind == Type::Kind::kOptional) return Type::optional(join_types(*a.elem, b));
    if (b.kind == Type::Kind::kOptional) return Type::optional(join_types(a, *b.elem));
    return Type();
  }
  switch (a.kind) {
    case Type::Kind::kUnknown: return Type();
    case Type::Kind::kSequence: return Type::sequence(join_types(*a.elem, *b.elem));
    case Type::Kind::kOptional: return Type::optional(join_types(*a.elem, *b.elem));
    case Type::Kind::kTensor: break;
  }
  if (a.dtype != b.dtype) return Type();
  if (!a.shape || !b.shape || a.shape->rank() != b.shape->rank()) return Type::tensor(a.dtype);
  Shape s = *a.shape;
  for (size_t i = 0; i < s.rank(); ++i) {
    if (!s[i].same_as((*b.shape)[i])) s[i] = Dim();
  }
  return Type::tensor(a.dtype, std::move(s));
}

namespace {

// The types inference wrote into a body (and the bodies nested in it), so a later round can
// start from what the model declared instead of from the previous round's guesses.
class TypeSnapshot {
 public:
  explicit TypeSnapshot(const Graph& g) { add(g); }
  void restore() const {
    for (const Saved& s : saved_) {
      s.value->type = s.type;
      s.value->dims_value = s.dims_value;
    }
  }

 private:
  void add(const Graph& g) {
    for (const auto& v : g.values) saved_.push_back({v.get(), v->type, v->dims_value});
    for (const auto& n : g.nodes) {
      for (const auto& [name, a] : n->attrs) {
        if (a.g) add(*a.g);
        for (const auto& sg : a.graphs) add(*sg);
      }
    }
  }
  struct Saved {
    Value* value;
    Type type;
    std::optional<std::vector<Dim>> dims_value;
  };
  std::vector<Saved> saved_;
};

}  // namespace

Expected<std::vector<Type>> infer_body_fixpoint(const InferCtx& c, const Graph& body, const std::vector<Type>& before,
                                                std::vector<Type>& carried, const std::vector<Type>& after,
                                                size_t outputs_before) {
  // Every round only widens some carried type, so this settles; the bound is a safety net.
  constexpr int kMaxRounds = 8;
  TypeSnapshot snapshot(body);
  for (int round = 0;; ++round) {
    std::vector<Type> in = before;
    in.insert(in.end(), carried.begin(), carried.end());
    in.insert(in.end(), after.begin(), after.end());
    KILN_ASSIGN_OR_RETURN(std::vector<Type> out, c.infer_graph(body, in));
    if (out.size() < outputs_before + carried.size()) {
      return c.error("body graph '{}' has {} outputs, expected at least {}", body.name, out.size(),
                     outputs_before + carried.size());
    }
    bool settled = true;
    for (size_t k = 0; k < carried.size(); ++k) {
      Type j = join_types(carried[k], out[outputs_before + k]);
      if (!(j == carried[k])) {
        settled = false;
        carried[k] = std::move(j);
      }
    }
    if (settled || round == kMaxRounds) return out;
    snapshot.restore();
  }
}

Type with_inserted_dim(const Type& t, size_t axis, Dim d) {
  if (!t.is_tensor()) return Type();
  if (!t.shape || axis > t.shape->rank()) return Type::tensor(t.dtype);
  Shape s = *t.shape;
  s.dims.insert(s.dims.begin() + std::ptrdiff_t(axis), std::move(d));
  return Type::tensor(t.dtype, std::move(s));
}

Expected<Type> sequence_elem_type(const InferCtx& c, size_t i) {
  const Type& t = c.input_type(i);
  if (!t.is_known()) return Type();
  if (t.kind != Type::Kind::kSequence) return c.error("input {} must be a sequence, got {}", i, t.to_string());
  return *t.elem;
}

// ---- tensor copies ---------------------------------------------------------------------------

namespace {

void copy_elems(const Tensor& src, int64_t src_off, Tensor& dst, int64_t dst_off, int64_t n) {
  if (n <= 0) return;
  if (src.dtype() == DType::kString) {
    std::copy_n(src.data<std::string>() + src_off, n, dst.data<std::string>() + dst_off);
    return;
  }
  size_t es = dtype_size(src.dtype());
  std::memcpy(static_cast<char*>(dst.raw()) + size_t(dst_off) * es,
              static_cast<const char*>(src.raw()) + size_t(src_off) * es, size_t(n) * es);
}

int64_t prod(const std::vector<int64_t>& d, size_t b, size_t e) {
  int64_t p = 1;
  for (size_t i = b; i < e; ++i) p *= d[i];
  return p;
}

}  // namespace

Expected<Tensor> slice_axis(const Tensor& t, size_t axis, int64_t start, int64_t len) {
  std::vector<int64_t> dims = t.dims();
  int64_t outer = prod(dims, 0, axis), mid = dims[axis], inner = prod(dims, axis + 1, dims.size());
  dims[axis] = len;
  KILN_ASSIGN_OR_RETURN(Tensor out, Tensor::create(t.dtype(), dims));
  for (int64_t o = 0; o < outer; ++o) copy_elems(t, (o * mid + start) * inner, out, o * len * inner, len * inner);
  return out;
}

Expected<Tensor> concat_axis(const KernelCtx& c, const std::vector<Tensor>& items, size_t axis) {
  if (items.empty()) return c.error("cannot concatenate an empty list of tensors");
  const Tensor& first = items[0];
  std::vector<int64_t> dims = first.dims();
  if (axis >= dims.size()) return c.error("concat axis {} is out of range for rank {}", axis, dims.size());
  dims[axis] = 0;
  for (const Tensor& t : items) {
    bool same = t.dtype() == first.dtype() && t.rank() == first.rank();
    for (size_t k = 0; same && k < t.rank(); ++k) same = k == axis || t.dim(k) == first.dim(k);
    if (!same) return c.error("cannot concatenate {} with {} along axis {}", t.summary(), first.summary(), axis);
    dims[axis] += t.dim(axis);
  }
  KILN_ASSIGN_OR_RETURN(Tensor out, Tensor::create(first.dtype(), dims));
  int64_t outer = prod(dims, 0, axis), inner = prod(dims, axis + 1, dims.size());
  int64_t pos = 0;
  for (int64_t o = 0; o < outer; ++o) {
    for (const Tensor& t : items) {
      int64_t n = t.dim(axis) * inner;
      copy_elems(t, o * n, out, pos, n);
      pos += n;
    }
  }
  return out;
}

Expected<Tensor> stack_axis(const KernelCtx& c, const std::vector<Tensor>& items, size_t axis) {
  if (items.empty()) return c.error("cannot stack an empty list of tensors");
  std::vector<Tensor> expanded;
  for (const Tensor& t : items) {
    if (t.dims() != items[0].dims()) {
      return c.error("cannot stack {} with {}: every iteration must give the same shape", t.summary(),
                     items[0].summary());
    }
    std::vector<int64_t> d = t.dims();
    d.insert(d.begin() + std::ptrdiff_t(axis), 1);
    expanded.push_back(t.reshaped(d));
  }
  return concat_axis(c, expanded, axis);
}

Expected<Tensor> empty_of_type(const KernelCtx& c, const Type& t) {
  if (!t.is_tensor() || !t.shape) {
    return c.error("cannot build the empty output of a zero-iteration loop: its type {} has no known rank",
                   t.to_string());
  }
  std::vector<int64_t> dims;
  for (const Dim& d : t.shape->dims) dims.push_back(d.is_static() ? d.value() : 0);
  return Tensor::create(t.dtype, dims);
}

}  // namespace kiln
