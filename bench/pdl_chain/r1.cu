#include "cutlass_cfg.cuh"
void add_runners_1(std::vector<Runner>& v) {
  add<Cfg<64, 16, 64, NP, ENP, 1>>(v, "np64x16", 1);
  add<Cfg<64, 32, 64, NP, ENP, 1>>(v, "np64x32", 1);
  add<Cfg<64, 64, 64, NP, ENP, 1>>(v, "np64x64", 1);
  add<Cfg<64, 128, 64, NP, ENP, 1>>(v, "np64x128", 1);
  
}
