// Op family: shape. See families.def for the ops it holds.
#include "ops/op_util.h"

namespace kiln {

void register_shape_ops(OpRegistry& r) { (void)r; }

}  // namespace kiln
