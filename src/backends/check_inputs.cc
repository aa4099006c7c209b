#include <map>

#include "backends/backend.h"

namespace kiln {

Status check_inputs(const Graph& g, const std::vector<Data>& inputs) {
  if (inputs.size() != g.inputs.size()) {
    return KILN_ERROR(kInvalidArgument, "the model takes {} inputs, {} were given", g.inputs.size(), inputs.size());
  }
  std::map<std::string, std::pair<int64_t, std::string>> bound;  // symbol -> value, where bound
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Value* v = g.inputs[i];
    const Data& d = inputs[i];
    const Type& t = v->type;
    std::string where = fmt::format("input '{}'", v->name);
    if (t.kind == Type::Kind::kTensor) {
      if (!d.is_tensor()) return KILN_ERROR(kInvalidArgument, "{}: expected a tensor {}, got {}", where, t.to_string(), d.summary());
      const Tensor& x = d.tensor;
      if (x.dtype() != t.dtype) {
        return KILN_ERROR(kInvalidArgument, "{}: expected element type {}, got {}", where, dtype_name(t.dtype), dtype_name(x.dtype()));
      }
      if (!t.shape) continue;
      if (t.shape->rank() != x.rank()) {
        return KILN_ERROR(kInvalidArgument, "{}: expected shape {}, got {} (rank {} vs {})", where, t.shape->to_string(),
                          dims_to_string(x.dims()), t.shape->rank(), x.rank());
      }
      for (size_t k = 0; k < x.rank(); ++k) {
        const Dim& dd = t.shape->dims[k];
        if (dd.is_static() && dd.value() != x.dim(k)) {
          return KILN_ERROR(kInvalidArgument, "{}: expected shape {}, got {} (dimension {})", where, t.shape->to_string(),
                            dims_to_string(x.dims()), k);
        }
        if (dd.is_symbolic()) {
          std::string sym = dd.to_string();
          auto [it, fresh] = bound.emplace(sym, std::make_pair(x.dim(k), where));
          if (!fresh && it->second.first != x.dim(k)) {
            return KILN_ERROR(kInvalidArgument, "{}: dimension '{}' is {} here but {} in {}", where, sym, x.dim(k),
                              it->second.first, it->second.second);
          }
        }
      }
    } else if (t.kind == Type::Kind::kSequence && !d.is_sequence()) {
      return KILN_ERROR(kInvalidArgument, "{}: expected a sequence, got {}", where, d.summary());
    }
  }
  return Status::ok();
}

}  // namespace kiln
