// tools/text_to_tokens.py (README: "makes a byte-level dataset") read back by trident's own
// reader: every byte of the text, including bytes >= 128 (UTF-8) and NUL, is one token of
// that value, in order; --valid-fraction puts the end of the text, cut at the next line
// start, in the validation file and the rest in the training file (docs/data-format.md);
// --decode prints the text back. The expected tokens are the text's bytes, nothing else.
// Needs /usr/bin/python3 (the script's interpreter); skips, saying so, without it.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "scratch_dir.h"
#include "trident/data.h"

namespace fs = std::filesystem;
using trident::TokenDataset;

namespace {

const char* kPython = "/usr/bin/python3";

class TextToTokensTest : public trident::testing::ScratchDirTest {
 protected:
  TextToTokensTest() : ScratchDirTest("trident_test_text_to_tokens_") {}
  void SetUp() override {
    if (::access(kPython, X_OK) != 0) GTEST_SKIP() << kPython << " not found: cannot run the tool";
    ScratchDirTest::SetUp();
  }
};

std::string tool() { return std::string(TRIDENT_SOURCE_DIR) + "/tools/text_to_tokens.py"; }

// Runs a shell command; returns its exit status and what it wrote to stdout (bytes).
int run(const std::string& command, std::string* out = nullptr) {
  FILE* p = ::popen(command.c_str(), "r");
  if (!p) return -1;
  std::string got;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) got.append(buf, n);
  const int status = ::pclose(p);
  if (out) *out = got;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Lines of ASCII and UTF-8 text, then every byte value 0..255 once (a line of its own, so the
// split can fall before or after it).
std::string sample_text() {
  std::string t;
  t += "After school the children ran down to the river.\n";
  t += "Na\xc3\xafve caf\xc3\xa9 \xe2\x80\x94 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xe2\x9c\x93\n";
  for (int b = 0; b < 256; ++b) t += char(b);
  t += "\n";
  for (int i = 0; i < 12; ++i) t += "line " + std::to_string(i) + ": the quick brown fox\n";
  t += "\xf0\x9f\x99\x82 the end, no newline";
  return t;
}

// The dataset's tokens as bytes; fails the test if a token is not a byte.
std::string tokens_as_bytes(const TokenDataset& d) {
  std::vector<int32_t> tokens(d.n_tokens());
  d.read(0, tokens.size(), tokens.data());
  std::string bytes;
  for (size_t i = 0; i < tokens.size(); ++i) {
    EXPECT_TRUE(tokens[i] >= 0 && tokens[i] < 256) << "token " << tokens[i] << " at " << i;
    bytes += char(tokens[i]);
  }
  for (size_t i = 0; i < tokens.size(); i += 37)  // token() agrees with read()
    EXPECT_EQ(d.token(i), tokens[i]) << i;
  return bytes;
}

// Header fields of docs/data-format.md, read from the file itself.
void expect_byte_level_header(const std::string& path, size_t n_tokens) {
  const std::string b = read_bytes(path);
  ASSERT_EQ(b.size(), 64 + 2 * n_tokens) << path << ": 64-byte header + 2 bytes per token";
  auto u32 = [&](size_t at) {
    uint32_t v;
    std::memcpy(&v, b.data() + at, 4);
    return v;
  };
  uint64_t n = 0;
  std::memcpy(&n, b.data() + 16, 8);
  EXPECT_EQ(b.substr(0, 8), std::string("TRIDTOK\0", 8));
  EXPECT_EQ(u32(8), 1u) << "version";
  EXPECT_EQ(u32(12), 2u) << "bytes_per_token";
  EXPECT_EQ(n, n_tokens) << "n_tokens";
  EXPECT_EQ(u32(24), 256u) << "vocab_size";
  EXPECT_EQ(u32(28), 0u) << "tokenizer (0: byte-level)";
  EXPECT_EQ(b.substr(32, 32), std::string(32, '\0')) << "reserved bytes";
}

TEST_F(TextToTokensTest, WholeTextIsItsBytes) {
  const std::string text = sample_text();
  write_bytes(file("text.txt"), text);
  ASSERT_EQ(run(std::string(kPython) + " " + tool() + " " + file("text.txt") + " " +
                file("all.bin") + " >/dev/null"),
            0);
  expect_byte_level_header(file("all.bin"), text.size());
  const auto d = TokenDataset::open(file("all.bin"), 256, "data.train");
  ASSERT_EQ(d->n_tokens(), text.size());
  EXPECT_EQ(tokens_as_bytes(*d), text);
}

TEST_F(TextToTokensTest, SplitIsTheEndCutAtTheNextLineStart) {
  const std::string text = sample_text();
  write_bytes(file("text.txt"), text);
  const double fraction = 0.25;
  ASSERT_EQ(
      run(std::string(kPython) + " " + tool() + " " + file("text.txt") + " " + file("train.bin") +
          " --valid-fraction 0.25 --valid-output " + file("valid.bin") + " >/dev/null"),
      0);
  const auto train = TokenDataset::open(file("train.bin"), 256, "data.train");
  const auto valid = TokenDataset::open(file("valid.bin"), 256, "data.valid");
  const std::string a = tokens_as_bytes(*train), b = tokens_as_bytes(*valid);
  expect_byte_level_header(file("train.bin"), a.size());
  expect_byte_level_header(file("valid.bin"), b.size());
  // Nothing lost, nothing repeated, in order.
  EXPECT_EQ(a + b, text);
  // The validation part starts at a line start: the first one at or after the last
  // `fraction` of the text (its nominal start), so no line is split between the two files.
  const size_t nominal = text.size() - size_t(std::lround(text.size() * fraction));
  const size_t expected_cut = text.find('\n', nominal) + 1;
  ASSERT_NE(expected_cut, 0u) << "the sample text has a newline after its nominal cut";
  EXPECT_EQ(a.size(), expected_cut) << "nominal cut at byte " << nominal;
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a.back(), '\n');
}

TEST_F(TextToTokensTest, DecodePrintsTheTextBack) {
  const std::string text = sample_text();
  write_bytes(file("text.txt"), text);
  ASSERT_EQ(run(std::string(kPython) + " " + tool() + " " + file("text.txt") + " " +
                file("all.bin") + " >/dev/null"),
            0);
  std::string decoded;
  ASSERT_EQ(run(std::string(kPython) + " " + tool() + " --decode " + file("all.bin"), &decoded), 0);
  EXPECT_EQ(decoded, text);
  ASSERT_EQ(run(std::string(kPython) + " " + tool() + " --decode " + file("all.bin") + " --head 60",
                &decoded),
            0);
  EXPECT_EQ(decoded, text.substr(0, 60));
}

// tools/mock_tokens.py (docs/perf.md's mock data): ids uniform over the vocabulary, in 2-byte
// tokens up to 65536 ids and 4-byte ones above, read back by trident's reader; the same seed
// gives the same file. Uniformity: 30000 draws over 300 ids expect 100 each (sd 10); a bound
// of 100 ± 50 fails a generator that skips or favours ids, and a seeded draw is reproducible.
TEST_F(TextToTokensTest, MockTokensAreUniformOverTheVocabulary) {
  const std::string mock = std::string(TRIDENT_SOURCE_DIR) + "/tools/mock_tokens.py";
  auto make = [&](const std::string& out, int vocab, int n, int seed) {
    return run(std::string(kPython) + " " + mock + " " + out + " --vocab " + std::to_string(vocab) +
               " --tokens " + std::to_string(n) + " --seed " + std::to_string(seed) +
               " >/dev/null");
  };
  ASSERT_EQ(make(file("a.bin"), 300, 30000, 1), 0);
  ASSERT_EQ(make(file("b.bin"), 300, 30000, 1), 0);
  ASSERT_EQ(make(file("c.bin"), 300, 30000, 2), 0);
  EXPECT_EQ(read_bytes(file("a.bin")), read_bytes(file("b.bin"))) << "same seed, same file";
  EXPECT_NE(read_bytes(file("a.bin")), read_bytes(file("c.bin")));
  const auto d = TokenDataset::open(file("a.bin"), 300, "data.train");
  ASSERT_EQ(d->n_tokens(), 30000u);
  std::vector<int> count(300);
  for (size_t i = 0; i < d->n_tokens(); ++i) {
    const int32_t t = d->token(i);
    ASSERT_TRUE(t >= 0 && t < 300) << "token " << t << " at " << i;
    ++count[size_t(t)];
  }
  for (int id = 0; id < 300; ++id) EXPECT_NEAR(count[size_t(id)], 100, 50) << "id " << id;
  ASSERT_EQ(make(file("wide.bin"), 70000, 1000, 1), 0);
  const auto w = TokenDataset::open(file("wide.bin"), 70000, "data.train");
  ASSERT_EQ(w->n_tokens(), 1000u);
  int32_t top = 0;
  for (size_t i = 0; i < w->n_tokens(); ++i) top = std::max(top, w->token(i));
  EXPECT_GT(top, 65535) << "4-byte tokens carry ids above 65535";
  EXPECT_LT(top, 70000);
}

}  // namespace
