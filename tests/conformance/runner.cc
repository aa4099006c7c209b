#include "ops/op_registry.h"
int main(){ return kiln::op_registry().get(kiln::OpKind::kAbs).cpu ? 0 : 1; }
