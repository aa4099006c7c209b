// Op family: image. See families.def for the ops it holds.
#include "ops/op_util.h"

namespace kiln {

void register_image_ops(OpRegistry& r) { (void)r; }

}  // namespace kiln
