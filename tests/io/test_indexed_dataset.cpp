// Megatron indexed datasets (Note [Megatron indexed dataset], src/io/indexed_dataset.cpp): the
// hand-written fixture in tests/data/indexed, datasets written by tools/make_indexed.py, the
// naming rules, the same samples as a trident token file, and every rejected header.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
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

const char* kPython = "/usr/bin/python3";

class IndexedDatasetTest : public trident::testing::ScratchDirTest {
 protected:
  IndexedDatasetTest() : ScratchDirTest("trident_test_indexed_") {}
};

std::string fixture() { return std::string(TRIDENT_SOURCE_DIR) + "/tests/data/indexed/handmade"; }

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

template <typename T>
void put(std::vector<unsigned char>& bytes, size_t offset, T v) {
  std::memcpy(bytes.data() + offset, &v, sizeof(T));
}

template <typename T>
void append(std::vector<unsigned char>& bytes, T v) {
  bytes.resize(bytes.size() + sizeof(T));
  put<T>(bytes, bytes.size() - sizeof(T), v);
}

// An indexed dataset built here from the format description: one sequence per document unless
// doc_idx is given. `code` is Megatron's dtype code, `item` its width in bytes.
struct Indexed {
  std::vector<unsigned char> idx, bin;
  size_t n_seq;
  size_t sizes_at() const { return 34; }
  size_t pointers_at() const { return 34 + 4 * n_seq; }
  size_t doc_idx_at() const { return 34 + 12 * n_seq; }
};

Indexed build(const std::vector<std::vector<int64_t>>& seqs, uint8_t code = 8, int item = 2,
              std::vector<int64_t> doc_idx = {}) {
  if (doc_idx.empty())
    for (size_t i = 0; i <= seqs.size(); ++i) doc_idx.push_back(static_cast<int64_t>(i));
  Indexed d{{}, {}, seqs.size()};
  d.idx = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
  append<uint64_t>(d.idx, 1);
  append<uint8_t>(d.idx, code);
  append<uint64_t>(d.idx, seqs.size());
  append<uint64_t>(d.idx, doc_idx.size());
  for (const auto& s : seqs) append<int32_t>(d.idx, static_cast<int32_t>(s.size()));
  int64_t offset = 0;
  for (const auto& s : seqs) {
    append<int64_t>(d.idx, offset);
    offset += static_cast<int64_t>(s.size()) * item;
  }
  for (int64_t j : doc_idx) append<int64_t>(d.idx, j);
  for (const auto& s : seqs)
    for (int64_t t : s) {
      d.bin.resize(d.bin.size() + item);
      std::memcpy(d.bin.data() + d.bin.size() - item, &t, item);  // little-endian low bytes
    }
  return d;
}

// Three documents of small tokens: 10 + 7 + 15 = 32 tokens.
std::vector<std::vector<int64_t>> three_documents() {
  std::vector<std::vector<int64_t>> seqs(3);
  const size_t lengths[3] = {10, 7, 15};
  int64_t t = 0;
  for (int s = 0; s < 3; ++s)
    for (size_t i = 0; i < lengths[s]; ++i) seqs[s].push_back(t++ % 200);
  return seqs;
}

