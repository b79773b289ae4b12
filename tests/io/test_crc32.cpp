// The checkpoint CRC (README: "every dataset has a CRC-32 checked on load") is the standard
// CRC-32 (IEEE 802.3, reflected, init and final xor 0xffffffff: zlib's and Python's
// zlib.crc32), so a checkpoint can be checked by tools outside trident. The expected values
// are published check values, not computed here. tests/cli/test_trace_and_bench.sh compares
// a real checkpoint's stored CRCs with Python's zlib.crc32 over the datasets read by h5py.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "io/checkpoint_format.h"

using trident::ckpt::crc32_of;
using trident::ckpt::hex32;

namespace {

uint32_t crc_of_text(const std::string& s) { return crc32_of(s.data(), s.size()); }

TEST(Crc32, StandardCheckValue) {
  // The catalogue "check" value of CRC-32/ISO-HDLC over the nine ASCII digits.
  EXPECT_EQ(crc_of_text("123456789"), 0xCBF43926u) << hex32(crc_of_text("123456789"));
}

TEST(Crc32, OtherPublishedValues) {
  EXPECT_EQ(crc32_of(nullptr, 0), 0u);  // nothing: init and final xor cancel
  EXPECT_EQ(crc_of_text("a"), 0xE8B7BE43u);
  EXPECT_EQ(crc_of_text("The quick brown fox jumps over the lazy dog"), 0x414FA339u);
  // 32 zero bytes and 32 0xff bytes (the iSCSI/RFC 3720 test patterns, here with CRC-32).
  const std::vector<unsigned char> zeros(32, 0x00), ones(32, 0xff);
  EXPECT_EQ(crc32_of(zeros.data(), zeros.size()), 0x190A55ADu);
  EXPECT_EQ(crc32_of(ones.data(), ones.size()), 0xFF6CAB0Bu);
}

TEST(Crc32, OfFloatBytesAsStored) {
  // A checkpoint block's CRC is over its float32 bytes as they lie in memory (little-endian on
  // every machine trident builds for): 1.0f is 00 00 80 3f.
  const float one = 1.0f;
  const unsigned char bytes[4] = {0x00, 0x00, 0x80, 0x3f};
  ASSERT_EQ(std::memcmp(&one, bytes, 4), 0) << "not a little-endian IEEE float machine";
  EXPECT_EQ(crc32_of(&one, sizeof one), crc32_of(bytes, 4));
}

// The definition, one bit at a time (reflected polynomial 0xEDB88320, init and final xor
// 0xffffffff), against Note [Checkpoint CRC]'s fast one over lengths and alignments that reach
// every path of a folding implementation (under 16 bytes, a 64-byte block, odd tails).
uint32_t bitwise_crc(uint32_t crc, const unsigned char* p, size_t n) {
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int b = 0; b < 8; ++b) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

TEST(Crc32, EqualsTheBitwiseDefinition) {
  std::vector<unsigned char> data(70000);
  uint32_t state = 12345;
  for (auto& c : data) c = static_cast<unsigned char>((state = state * 1103515245u + 12345u) >> 24);
  for (size_t offset : {0, 1, 3, 8, 15})
    for (size_t n : {1, 2, 7, 15, 16, 17, 31, 63, 64, 65, 127, 128, 129, 255, 1000, 4097, 65536}) {
      const unsigned char* p = data.data() + offset;
      ASSERT_EQ(crc32_of(p, n), bitwise_crc(0, p, n)) << "offset " << offset << " length " << n;
    }
}

TEST(Crc32, ExtendsInPieces) {
  // crc32_extend(crc32_of(a), b) == crc32_of(a + b): the writer's paced CRC in pieces.
  std::vector<unsigned char> data(10000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 7 + 3);
  for (size_t cut : {0, 1, 16, 17, 5000, 9999, 10000})
    EXPECT_EQ(trident::ckpt::crc32_extend(crc32_of(data.data(), cut), data.data() + cut,
                                          data.size() - cut),
              crc32_of(data.data(), data.size()))
        << "cut at " << cut;
}

TEST(Crc32, HexFormat) {
  EXPECT_EQ(hex32(0xCBF43926u), "0xcbf43926");
  EXPECT_EQ(hex32(0x1u), "0x00000001");
}

}  // namespace
