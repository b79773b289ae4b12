// Token files (both formats, every rejected input) and the sample order.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "scratch_dir.h"
#include "trident/check.h"
#include "trident/data.h"

namespace fs = std::filesystem;
using trident::ExitCode;
using trident::SampleOrder;
using trident::TokenDataset;

namespace {

// A fresh directory per test, removed afterwards.
class DatasetTest : public trident::testing::ScratchDirTest {
 protected:
  DatasetTest() : ScratchDirTest("trident_test_dataset_") {}
};

std::vector<unsigned char> slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void spit(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

template <typename T>
void put(std::vector<unsigned char>& bytes, size_t offset, T v) {
  std::memcpy(bytes.data() + offset, &v, sizeof(T));
}

// An llm.c shard: int32[256] header, then uint16 tokens.
std::vector<unsigned char> llmc_shard(const std::vector<uint16_t>& tokens, int32_t magic = 20240520,
                                      int32_t version = 1) {
  std::vector<unsigned char> bytes(1024 + 2 * tokens.size(), 0);
  put<int32_t>(bytes, 0, magic);
  put<int32_t>(bytes, 4, version);
  put<int32_t>(bytes, 8, static_cast<int32_t>(tokens.size()));
  for (size_t i = 0; i < tokens.size(); ++i) put<uint16_t>(bytes, 1024 + 2 * i, tokens[i]);
  return bytes;
}

// Runs f, expects a kBadInput trident::Error whose message contains every one of `parts`.
void expect_bad_input(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error thrown; expected one mentioning " << parts.front();
  } catch (const trident::Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput) << e.what();
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message: " << e.what() << "\nmissing: " << p;
  }
}

std::vector<int32_t> iota_tokens(size_t n, int modulo) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>(i % modulo);
  return t;
}

std::vector<int32_t> read_all(const TokenDataset& d) {
  std::vector<int32_t> out(d.n_tokens());
  d.read(0, d.n_tokens(), out.data());
  return out;
}

// ---- round trips and formats ---------------------------------------------------------------

TEST_F(DatasetTest, RoundTripTwoByteTokens) {
  auto tokens = iota_tokens(1000, 256);
  tokens[7] = 255;
  trident::write_token_file(file("a.bin"), tokens, 256, 0);
  auto bytes = slurp(file("a.bin"));
  ASSERT_EQ(bytes.size(), 64u + 2 * 1000);
  EXPECT_EQ(std::memcmp(bytes.data(), "TRIDTOK\0", 8), 0);
  EXPECT_EQ(bytes[12], 2);  // bytes_per_token
  auto d = TokenDataset::open(file("a.bin"), 256, "data.train");
  EXPECT_EQ(d->n_tokens(), 1000u);
  EXPECT_EQ(d->path(), file("a.bin"));
  EXPECT_EQ(read_all(*d), tokens);
  EXPECT_EQ(d->token(7), 255);
  EXPECT_NE(d->describe().find("1000 tokens"), std::string::npos) << d->describe();
}

TEST_F(DatasetTest, RoundTripFourByteTokens) {
  const int vocab = 100000;  // > 65536 forces 4-byte tokens
  std::vector<int32_t> tokens = {0, 1, 65535, 65536, 99999, 70000, 3};
  trident::write_token_file(file("b.bin"), tokens, vocab, 2);
  auto bytes = slurp(file("b.bin"));
  ASSERT_EQ(bytes.size(), 64u + 4 * tokens.size());
  EXPECT_EQ(bytes[12], 4);
  auto d = TokenDataset::open(file("b.bin"), vocab, "data.train");
  EXPECT_EQ(read_all(*d), tokens);
  EXPECT_EQ(d->token(4), 99999);
}

TEST_F(DatasetTest, ReadsLlmcShard) {
  std::vector<uint16_t> raw = {50256, 15496, 11, 995, 0, 50256, 40};
  spit(file("shard.bin"), llmc_shard(raw));
  auto d = TokenDataset::open(file("shard.bin"), 50257, "data.train");
  ASSERT_EQ(d->n_tokens(), raw.size());
  for (size_t i = 0; i < raw.size(); ++i) EXPECT_EQ(d->token(i), raw[i]) << i;
  EXPECT_NE(d->describe().find("llm.c"), std::string::npos) << d->describe();
}

// ---- rejected inputs -----------------------------------------------------------------------

TEST_F(DatasetTest, MissingFile) {
  std::string p = file("nope.bin");
  expect_bad_input([&] { TokenDataset::open(p, 256, "data.train"); },
                   {"data.train", p, "cannot open", "No such file"});
}

