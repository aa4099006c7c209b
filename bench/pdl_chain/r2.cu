#include "cutlass_cfg.cuh"
void add_runners_2(std::vector<Runner>& v) {
  add<Cfg<64, 16, 64, NP, ENP, 2>>(v, "np64x16", 2);
  add<Cfg<64, 32, 64, NP, ENP, 2>>(v, "np64x32", 2);
  add<Cfg<64, 64, 64, NP, ENP, 2>>(v, "np64x64", 2);
  add<Cfg<64, 128, 64, NP, ENP, 2>>(v, "np64x128", 2);
}
