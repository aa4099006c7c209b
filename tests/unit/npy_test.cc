// .npy reading and writing: round trips for every dtype `kiln run` writes, bytes numpy itself
// writes, and corrupt headers that must fail with a message instead of crashing or allocating.
#include <gtest/gtest.h>

#include <cstring>

#include "support/npy.h"

namespace kiln {
namespace {

// np.save of np.arange(6, dtype=np.float32).reshape(2, 3), header as numpy 1.x/2.x writes it.
std::string numpy_bytes(const std::string& descr, const std::string& shape, const std::string& data) {
  std::string h = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  h.append(size_t((64 - (10 + h.size() + 1) % 64) % 64), ' ');
  h += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += char(h.size() & 0xFF);
  out += char(h.size() >> 8);
  return out + h + data;
}

TEST(Npy, ReadsNumpyFloat32) {
  std::string data(24, '\0');
  float v[6] = {0, 1, 2, 3, 4, 5};
  std::memcpy(data.data(), v, 24);
  auto t = parse_npy(numpy_bytes("<f4", "(2, 3)", data), "x.npy");
  ASSERT_TRUE(t) << t.status().message();
  EXPECT_EQ(t->dtype(), DType::kFloat32);
  EXPECT_EQ(t->dims(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t->data<float>()[5], 5.0f);
}

TEST(Npy, ScalarAnd1D) {
  auto s = parse_npy(numpy_bytes("<i8", "()", std::string("\x07\0\0\0\0\0\0\0", 8)), "s.npy");
  ASSERT_TRUE(s) << s.status().message();
  EXPECT_EQ(s->rank(), 0u);
  EXPECT_EQ(s->data<int64_t>()[0], 7);
  auto v = parse_npy(numpy_bytes("|u1", "(3,)", "abc"), "v.npy");
  ASSERT_TRUE(v) << v.status().message();
  EXPECT_EQ(v->dims(), (std::vector<int64_t>{3}));
  EXPECT_EQ(v->data<uint8_t>()[2], 'c');
}

TEST(Npy, RoundTripsEveryNumpyDtype) {
  for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kInt8, DType::kInt16, DType::kInt32,
                   DType::kInt64, DType::kUInt8, DType::kUInt16, DType::kUInt32, DType::kUInt64, DType::kBool}) {
    Tensor t = Tensor::create(dt, {2, 0 + 3}).value();
    for (int64_t i = 0; i < t.numel(); ++i) {
      visit_dtype(dt, [&]<typename T>() {
        if constexpr (std::is_same_v<T, bool>) t.data<T>()[i] = i % 2;
        else if constexpr (is_numeric_v<T>) t.data<T>()[i] = T(compute_t<T>(i + 1));
      });
    }
    auto back = parse_npy(serialize_npy(t), "rt.npy");
    ASSERT_TRUE(back) << dtype_name(dt) << ": " << back.status().message();
    EXPECT_EQ(back->dtype(), dt);
    EXPECT_EQ(back->dims(), t.dims());
    EXPECT_EQ(std::memcmp(back->raw(), t.raw(), t.nbytes()), 0) << dtype_name(dt);
  }
}

TEST(Npy, StringsRoundTripAsUnicode) {
  Tensor t = Tensor::create(DType::kString, {2}).value();
  t.data<std::string>()[0] = "héllo";
  t.data<std::string>()[1] = "";
  std::string bytes = serialize_npy(t);
  EXPECT_NE(bytes.find("'<U5'"), std::string::npos);
  auto back = parse_npy(bytes, "s.npy");
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ(back->data<std::string>()[0], "héllo");
  EXPECT_EQ(back->data<std::string>()[1], "");
}

TEST(Npy, Bfloat16IsWidenedToFloat32) {
  Tensor t = Tensor::create(DType::kBFloat16, {2}).value();
  t.data<bfloat16>()[0] = bfloat16(1.5f);
  t.data<bfloat16>()[1] = bfloat16(-2.0f);
  auto back = parse_npy(serialize_npy(t), "b.npy");
  ASSERT_TRUE(back);
  EXPECT_EQ(back->dtype(), DType::kFloat32);
  EXPECT_EQ(back->data<float>()[0], 1.5f);
  EXPECT_EQ(back->data<float>()[1], -2.0f);
}

TEST(Npy, DataStartsOn64ByteBoundary) {
  Tensor t = Tensor::create(DType::kFloat32, {5, 7}).value();
  std::string b = serialize_npy(t);
  size_t header_len = uint8_t(b[8]) | (size_t(uint8_t(b[9])) << 8);
  EXPECT_EQ((10 + header_len) % 64, 0u);
  EXPECT_EQ(b[10 + header_len - 1], '\n');
}

void expect_error(const std::string& bytes, const std::string& needle) {
  auto t = parse_npy(bytes, "bad.npy");
  ASSERT_FALSE(t) << "expected an error containing '" << needle << "'";
  EXPECT_NE(t.status().message().find("bad.npy"), std::string::npos) << t.status().message();
  EXPECT_NE(t.status().message().find(needle), std::string::npos) << t.status().message();
}

TEST(Npy, CorruptFilesAreErrors) {
  expect_error("", "magic");
  expect_error("PK\x03\x04 not numpy at all", "magic");
  expect_error(numpy_bytes("<f4", "(2, 3)", std::string(20, '\0')), "needs 24");
  expect_error(numpy_bytes(">f4", "(1,)", std::string(4, '\0')), "unsupported dtype");
  expect_error(numpy_bytes("<c8", "(1,)", std::string(8, '\0')), "unsupported dtype");
  expect_error(numpy_bytes("<f4", "(-1, 3)", ""), "bad dimension");
  expect_error(numpy_bytes("<f4", "(100000000000, 100000000000, 100000000000)", ""), "");
  expect_error(numpy_bytes("|b1", "(1,)", "\x05"), "bool");
  std::string fortran = numpy_bytes("<f4", "(1,)", std::string(4, '\0'));
  fortran.replace(fortran.find("False"), 5, "True ");
  expect_error(fortran, "Fortran");
  std::string longer = numpy_bytes("<f4", "(1,)", std::string(4, '\0'));
  longer[8] = '\xff';
  longer[9] = '\x7f';
  expect_error(longer, "header longer than the file");
  // UTF-32 elements past U+10FFFF or in the surrogate range are not text (found by kiln_fuzz_npy:
  // they used to decode to bytes that wrote back as other characters).
  expect_error(numpy_bytes("<U1", "()", std::string("\x59\x01\x00\x76", 4)), "string element 0 holds 0x76000159");
  expect_error(numpy_bytes("<U2", "(1,)", std::string("a\0\0\0\x00\xD8\0\0", 8)), "0xD800");
}

}  // namespace
}  // namespace kiln