TEST_F(DatasetTest, TruncatedFile) {
  trident::write_token_file(file("t.bin"), iota_tokens(100, 256), 256, 0);
  auto bytes = slurp(file("t.bin"));
  bytes.resize(bytes.size() - 3);
  spit(file("t.bin"), bytes);
  expect_bad_input([&] { TokenDataset::open(file("t.bin"), 256, "data.valid"); },
                   {"data.valid", file("t.bin"), "file is 261 bytes, expected 264", "truncated"});

  bytes.resize(40);  // not even a whole header
  spit(file("t.bin"), bytes);
  expect_bad_input([&] { TokenDataset::open(file("t.bin"), 256, "data.valid"); },
                   {file("t.bin"), "40 bytes", "64-byte trident header"});

  auto shard = llmc_shard({1, 2, 3, 4});
  shard.pop_back();
  spit(file("s.bin"), shard);
  expect_bad_input([&] { TokenDataset::open(file("s.bin"), 256, "data.train"); },
                   {file("s.bin"), "file is 1031 bytes, expected 1032", "llm.c", "truncated"});
}

TEST_F(DatasetTest, TrailingBytes) {
  trident::write_token_file(file("t.bin"), iota_tokens(10, 256), 256, 0);
  auto bytes = slurp(file("t.bin"));
  bytes.push_back(0);
  spit(file("t.bin"), bytes);
  expect_bad_input([&] { TokenDataset::open(file("t.bin"), 256, "data.train"); },
                   {file("t.bin"), "file is 85 bytes, expected 84", "trailing"});
}

TEST_F(DatasetTest, WrongMagic) {
  trident::write_token_file(file("m.bin"), iota_tokens(10, 256), 256, 0);
  auto bytes = slurp(file("m.bin"));
  bytes[0] = 'X';
  spit(file("m.bin"), bytes);
  expect_bad_input([&] { TokenDataset::open(file("m.bin"), 256, "data.train"); },
                   {"data.train", file("m.bin"), "bad magic", "TRIDTOK", "20240520"});
  spit(file("m.bin"), llmc_shard({1, 2, 3}, 20240521));
  expect_bad_input([&] { TokenDataset::open(file("m.bin"), 256, "data.train"); },
                   {file("m.bin"), "bad magic"});
  spit(file("empty.bin"), {});
  expect_bad_input([&] { TokenDataset::open(file("empty.bin"), 256, "data.train"); },
                   {file("empty.bin"), "0 bytes"});
}

TEST_F(DatasetTest, WrongVersion) {
  trident::write_token_file(file("v.bin"), iota_tokens(10, 256), 256, 0);
  auto bytes = slurp(file("v.bin"));
  put<uint32_t>(bytes, 8, 2);
  spit(file("v.bin"), bytes);
  expect_bad_input([&] { TokenDataset::open(file("v.bin"), 256, "data.train"); },
                   {file("v.bin"), "version 2 is not supported"});
  spit(file("s.bin"), llmc_shard({1, 2, 3}, 20240520, 2));
  expect_bad_input([&] { TokenDataset::open(file("s.bin"), 256, "data.train"); },
                   {file("s.bin"), "llm.c shard version 2 is not supported"});
}

TEST_F(DatasetTest, BadHeaderFields) {
  trident::write_token_file(file("h.bin"), iota_tokens(10, 256), 256, 0);
  auto good = slurp(file("h.bin"));
  auto bytes = good;
  put<uint32_t>(bytes, 12, 3);
  spit(file("h.bin"), bytes);
  expect_bad_input([&] { TokenDataset::open(file("h.bin"), 256, "data.train"); },
                   {file("h.bin"), "bytes_per_token is 3, must be 2 or 4"});
  bytes = good;
  bytes[40] = 1;
  spit(file("h.bin"), bytes);
  expect_bad_input([&] { TokenDataset::open(file("h.bin"), 256, "data.train"); },
                   {file("h.bin"), "header byte 40", "must be zero"});
}

