// SHA-256 (src/support/sha256.h) against FIPS 180-4's examples and a file hashed in pieces.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "support/sha256.h"

namespace kiln {
namespace {

TEST(Sha256, KnownDigests) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, FilesAreHashedWholeAndMissingOnesNamed) {
  const std::string path = ::testing::TempDir() + "/kiln_sha256_test.bin";
  std::string data;
  for (int i = 0; i < 200000; ++i) data += char(i * 31 + 7);  // spans several 64 KiB reads
  std::ofstream(path, std::ios::binary) << data;
  auto h = sha256_file(path);
  ASSERT_TRUE(h) << h.status().message();
  EXPECT_EQ(*h, sha256_hex(data));
  std::remove(path.c_str());
  auto missing = sha256_file(path);
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.status().message().find("kiln_sha256_test.bin"), std::string::npos);
}

}  // namespace
}  // namespace kiln
