#include "runtime/device_peaks.h"

#include <gtest/gtest.h>

namespace kiln {
namespace {

// The names CUDA reports (cudaDeviceProp::name) for each part, and the datasheet each must find.
TEST(DevicePeaks, NamesFindTheirOwnDatasheet) {
  struct Want {
    const char* cuda_name;
    const char* model;
    double f16, gbs;
  };
  for (const Want& w : {Want{"NVIDIA H100 80GB HBM3", "H100 SXM", 989.4, 3350}, Want{"NVIDIA H100 PCIe", "H100 PCIe", 756.5, 2000},
                        Want{"NVIDIA H100 NVL", "H100 NVL", 835.5, 3900}, Want{"NVIDIA H200", "H200 SXM", 989.4, 4800},
                        Want{"NVIDIA H200 NVL", "H200 NVL", 835.5, 4800},
                        Want{"NVIDIA A100-SXM4-80GB", "A100 SXM 80GB", 312, 2039},
                        Want{"NVIDIA A100-SXM4-40GB", "A100 40GB", 312, 1555},
                        Want{"NVIDIA A100 80GB PCIe", "A100 PCIe 80GB", 312, 1935}, Want{"NVIDIA L40S", "L40S", 362, 864},
                        Want{"NVIDIA L4", "L4", 121, 300}}) {
    auto p = datasheet_peaks(w.cuda_name);
    ASSERT_TRUE(p.has_value()) << w.cuda_name;
    EXPECT_EQ(p->model, w.model) << w.cuda_name;
    EXPECT_DOUBLE_EQ(p->f16_tflops, w.f16) << w.cuda_name;
    EXPECT_DOUBLE_EQ(p->gbs, w.gbs) << w.cuda_name;
    EXPECT_GT(p->f16_tflops, p->tf32_tflops) << w.cuda_name;
  }
}

TEST(DevicePeaks, UnknownGpuHasNone) {
  EXPECT_FALSE(datasheet_peaks("NVIDIA GeForce RTX 4090").has_value());
  EXPECT_FALSE(datasheet_peaks("").has_value());
}

}  // namespace
}  // namespace kiln