TEST_F(DatasetTest, TokenAtLeastVocab) {
  auto tokens = iota_tokens(2000, 200);
  tokens[1234] = 300;
  tokens[1500] = 400;
  trident::write_token_file(file("x.bin"), tokens, 512, 2);
  expect_bad_input([&] { TokenDataset::open(file("x.bin"), 256, "data.train"); },
                   {"data.train: " + file("x.bin") +
                        ": token 300 at position 1234 is >= "
                        "model.vocab 256",
                    "header says vocab_size 512"});
  // The same file opens for a model whose vocabulary covers it.
  EXPECT_EQ(TokenDataset::open(file("x.bin"), 512, "data.train")->token(1500), 400);

  std::vector<uint16_t> raw = {1, 2, 50257, 3};
  spit(file("s.bin"), llmc_shard(raw));
  expect_bad_input(
      [&] { TokenDataset::open(file("s.bin"), 50257, "data.valid"); },
      {"data.valid", file("s.bin"), "token 50257 at position 2 is >= model.vocab 50257"});
}

TEST_F(DatasetTest, TokenAtLeastHeaderVocab) {
  trident::write_token_file(file("c.bin"), iota_tokens(10, 100), 100, 2);
  auto bytes = slurp(file("c.bin"));
  put<uint16_t>(bytes, 64 + 2 * 5, 150);  // above the header's vocab_size, below the model's
  spit(file("c.bin"), bytes);
  expect_bad_input([&] { TokenDataset::open(file("c.bin"), 256, "data.train"); },
                   {file("c.bin"), "token 150 at position 5 is >= the header's vocab_size 100"});
}

TEST_F(DatasetTest, TooShort) {
  trident::write_token_file(file("one.bin"), {5}, 256, 0);
  expect_bad_input([&] { TokenDataset::open(file("one.bin"), 256, "data.train"); },
                   {file("one.bin"), "has 1 tokens, at least 2"});

  trident::write_token_file(file("short.bin"), iota_tokens(64, 256), 256, 0);
  auto d = TokenDataset::open(file("short.bin"), 256, "data.train");
  expect_bad_input(
      [&] { SampleOrder(*d, 64, false, 1); },
      {file("short.bin"), "64 tokens are too few for one sample of model.seq_len 64", "needs 65"});
  EXPECT_EQ(SampleOrder(*d, 63, false, 1).num_samples(), 1u);
}

TEST_F(DatasetTest, WriteRejectsBadTokens) {
  expect_bad_input(
      [&] {
        trident::write_token_file(file("w.bin"), {1, 256}, 256, 0);
      },
      {file("w.bin"), "token 256 at position 1"});
  expect_bad_input(
      [&] {
        trident::write_token_file(file("w.bin"), {1, -1}, 256, 0);
      },
      {"token -1"});
  EXPECT_FALSE(fs::exists(file("w.bin")));
}

// ---- sample order --------------------------------------------------------------------------

