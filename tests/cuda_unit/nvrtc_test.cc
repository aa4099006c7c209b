// NVRTC compilation and its disk cache (backends/cuda/nvrtc.h). These need the toolkit's libnvrtc
// but no GPU: they run on the build machine with the other unit tests.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "backends/cuda/nvrtc.h"

namespace kiln::cuda {
namespace {

namespace fs = std::filesystem;

const char* kKernel = R"(
#include <cuda_fp16.h>
extern "C" __global__ void kiln_test_axpy(const __half* x, __half* y, float a, long n) {
  long i = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __float2half(a * __half2float(x[i]) + __half2float(y[i]));
}
)";

class NvrtcCache : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kiln-nvrtc-test-" + std::to_string(getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    opt_.cache_dir = dir_.string();
    std::string why;
    ASSERT_TRUE(nvrtc_available(&why)) << why;  // the toolkit is a build requirement
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
  NvrtcOptions opt_;
};

bool is_elf(const std::string& image) { return image.size() > 4 && image.compare(0, 4, "\x7f" "ELF") == 0; }

TEST_F(NvrtcCache, CompilesOnceThenReadsTheCache) {
  auto first = compile_cached(kKernel, opt_);
  ASSERT_TRUE(first) << first.status().message();
  EXPECT_FALSE(first->from_cache);
  EXPECT_TRUE(is_elf(first->cubin));
  ASSERT_FALSE(first->cache_path.empty());
  EXPECT_TRUE(fs::exists(first->cache_path));
  EXPECT_EQ(fs::path(first->cache_path).parent_path(), dir_);

  auto second = compile_cached(kKernel, opt_);
  ASSERT_TRUE(second) << second.status().message();
  EXPECT_TRUE(second->from_cache);
  EXPECT_EQ(second->cubin, first->cubin);
  EXPECT_EQ(second->cache_path, first->cache_path);
}

TEST_F(NvrtcCache, OtherSourceOrArchitectureIsAnotherEntry) {
  auto a = compile_cached(kKernel, opt_);
  ASSERT_TRUE(a) << a.status().message();
  auto b = compile_cached(std::string(kKernel) + "\n// changed\n", opt_);
  ASSERT_TRUE(b) << b.status().message();
  EXPECT_FALSE(b->from_cache);
  EXPECT_NE(a->cache_path, b->cache_path);
  NvrtcOptions o80 = opt_;
  o80.arch = "sm_80";
  auto c = compile_cached(kKernel, o80);
  ASSERT_TRUE(c) << c.status().message();
  EXPECT_FALSE(c->from_cache);
  EXPECT_NE(c->cubin, a->cubin);
}

TEST_F(NvrtcCache, TruncatedEntryIsRecompiledAndRewritten) {
  auto first = compile_cached(kKernel, opt_);
  ASSERT_TRUE(first) << first.status().message();
  fs::resize_file(first->cache_path, fs::file_size(first->cache_path) / 2);
  auto again = compile_cached(kKernel, opt_);
  ASSERT_TRUE(again) << again.status().message();
  EXPECT_FALSE(again->from_cache);
  EXPECT_EQ(again->cubin, first->cubin);
  auto third = compile_cached(kKernel, opt_);
  ASSERT_TRUE(third) << third.status().message();
  EXPECT_TRUE(third->from_cache);
}

TEST_F(NvrtcCache, CompileErrorCarriesTheLog) {
  auto r = compile_cached("extern \"C\" __global__ void broken() { undeclared_thing = 1; }", opt_);
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("undeclared_thing"), std::string::npos) << r.status().message();
  EXPECT_TRUE(!fs::exists(dir_) || fs::is_empty(dir_));  // nothing cached
}

TEST_F(NvrtcCache, UnwritableCacheStillCompiles) {
  std::ofstream(dir_.string() + ".file") << "x";  // a file where the cache folder should be
  opt_.cache_dir = dir_.string() + ".file";
  auto r = compile_cached(kKernel, opt_);
  fs::remove(dir_.string() + ".file");
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_TRUE(is_elf(r->cubin));
  EXPECT_TRUE(r->cache_path.empty());
}

}  // namespace
}  // namespace kiln::cuda
