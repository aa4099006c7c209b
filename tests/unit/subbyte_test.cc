// Sub-byte element types (int4, uint4, int2, uint2, float4 e2m1): value conversion, and the packed
// layout ONNX files use (two 4-bit / four 2-bit elements per byte, low bits first).
#include <gtest/gtest.h>

#include <cmath>

#include "frontend/onnx/onnx_tensor.h"
#include "ops/create_cast.h"

namespace kiln {
namespace {

TEST(SubByte, SmallIntsWrapLikeNarrowingCasts) {
  EXPECT_EQ(int(int4(7)), 7);
  EXPECT_EQ(int(int4(8)), -8);
  EXPECT_EQ(int(int4(-9)), 7);
  EXPECT_EQ(int(uint4(16)), 0);
  EXPECT_EQ(int(uint4(-1)), 15);
  EXPECT_EQ(int(int2(2)), -2);
  EXPECT_EQ(int(uint2(5)), 1);
  EXPECT_EQ(int4(-3).bits(), 0xD);
  EXPECT_EQ(int(int4::from_bits(0xD)), -3);
}

TEST(SubByte, Float4RoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(float(float4e2m1(0.25f)), 0.0f);   // tie between 0 and 0.5: even mantissa wins
  EXPECT_EQ(float(float4e2m1(0.26f)), 0.5f);
  EXPECT_EQ(float(float4e2m1(1.25f)), 1.0f);   // tie between 1 and 1.5
  EXPECT_EQ(float(float4e2m1(2.5f)), 2.0f);    // tie between 2 and 3
  EXPECT_EQ(float(float4e2m1(5.0f)), 4.0f);    // tie between 4 and 6
  EXPECT_EQ(float(float4e2m1(-3.5f)), -4.0f);  // tie between 3 and 4
  EXPECT_EQ(float(float4e2m1(1e9f)), 6.0f);
  EXPECT_EQ(float(float4e2m1(-INFINITY)), -6.0f);
  EXPECT_EQ(float4e2m1(NAN).bits, 0x8);
}

TEST(SubByte, CastFromFloatTruncatesThenWraps) {
  EXPECT_EQ(int(cast_value<int4>(7.9)), 7);
  EXPECT_EQ(int(cast_value<int4>(-9.0)), 7);
  EXPECT_EQ(int(cast_value<uint2>(6.0)), 2);
  EXPECT_EQ(cast_value<std::string>(int4(-5)), "-5");
  EXPECT_EQ(cast_value<float>(int4(-5)), -5.0f);
}

TEST(SubByte, PackedOnnxTensorsRoundTrip) {
  for (DType dt : {DType::kInt4, DType::kUInt4, DType::kInt2, DType::kUInt2, DType::kFloat4E2M1}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    Tensor t = Tensor::create(dt, {5}).value();  // odd count: the last byte is half (or 3/4) empty
    for (int64_t i = 0; i < 5; ++i) set_element(t, i, double(i % 3) - 1.0);
    onnx::TensorProto p;
    onnx_io::tensor_to_proto(t, "t", &p);
    EXPECT_EQ(p.raw_data().size(), size_t(dtype_bits(dt) == 4 ? 3 : 2));
    auto back = onnx_io::tensor_from_proto(p, {}, "t");
    ASSERT_TRUE(back) << back.status().message();
    ASSERT_EQ(back->dtype(), dt);
    for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(back->as_double(i), t.as_double(i)) << i;
  }
}

TEST(SubByte, Int32DataHoldsOnePackedBytePerEntry) {
  onnx::TensorProto p;  // what onnx.helper.make_tensor("t", INT4, [3], [1, -2, 3]) writes
  p.set_data_type(22);
  p.add_dims(3);
  p.add_int32_data(0xE1);
  p.add_int32_data(0x03);
  auto t = onnx_io::tensor_from_proto(p, {}, "t");
  ASSERT_TRUE(t) << t.status().message();
  EXPECT_EQ(t->as_int(0), 1);
  EXPECT_EQ(t->as_int(1), -2);
  EXPECT_EQ(t->as_int(2), 3);
}

TEST(SubByte, ShortPackedDataIsAnErrorNamingTheTensor) {
  onnx::TensorProto p;
  p.set_data_type(21);  // UINT4
  p.add_dims(5);
  p.set_raw_data(std::string(2, '\0'));  // 5 nibbles need 3 bytes
  auto t = onnx_io::tensor_from_proto(p, {}, "initializer 'w'");
  ASSERT_FALSE(t);
  EXPECT_NE(t.status().message().find("initializer 'w'"), std::string::npos) << t.status().message();
  EXPECT_NE(t.status().message().find("need 3"), std::string::npos) << t.status().message();
}

}  // namespace
}  // namespace kiln
