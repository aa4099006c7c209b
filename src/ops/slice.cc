// Op family: slice. See families.def for the ops it holds.
#include "ops/op_util.h"

namespace kiln {

void register_slice_ops(OpRegistry& r) { (void)r; }

}  // namespace kiln