std::vector<int32_t> read_all(const TokenDataset& d) {
  std::vector<int32_t> out(d.n_tokens());
  d.read(0, d.n_tokens(), out.data());
  return out;
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

int run(const std::string& command) {
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// ---- the hand-written fixture --------------------------------------------------------------

TEST_F(IndexedDatasetTest, HandWrittenFixtureIsItsText) {
  const std::string text = read_bytes(fixture() + ".txt");
  ASSERT_EQ(text.size(), 100u) << "tests/data/indexed/handmade.txt";
  for (const std::string& name : {fixture(), fixture() + ".bin", fixture() + ".idx"}) {
    auto d = TokenDataset::open(name, 256, "data.train");
    ASSERT_EQ(d->n_tokens(), text.size()) << name;
    std::vector<int32_t> want(text.begin(), text.end());
    EXPECT_EQ(read_all(*d), want) << name;
    EXPECT_EQ(d->token(24), 'I') << "the first token of sequence 1";
    EXPECT_EQ(d->path(), fixture() + ".bin");
    for (const char* part :
         {"100 tokens", "Megatron indexed", "int32", "4 sequences", "3 documents"})
      EXPECT_NE(d->describe().find(part), std::string::npos) << d->describe();
  }
}

TEST_F(IndexedDatasetTest, SamplesMatchTheSameTokensInATokenFile) {
  const std::string text = read_bytes(fixture() + ".txt");
  trident::write_token_file(file("same.bin"), std::vector<int32_t>(text.begin(), text.end()), 256,
                            0);
  auto indexed = TokenDataset::open(fixture(), 256, "data.train");
  auto tokens = TokenDataset::open(file("same.bin"), 256, "data.train");
  for (bool shuffle : {false, true}) {
    SampleOrder a(*indexed, 16, shuffle, 7), b(*tokens, 16, shuffle, 7);
    ASSERT_EQ(a.num_samples(), 6u);  // (100 - 1) / 16
    std::vector<int32_t> ia(4 * 16), ta(4 * 16), ib(4 * 16), tb(4 * 16);
    for (uint64_t g = 0; g < 20; g += 4) {  // across epochs
      a.fill(g, 4, ia.data(), ta.data());
      b.fill(g, 4, ib.data(), tb.data());
      EXPECT_EQ(ia, ib) << "g " << g << " shuffle " << shuffle;
      EXPECT_EQ(ta, tb) << "g " << g << " shuffle " << shuffle;
    }
  }
}

// ---- every integer dtype, the naming rules -------------------------------------------------

TEST_F(IndexedDatasetTest, ReadsEveryIntegerDtype) {
  struct Case {
    uint8_t code;
    int item;
    const char* name;
  };
  for (Case c : {Case{1, 1, "uint8"}, Case{2, 1, "int8"}, Case{3, 2, "int16"}, Case{4, 4, "int32"},
                 Case{5, 8, "int64"}, Case{8, 2, "uint16"}}) {
    const int vocab = c.item == 1 ? 100 : 60000;
    std::vector<std::vector<int64_t>> seqs = {{0, 1, 99}, {}, {42, 7}};
    if (vocab > 100 && c.code != 3) seqs[2].push_back(59999);
    Indexed d = build(seqs, c.code, c.item);
    write_bytes(file("d.idx"), d.idx);
    write_bytes(file("d.bin"), d.bin);
    auto ds = TokenDataset::open(file("d"), vocab, "data.train");
    std::vector<int32_t> want;
    for (const auto& s : seqs) want.insert(want.end(), s.begin(), s.end());
    EXPECT_EQ(read_all(*ds), want) << c.name;
    EXPECT_NE(ds->describe().find(c.name), std::string::npos) << ds->describe();
  }
}

TEST_F(IndexedDatasetTest, NamingRules) {
  Indexed d = build(three_documents());
  write_bytes(file("p.idx"), d.idx);
  write_bytes(file("p.bin"), d.bin);
  for (const std::string& name : {file("p"), file("p.bin"), file("p.idx")})
    EXPECT_EQ(TokenDataset::open(name, 256, "data.train")->n_tokens(), 32u) << name;
  // A .bin alone is a trident token file or an llm.c shard, as before.
  write_bytes(file("alone.bin"), d.bin);
  expect_bad_input([&] { TokenDataset::open(file("alone.bin"), 256, "data.train"); },
                   {file("alone.bin"), "bad magic"});
  // A prefix whose .bin or .idx is missing names the missing one.
  write_bytes(file("nobin.idx"), d.idx);
  expect_bad_input([&] { TokenDataset::open(file("nobin"), 256, "data.train"); },
                   {"data.train", file("nobin.bin"), "cannot open"});
  write_bytes(file("onlybin.bin"), d.bin);
  expect_bad_input([&] { TokenDataset::open(file("onlybin"), 256, "data.valid"); },
                   {"data.valid", file("onlybin.idx"), "cannot open"});
  expect_bad_input([&] { TokenDataset::open(file("none.idx"), 256, "data.train"); },
                   {file("none.idx"), "cannot open"});
}

// ---- written by tools/make_indexed.py ------------------------------------------------------

class MakeIndexedTest : public IndexedDatasetTest {
 protected:
  void SetUp() override {
    if (::access(kPython, X_OK) != 0) GTEST_SKIP() << kPython << " not found";
    if (run(std::string(kPython) + " -c 'import numpy' 2>/dev/null") != 0)
      GTEST_SKIP() << "numpy is missing (python3-numpy): cannot run tools/make_indexed.py";
    IndexedDatasetTest::SetUp();
  }
  int make(const std::string& args) {
    return run(std::string(kPython) + " " + TRIDENT_SOURCE_DIR + "/tools/make_indexed.py " + args +
               " 2>/dev/null");
  }
};

TEST_F(MakeIndexedTest, TextLinesAndFilesAreTheirBytes) {
  std::string text = "first line\nsecond\n\nna\xc3\xafve \xff\x01 bytes\nno newline at the end";
  std::ofstream(file("a.txt"), std::ios::binary) << text;
  std::ofstream(file("b.txt"), std::ios::binary) << "second file\n";
  ASSERT_EQ(make("text " + file("a.txt") + " " + file("b.txt") + " -o " + file("lines")), 0);
  ASSERT_EQ(
      make("text --document file " + file("a.txt") + " " + file("b.txt") + " -o " + file("files")),
      0);
  const std::string all = text + "second file\n";
  std::vector<int32_t> want_bytes;
  for (unsigned char c : all) want_bytes.push_back(c);
  auto lines = TokenDataset::open(file("lines"), 256, "data.train");
  auto files = TokenDataset::open(file("files.idx"), 256, "data.train");
  EXPECT_EQ(read_all(*lines), want_bytes);
  EXPECT_EQ(read_all(*files), want_bytes);
  EXPECT_NE(lines->describe().find("uint16"), std::string::npos) << lines->describe();
  EXPECT_NE(lines->describe().find("6 sequences in 6 documents"), std::string::npos)
      << lines->describe();
  EXPECT_NE(files->describe().find("2 sequences in 2 documents"), std::string::npos)
      << files->describe();
  // The index bytes: magic, version 1, dtype code 8, counts.
  const std::string idx = read_bytes(file("lines.idx"));
  ASSERT_GE(idx.size(), 34u);
  EXPECT_EQ(idx.substr(0, 9), std::string("MMIDIDX\0\0", 9));
  EXPECT_EQ(idx[9], 1);
  EXPECT_EQ(idx[17], 8);
  EXPECT_EQ(idx[18], 6);
  EXPECT_EQ(idx[26], 7);
  EXPECT_EQ(idx.size(), 34u + 12 * 6 + 8 * 7);
}

TEST_F(MakeIndexedTest, TokenFileSplitIntoDocumentsIsTheSameStream) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < 3000; ++i) tokens.push_back((i * 7919) % 70000);
  trident::write_token_file(file("big.bin"), tokens, 70000, 2);  // 4-byte tokens
  ASSERT_EQ(make("tokens " + file("big.bin") + " --split-after 0 -o " + file("ix")), 0);
  auto ix = TokenDataset::open(file("ix"), 70000, "data.train");
  EXPECT_EQ(read_all(*ix), tokens);
  EXPECT_NE(ix->describe().find("int32"), std::string::npos) << ix->describe();
  // --append-eod adds one token per document, here the single one.
  ASSERT_EQ(make("tokens " + file("big.bin") + " --append-eod 69999 -o " + file("eod")), 0);
  auto eod = TokenDataset::open(file("eod"), 70000, "data.train");
  ASSERT_EQ(eod->n_tokens(), tokens.size() + 1);
  EXPECT_EQ(eod->token(tokens.size()), 69999);
  // The tool refuses to overwrite its input.
  EXPECT_NE(make("tokens " + file("big.bin") + " -o " + file("big")), 0);
}

