// OpKind: the closed set of ops, generated from ops.def.
#pragma once

#include <optional>
#include <string_view>

namespace kiln {

enum class OpKind : uint16_t {
#define KILN_OP(name, domain, opset) k##name,
#include "ops/ops.def"
#undef KILN_OP
};

inline constexpr int kNumOps = 0
#define KILN_OP(name, domain, opset) +1
#include "ops/ops.def"
#undef KILN_OP
    ;

std::string_view op_name(OpKind op);
std::string_view op_domain(OpKind op);   // "" for ai.onnx
int op_canonical_opset(OpKind op);
std::optional<OpKind> op_from_name(std::string_view domain, std::string_view name);

}  // namespace kiln
