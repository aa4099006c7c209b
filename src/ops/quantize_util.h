// What the quantize family's ops look like to the passes and backends that compile them rather
// than run the reference kernels (ops/quantize.cc).
#pragma once

#include <functional>
#include <string>

#include "ir/graph.h"

namespace kiln {

// True when n is a QuantizeLinear or DequantizeLinear with one scale for the whole tensor: a
// constant scalar float32 scale, an absent or constant scalar zero point, an 8-bit integer quantized
// side (int8 or uint8) and a float32/16/bf16 float side, no block_size and no precision attribute.
// Such a node is plain elementwise arithmetic that a generated kernel can do (fuse-elementwise
// groups it; the CUDA backend generates it alone too). `constant` gives a value's constant tensor,
// or null. Otherwise false with the reason in *why.
bool is_scalar_int8_qdq(const Node& n, const std::function<const Tensor*(const Value*)>& constant,
                        std::string* why = nullptr);

}  // namespace kiln