// ---- rejected inputs: each names the file, the field and the index -------------------------

class BadIndexTest : public IndexedDatasetTest {
 protected:
  void SetUp() override {
    IndexedDatasetTest::SetUp();
    d_ = build(three_documents());
  }
  // Writes d_ as bad.idx / bad.bin and expects opening it to fail naming `parts`.
  void expect_refused(const std::vector<std::string>& parts, int vocab = 256) {
    write_bytes(file("bad.idx"), d_.idx);
    write_bytes(file("bad.bin"), d_.bin);
    expect_bad_input([&] { TokenDataset::open(file("bad"), vocab, "data.train"); }, parts);
  }
  std::string idx() const { return file("bad.idx"); }
  std::string bin() const { return file("bad.bin"); }

  Indexed d_;
};

TEST_F(BadIndexTest, WrongMagic) {
  d_.idx[7] = 'Y';
  expect_refused({"data.train", idx(), "magic is 4d 4d 49 44 49 44 58 59 00", "MMIDIDX"});
  d_.idx.resize(20);
  expect_refused({idx(), "20 bytes", "34-byte Megatron index header"});
}

TEST_F(BadIndexTest, WrongVersion) {
  put<uint64_t>(d_.idx, 9, 2);
  expect_refused({idx(), "version is 2, expected 1"});
}

TEST_F(BadIndexTest, UnknownAndFloatDtypes) {
  for (uint8_t code : {0, 9, 255}) {
    d_.idx[17] = code;
    expect_refused({idx(), fmt::format("dtype code {} is unknown", code), "8 uint16"});
  }
  d_.idx[17] = 6;
  expect_refused({idx(), "dtype code 6 is float64", "must be integers"});
  d_.idx[17] = 7;
  expect_refused({idx(), "dtype code 7 is float32"});
}

