// The timing cache (src/backends/cuda/timing_cache.h) needs no GPU: entries are text keyed by target.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "backends/cuda/timing_cache.h"

namespace kiln::cuda {
namespace {

TEST(TimingCache, StoresPerTargetAndRoundTripsThroughAFile) {
  TimingCache h100("H100 sm_90"), other("A100 sm_80");
  EXPECT_FALSE(h100.get("lt", "128 768 768"));
  h100.put("lt", "128 768 768", "00ff 0.0042");
  h100.put("conv", "x[1,3,224,224]", "1 0.01 0.02 1,0");
  other.put("lt", "128 768 768", "abcd 0.009");
  EXPECT_EQ(h100.get("lt", "128 768 768").value_or(""), "00ff 0.0042");
  EXPECT_EQ(h100.hits(), 1);
  EXPECT_EQ(h100.misses(), 1);

  auto dir = std::filesystem::temp_directory_path() / ("kiln-tc-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "sub" / "timing.cache").string();  // the folder is created
  ASSERT_TRUE(other.save_file(path));
  {
    TimingCache merged("H100 sm_90");
    ASSERT_TRUE(merged.merge_file(path));
    ASSERT_TRUE(merged.merge_text(h100.to_text(), "h100"));
    ASSERT_TRUE(merged.save_file(path));  // both targets' entries kept
  }
  TimingCache back("H100 sm_90");
  ASSERT_TRUE(back.merge_file(path));
  EXPECT_EQ(back.size(), 3u);
  EXPECT_EQ(back.get("conv", "x[1,3,224,224]").value_or(""), "1 0.01 0.02 1,0");
  // Only what was looked up or added since construction travels with an engine.
  EXPECT_EQ(back.to_text(true), "H100 sm_90|conv|x[1,3,224,224]\t1 0.01 0.02 1,0\n");
  // A target's own entries never answer for another target.
  TimingCache a100("A100 sm_80");
  ASSERT_TRUE(a100.merge_file(path));
  EXPECT_EQ(a100.get("lt", "128 768 768").value_or(""), "abcd 0.009");
  EXPECT_FALSE(a100.get("conv", "x[1,3,224,224]"));

  // Missing file: empty. Malformed line: an error naming the line.
  TimingCache fresh("H100 sm_90");
  EXPECT_TRUE(fresh.merge_file((dir / "absent.cache").string()));
  EXPECT_EQ(fresh.size(), 0u);
  Status bad = fresh.merge_text("H100 sm_90|lt|a\t1 2\nno tab here\n", "t.cache");
  EXPECT_NE(bad.message().find("t.cache:2"), std::string::npos) << bad.message();
  std::filesystem::remove_all(dir);
}

TEST(TimingCache, TargetIdNamesEveryVersion) {
  TargetInfo t{"NVIDIA H100 80GB HBM3", 9, 0, 13000, 130100, 91300};
  std::string id = target_id(t);
  for (const char* part : {"H100", "sm_90", "13000", "130100", "91300"}) EXPECT_NE(id.find(part), std::string::npos) << id;
  TargetInfo u = t;
  u.cudnn = 91400;
  EXPECT_NE(target_id(u), id);
}

// A dynamic engine's shape plans take a choice the build timed at the nearest shape of the same form.
TEST(TimingCache, NearestTakesTheClosestShapeOfTheSameForm) {
  TimingCache c("H100 sm_90");
  c.put("lt", "dt1 t00 e0 c0 0 @ 256 768 768 b1 0 0 0", "algo256");
  c.put("lt", "dt1 t00 e0 c0 0 @ 1024 768 768 b1 0 0 0", "algo1024");
  c.put("lt", "dt1 t01 e0 c0 0 @ 300 768 768 b1 0 0 0", "other-form");
  c.put("conv", "w[64,3,7,7] @ x[1,3,224,224]", "conv");
  EXPECT_EQ(c.nearest("lt", "dt1 t00 e0 c0 0 @ 300 768 768 b1 0 0 0").value_or(""), "algo256");
  EXPECT_EQ(c.nearest("lt", "dt1 t00 e0 c0 0 @ 800 768 768 b1 0 0 0").value_or(""), "algo1024");
  EXPECT_FALSE(c.nearest("lt", "dt2 t00 e0 c0 0 @ 300 768 768 b1 0 0 0"));  // another dtype: nothing
  EXPECT_FALSE(c.nearest("lt", "no form separator"));
  EXPECT_FALSE(c.nearest("conv", "w[64,3,7,7] @ x[1,3,224]"));  // another rank
  EXPECT_EQ(c.nearest("conv", "w[64,3,7,7] @ x[9,3,224,224]").value_or(""), "conv");
}

}  // namespace
}  // namespace kiln::cuda
