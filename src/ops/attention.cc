// Op family: attention. See families.def for the ops it holds.
#include "ops/op_util.h"

namespace kiln {

void register_attention_ops(OpRegistry& r) { (void)r; }

}  // namespace kiln
