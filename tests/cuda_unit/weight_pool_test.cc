// The weight pool of dynamic engines (src/backends/cuda/weight_pool.h), without a GPU: interning
// (what is found again, and how) needs none; only device() uploads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "backends/cuda/weight_pool.h"

namespace kiln::cuda {
namespace {

Tensor filled(float v, int64_t n) {
  Tensor t = *Tensor::create(DType::kFloat32, {n});
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = v + float(i);
  return t;
}

std::string bytes_of(const Tensor& t) { return std::string(static_cast<const char*>(t.raw()), t.nbytes()); }

TEST(WeightPool, FindsATensorByIdentityAndEqualBytesByContent) {
  WeightPool pool;
  int made = 0;
  Tensor a = filled(1, 64);
  auto make_a = [&]() -> Expected<std::string> { ++made; return bytes_of(a); };
  auto id1 = pool.intern_tensor(a, 1, "", make_a);
  ASSERT_TRUE(id1);
  Tensor a_copy = a;  // the same storage: found without converting again
  auto id2 = pool.intern_tensor(a_copy, 1, "", make_a);
  ASSERT_TRUE(id2);
  EXPECT_EQ(*id1, *id2);
  EXPECT_EQ(made, 1);
  auto other_dt = pool.intern_tensor(a, 2, "", make_a);  // another device dtype is another weight key
  ASSERT_TRUE(other_dt);
  EXPECT_EQ(made, 2);

  // The same tensor rearranged by a lowering (a filter transposed) is another weight, made once.
  int made_t = 0;
  auto make_t = [&]() -> Expected<std::string> { ++made_t; std::string r = bytes_of(a); std::reverse(r.begin(), r.end()); return r; };
  auto t1 = pool.intern_tensor(a, 1, "reversed", make_t);
  auto t2 = pool.intern_tensor(a_copy, 1, "reversed", make_t);
  ASSERT_TRUE(t1 && t2);
  EXPECT_EQ(*t1, *t2);
  EXPECT_NE(*t1, *id1);
  EXPECT_EQ(made_t, 1);
  EXPECT_EQ(made, 2);
  auto t3 = pool.intern_tensor(a, 1, "reversed twice", [&]() -> Expected<std::string> { return bytes_of(a); });
  ASSERT_TRUE(t3);
  EXPECT_EQ(*t3, *id1);  // another form whose bytes are those of an earlier weight: found by them

  Tensor again = filled(1, 64);  // made again by a pass for another plan: equal bytes, new storage
  auto id3 = pool.intern_tensor(again, 1, "", [&]() -> Expected<std::string> { return bytes_of(again); });
  ASSERT_TRUE(id3);
  EXPECT_EQ(*id3, *id1);
  EXPECT_EQ(pool.intern_bytes(bytes_of(a)), *id1);

  Tensor b = filled(2, 64);
  const int idb = pool.intern_bytes(bytes_of(b));
  EXPECT_NE(idb, *id1);
  EXPECT_EQ(pool.size(idb), size_t(64 * 4));
  EXPECT_EQ(pool.host(idb), bytes_of(b));
  EXPECT_EQ(pool.device_bytes(), 0u);  // nothing uploaded until a plan asks
}

}  // namespace
}  // namespace kiln::cuda
