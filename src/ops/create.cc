// Op family: create. See families.def for the ops it holds.
#include "ops/op_util.h"

namespace kiln {

void register_create_ops(OpRegistry& r) { (void)r; }

}  // namespace kiln