TEST_F(DatasetTest, WindowsMatchHandComputation) {
  // 11 tokens, T = 3: S = (11 - 1) / 3 = 3 samples starting at tokens 0, 3, 6; token 10 unused.
  std::vector<int32_t> tokens = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
  trident::write_token_file(file("w.bin"), tokens, 256, 0);
  auto d = TokenDataset::open(file("w.bin"), 256, "data.train");
  SampleOrder order(*d, 3, false, 0);
  ASSERT_EQ(order.num_samples(), 3u);
  std::vector<int32_t> in(4 * 3), tg(4 * 3);
  order.fill(1, 4, in.data(), tg.data());  // positions 1, 2, 3, 4 -> samples 1, 2, 0, 1
  EXPECT_EQ(in, (std::vector<int32_t>{13, 14, 15, 16, 17, 18, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(tg, (std::vector<int32_t>{14, 15, 16, 17, 18, 19, 11, 12, 13, 14, 15, 16}));
}

TEST_F(DatasetTest, NoShuffleIsFileOrderAndWraps) {
  trident::write_token_file(file("n.bin"), iota_tokens(101, 256), 256, 0);
  auto d = TokenDataset::open(file("n.bin"), 256, "data.train");
  SampleOrder order(*d, 10, false, 42);
  ASSERT_EQ(order.num_samples(), 10u);
  for (uint64_t g = 0; g < 35; ++g) EXPECT_EQ(order.sample_at(g), g % 10) << g;
  EXPECT_EQ(order.sample_at(10'000'000'007ull), 7u);
}

std::vector<size_t> epoch_order(const SampleOrder& order, uint64_t epoch) {
  std::vector<size_t> out;
  const size_t S = order.num_samples();
  for (uint64_t i = 0; i < S; ++i) out.push_back(order.sample_at(epoch * S + i));
  return out;
}

TEST_F(DatasetTest, ShuffleIsSeededPermutationPerEpoch) {
  trident::write_token_file(file("s.bin"), iota_tokens(1001, 256), 256, 0);
  auto d = TokenDataset::open(file("s.bin"), 256, "data.train");
  SampleOrder a(*d, 10, true, 1337), b(*d, 10, true, 1337), c(*d, 10, true, 1338);
  const size_t S = a.num_samples();
  ASSERT_EQ(S, 100u);

  std::vector<size_t> identity(S);
  std::iota(identity.begin(), identity.end(), 0);
  std::vector<std::vector<size_t>> epochs;
  for (uint64_t e = 0; e < 4; ++e) {
    auto p = epoch_order(a, e);
    auto sorted = p;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, identity) << "epoch " << e << " is not a permutation";
    EXPECT_NE(p, identity) << "epoch " << e << " is not shuffled";
    epochs.push_back(p);
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_NE(epochs[1], epochs[2]);
  EXPECT_NE(epoch_order(c, 0), epochs[0]) << "different seeds gave the same order";

  // Same seed, same answers, whatever order the positions are asked in (the cache is invisible).
  for (uint64_t g : {350ull, 5ull, 399ull, 0ull, 250ull, 101ull, 99ull})
    EXPECT_EQ(b.sample_at(g), epochs[g / S][g % S]) << g;
}

// The samples of a step don't depend on how the global batch is split among readers.
TEST_F(DatasetTest, SplittingTheBatchGivesTheSameSamples) {
  trident::write_token_file(file("r.bin"), iota_tokens(5000, 251), 256, 0);
  auto d = TokenDataset::open(file("r.bin"), 256, "data.train");
  const int T = 16, global_batch = 8;
  const uint64_t step = 37;
  SampleOrder whole(*d, T, true, 7);
  std::vector<int32_t> in(global_batch * T), tg(global_batch * T);
  whole.fill(step * global_batch, global_batch, in.data(), tg.data());
  for (int readers : {2, 4}) {
    const int local = global_batch / readers;
    for (int r = 0; r < readers; ++r) {
      SampleOrder mine(*d, T, true, 7);
      std::vector<int32_t> li(local * T), lt(local * T);
      mine.fill(step * global_batch + r * local, local, li.data(), lt.data());
      EXPECT_TRUE(std::equal(li.begin(), li.end(), in.begin() + r * local * T));
      EXPECT_TRUE(std::equal(lt.begin(), lt.end(), tg.begin() + r * local * T));
    }
  }
}

// An in-memory dataset: exercises the interface's default read() and describe().
class VectorDataset : public TokenDataset {
 public:
  explicit VectorDataset(std::vector<int32_t> t) : tokens_(std::move(t)) {}
  size_t n_tokens() const override { return tokens_.size(); }
  int32_t token(size_t i) const override { return tokens_.at(i); }
  const std::string& path() const override { return path_; }

 private:
  std::vector<int32_t> tokens_;
  std::string path_ = "memory";
};

TEST(SampleOrderTest, FillAcrossAnEpochBoundaryMatchesSampleAt) {
  VectorDataset d(iota_tokens(4 * 7 + 1, 1000));  // T = 4: S = 7
  EXPECT_EQ(d.describe(), "memory: 29 tokens");
  SampleOrder order(d, 4, true, 99), reference(d, 4, true, 99);
  std::vector<int32_t> in(5 * 4), tg(5 * 4);
  order.fill(5, 5, in.data(), tg.data());  // positions 5, 6 | 7, 8, 9: epochs 0 and 1
  for (int b = 0; b < 5; ++b) {
    const int32_t start = static_cast<int32_t>(reference.sample_at(5 + b) * 4);
    for (int t = 0; t < 4; ++t) {
      EXPECT_EQ(in[b * 4 + t], start + t) << b << "," << t;
      EXPECT_EQ(tg[b * 4 + t], start + t + 1) << b << "," << t;
    }
  }
}

// ---- the bundled dataset -------------------------------------------------------------------

TEST(BundledDataset, OpensWithByteVocab) {
  for (const char* name : {"tiny-train.bin", "tiny-valid.bin"}) {
    std::string path = std::string(TRIDENT_SOURCE_DIR) + "/inputs/data/" + name;
    auto d = TokenDataset::open(path, 256, "data.train");
    EXPECT_GT(d->n_tokens(), 50'000u) << path;
    SampleOrder order(*d, 64, true, 1337);
    EXPECT_GT(order.num_samples(), 500u);
    std::vector<int32_t> in(4 * 64), tg(4 * 64);
    order.fill(0, 4, in.data(), tg.data());
    for (int32_t t : in) EXPECT_TRUE(t == '\n' || (t >= 32 && t < 127)) << t;
  }
}

}  // namespace
