#include "cutlass_cfg.cuh"
void add_runners_0(std::vector<Runner>& v) {
  add<Cfg<64, 16, 64, NP, ENP, 0>>(v, "np64x16", 0);
  add<Cfg<64, 32, 64, NP, ENP, 0>>(v, "np64x32", 0);
  add<Cfg<64, 64, 64, NP, ENP, 0>>(v, "np64x64", 0);
  add<Cfg<64, 128, 64, NP, ENP, 0>>(v, "np64x128", 0);
  
}
