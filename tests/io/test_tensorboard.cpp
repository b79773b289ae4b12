// TensorBoard event files (src/io/tensorboard.h): the CRC against published CRC-32C check
// values, the TFRecord framing and the Event bytes against the format's description (expected
// bytes written out by hand here), and log.tensorboard's resolution in the deck.
// tests/cli/test_tensorboard.sh reads real runs' files with TensorBoard's own reader.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "io/tensorboard.h"
#include "trident/deck.h"

namespace fs = std::filesystem;
using trident::crc32c;
using trident::masked_crc32c;

namespace {

uint32_t crc_of(const std::string& s) { return crc32c(s.data(), s.size()); }

TEST(Crc32c, PublishedCheckValues) {
  // The catalogue check value of CRC-32C (iSCSI) over the nine ASCII digits.
  EXPECT_EQ(crc_of("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
  // RFC 3720 (iSCSI), appendix B.4: 32 bytes of zeros, of 0xff, ascending and descending.
  EXPECT_EQ(crc_of(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc_of(std::string(32, '\xff')), 0x62A8AB43u);
  std::string up(32, 0), down(32, 0);
  for (int i = 0; i < 32; ++i) {
    up[i] = char(i);
    down[i] = char(31 - i);
  }
  EXPECT_EQ(crc_of(up), 0x46DD794Eu);
  EXPECT_EQ(crc_of(down), 0x113FDB5Cu);
}

TEST(Crc32c, MaskedAsTfRecordMasksIt) {
  // The format's rule: rotate right by 15 bits, add 0xa282ead8 (mod 2^32), applied here to the
  // published check value, not to the code's own CRC.
  const uint32_t c = 0xE3069283u;
  const uint32_t rotated = (c >> 15) | (c << 17);
  EXPECT_EQ(masked_crc32c("123456789", 9), uint32_t(rotated + 0xA282EAD8u));
  EXPECT_NE(masked_crc32c("123456789", 9), c);
}

// The records of an event file, each checked for its framing: u64 length, masked CRC of the
// length's 8 bytes, the data, masked CRC of the data.
std::vector<std::string> read_records(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> records;
  size_t at = 0;
  while (at < bytes.size()) {
    uint64_t n = 0;
    uint32_t len_crc = 0, data_crc = 0;
    EXPECT_LE(at + 12, bytes.size());
    std::memcpy(&n, bytes.data() + at, 8);
    std::memcpy(&len_crc, bytes.data() + at + 8, 4);
    EXPECT_EQ(len_crc, masked_crc32c(bytes.data() + at, 8));
    EXPECT_LE(at + 16 + n, bytes.size());
    if (at + 16 + n > bytes.size()) break;
    records.push_back(bytes.substr(at + 12, n));
    std::memcpy(&data_crc, bytes.data() + at + 12 + n, 4);
    EXPECT_EQ(data_crc, masked_crc32c(records.back().data(), n));
    at += 16 + n;
  }
  return records;
}

std::string only_file(const fs::path& dir) {
  std::vector<fs::path> files{fs::directory_iterator(dir), fs::directory_iterator()};
  EXPECT_EQ(files.size(), 1u);
  EXPECT_TRUE(files[0].filename().string().starts_with("events.out.tfevents."));
  return files[0].string();
}

// Event: wall_time is field 1 (key 0x09, 8 bytes), step field 2 (key 0x10, varint).
void expect_step(const std::string& event, unsigned char step) {
  ASSERT_GE(event.size(), 11u);
  EXPECT_EQ(event[0], '\x09');
  EXPECT_EQ(event[9], '\x10');
  EXPECT_EQ((unsigned char)event[10], step);
}

class TensorBoardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("trident_tb_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(TensorBoardTest, FreshFileStartsWithItsVersion) {
  { trident::TensorBoardWriter w(dir_.string(), 0); }
  const std::vector<std::string> r = read_records(only_file(dir_));
  ASSERT_EQ(r.size(), 1u);
  expect_step(r[0], 0);
  // file_version: field 3, length-delimited (0x1a), 13 bytes.
  EXPECT_EQ(r[0].substr(11), std::string("\x1a\x0d") + "brain.Event:2");
}

TEST_F(TensorBoardTest, ResumedFileStartsASessionAfterTheCheckpoint) {
  { trident::TensorBoardWriter w(dir_.string(), 40); }
  const std::vector<std::string> r = read_records(only_file(dir_));
  ASSERT_EQ(r.size(), 2u);
  expect_step(r[1], 41);  // the first step the resumed run writes
  // session_log: field 7 (0x3a), 2 bytes: status (field 1, varint) = START (1).
  EXPECT_EQ(r[1].substr(11), std::string("\x3a\x02\x08\x01", 4));
}

TEST_F(TensorBoardTest, StepScalarsAreSimpleValues) {
  {
    trident::TensorBoardWriter w(dir_.string(), 0);
    w.write_step({{"step", 3}, {"loss", 2.5}, {"mfu", NAN}, {"timed", true}});
  }
  const std::vector<std::string> r = read_records(only_file(dir_));
  ASSERT_EQ(r.size(), 2u);
  expect_step(r[1], 3);
  // summary (field 5, 0x2a) of two Values (Summary.value: field 1, 0x0a): tag (0x0a, length)
  // and simple_value (field 2, fixed32: 0x15, 2.5f = 0x40200000 little-endian). The NaN MFU,
  // the absent val_loss and the unknown "timed" write nothing; an absent "skipped" is 0.
  const std::string loss = std::string("\x0a\x11\x0a\x0atrain/loss\x15\x00\x00\x20\x40", 19);
  const std::string skipped = std::string("\x0a\x14\x0a\x0dtrain/skipped\x15\x00\x00\x00\x00", 22);
  EXPECT_EQ(r[1].substr(11), std::string("\x2a\x29", 2) + loss + skipped);
}

TEST_F(TensorBoardTest, TextIsAStringTensorForTheTextPlugin) {
  {
    trident::TensorBoardWriter w(dir_.string(), 0);
    w.write_code_text(0, "run/deck", "a: 1");
  }
  const std::vector<std::string> r = read_records(only_file(dir_));
  ASSERT_EQ(r.size(), 2u);
  // Value{tag "run/deck", metadata (field 9, 0x4a){plugin_data{plugin_name "text"}},
  //       tensor (field 8, 0x42){dtype DT_STRING (7), string_val (field 8) "```\na: 1\n```"}}
  const std::string text = "```\na: 1\n```";
  const std::string value = std::string("\x0a\x08run/deck") + "\x4a\x08\x0a\x06\x0a\x04text" +
                            "\x42\x10\x08\x07\x42\x0c" + text;
  EXPECT_EQ(r[1].substr(11), std::string("\x2a\x28\x0a\x26", 4) + value);
}

TEST_F(TensorBoardTest, TwoWritersInOneSecondGetTwoFiles) {
  trident::TensorBoardWriter a(dir_.string(), 0), b(dir_.string(), 0);
  EXPECT_NE(a.path(), b.path());
}

TEST(TensorBoardDeck, OffByDefaultOnUnderTheOutputDirectory) {
  const std::string base = "data: {train: t.bin}\nrun: {out_dir: /o}\n";
  EXPECT_EQ(trident::parse_deck(base, "/d").log.tensorboard, "");
  EXPECT_EQ(trident::parse_deck(base, "/d", {"log.tensorboard=true"}).log.tensorboard,
            "/o/tensorboard");
  EXPECT_EQ(trident::parse_deck(base, "/d", {"log.tensorboard=On"}).log.tensorboard,
            "/o/tensorboard");
  EXPECT_EQ(trident::parse_deck(base, "/d", {"log.tensorboard=off"}).log.tensorboard, "");
  EXPECT_EQ(trident::parse_deck(base + "log: {tensorboard: tb/a}\n", "/d").log.tensorboard,
            "/o/tb/a");
  EXPECT_EQ(trident::parse_deck(base, "/d", {"log.tensorboard=/abs/tb"}).log.tensorboard,
            "/abs/tb");
}

}  // namespace