TEST_F(BadIndexTest, CountsDisagreeWithTheIndexSize) {
  Indexed good = d_;
  put<uint64_t>(d_.idx, 18, 4);  // sequence_count
  expect_refused({idx(), "file is 102 bytes", "sequence_count 4 and document_count 4",
                  "need 114 bytes", "truncated"});
  d_ = good;
  put<uint64_t>(d_.idx, 26, 3);  // document_count
  expect_refused({idx(), "sequence_count 3 and document_count 3", "need 94", "trailing bytes"});
  d_ = good;
  put<uint64_t>(d_.idx, 18, uint64_t(1) << 62);  // would overflow 12 S
  expect_refused({idx(), "sequence_count 4611686018427387904", "need more bytes"});
  d_ = good;
  for (int i = 0; i < 3; ++i) d_.idx.push_back(0);  // a byte of sequence mode per sequence
  expect_refused({idx(), "trailing bytes", "multimodal"});
  d_ = good;
  d_.idx.pop_back();
  expect_refused({idx(), "file is 101 bytes", "truncated"});
}

TEST_F(BadIndexTest, BinSizeDisagreesWithTheSizes) {
  d_.bin.resize(d_.bin.size() - 2);
  expect_refused({"data.train", bin(), "file is 62 bytes",
                  "add up to 32 tokens x 2 bytes (uint16) "
                  "= 64 bytes"});
  d_.bin.resize(d_.bin.size() + 6);
  expect_refused({bin(), "file is 68 bytes"});
  d_ = build(three_documents());
  put<int32_t>(d_.idx, d_.sizes_at() + 4, -7);
  expect_refused({idx(), "sizes[1] is -7"});
}

TEST_F(BadIndexTest, PointersOutOfRangeOrInconsistent) {
  Indexed good = d_;
  put<int64_t>(d_.idx, d_.pointers_at() + 8 * 2, 60);  // sequence 2: 15 tokens from byte 60
  expect_refused(
      {idx(), "pointers[2] is 60, out of range", "sequence 2 (15 tokens)", bin(), "64 bytes"});
  d_ = good;
  put<int64_t>(d_.idx, d_.pointers_at() + 8 * 1, -2);
  expect_refused({idx(), "pointers[1] is -2, out of range"});
  d_ = good;
  put<int64_t>(d_.idx, d_.pointers_at() + 8 * 1, 22);
  expect_refused({idx(), "pointers[1] is 22, expected 20 (pointers[0] + sizes[0] 10 x 2 bytes)",
                  "back to back"});
  d_ = good;
  put<int64_t>(d_.idx, d_.pointers_at(), 2);
  expect_refused({idx(), "pointers[0] is 2, expected 0"});
  // Sequences swapped in the file: consistent sizes and in range, but out of order.
  d_ = build({{1, 2}, {3, 4}});
  put<int64_t>(d_.idx, d_.pointers_at(), 4);
  put<int64_t>(d_.idx, d_.pointers_at() + 8, 0);
  expect_refused({idx(), "pointers[0] is 4, expected 0"});
}

TEST_F(BadIndexTest, DocumentIndex) {
  d_ = build(three_documents(), 8, 2, {1, 2, 3});
  expect_refused({idx(), "doc_idx[0] is 1, expected 0"});
  d_ = build(three_documents(), 8, 2, {0, 2, 1, 3});
  expect_refused({idx(), "doc_idx[2] is 1, out of order or range"});
  d_ = build(three_documents(), 8, 2, {0, 4, 3});
  expect_refused({idx(), "doc_idx[1] is 4, out of order or range", "sequence_count 3"});
  d_ = build(three_documents(), 8, 2, {0, 1, 2});
  expect_refused({idx(), "doc_idx[2] is 2, expected sequence_count 3"});
  d_ = build(three_documents(), 8, 2, {0});
  d_.idx.resize(d_.idx.size() - 8);
  put<uint64_t>(d_.idx, 26, 0);
  expect_refused({idx(), "document_count is 0"});
}

TEST_F(BadIndexTest, TokensOutOfRange) {
  auto seqs = three_documents();
  seqs[1][3] = 300;  // position 13, in sequence 1 (document 1)
  d_ = build(seqs);
  expect_refused({"data.train", bin(),
                  "token 300 at position 13 (sequence 1, document 1) is "
                  ">= model.vocab 256"});
  seqs[1][3] = -5;
  d_ = build(seqs, 4, 4);  // int32
  expect_refused({bin(), "token -5 at position 13 (sequence 1, document 1) is negative"});
  // Documents of two sequences each: the document is found through doc_idx.
  seqs[1][3] = 3;
  seqs[2][14] = 256;
  d_ = build(seqs, 4, 4, {0, 2, 3});
  expect_refused({bin(), "token 256 at position 31 (sequence 2, document 1)"});
  d_ = build({{1}, {}});
  expect_refused({bin(), "has 1 tokens, at least 2"});
}

}  // namespace
