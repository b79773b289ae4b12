// Hugging Face GPT-2 safetensors (model/safetensors.cpp): a round trip, GPT-2's names and
// Conv1D orientation read straight from the bytes, sniffing, and refusals with their names.
// tests/cli/test_export.sh covers the command, other layouts and every bad header field.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "trident/check.h"
#include "trident/model.h"

namespace trident {
namespace {

namespace fs = std::filesystem;

GPTConfig tiny_config() {
  GPTConfig c;
  c.layers = 2;
  c.channels = 16;
  c.heads = 2;
  c.vocab = 50;  // padded to 128: the file has 50 rows
  c.padded_vocab = GPTConfig::pad_vocab(c.vocab);
  c.max_seq_len = 8;
  return c;
}

std::string scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / "trident_test_safetensors";
  fs::create_directories(dir);
  return (dir / name).string();
}

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The message of the input_error `f` throws ("" if it throws none).
template <typename F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput) << e.what();
    return e.what();
  }
  return "";
}

TEST(Safetensors, RoundTripWithGpt2NamesAndLayout) {
  const GPTConfig c = tiny_config();
  auto be = make_cpu_backend(1);
  GPT a(c, *be, 1, 8), b(c, *be, 1, 8);
  a.init_weights(3);
  const std::string path = scratch("model.safetensors");
  const size_t bytes = save_safetensors_weights(a, path);
  EXPECT_EQ(bytes, fs::file_size(path));
  EXPECT_TRUE(is_safetensors(path));

  const GPTConfig r = read_safetensors_config(path);
  EXPECT_EQ(r.layers, c.layers);
  EXPECT_EQ(r.channels, c.channels);
  EXPECT_EQ(r.heads, c.heads);  // from __metadata__ n_head
  EXPECT_EQ(r.vocab, c.vocab);
  EXPECT_EQ(r.padded_vocab, c.padded_vocab);
  EXPECT_EQ(r.max_seq_len, c.max_seq_len);
  load_safetensors_weights(b, path);
  EXPECT_EQ(0, std::memcmp(a.params(), b.params(), a.num_params() * 4));

  // The bytes themselves: GPT-2's names, wte with the real vocabulary, c_attn as [in, out].
  const std::string blob = read_all(path);
  uint64_t n = 0;
  std::memcpy(&n, blob.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  const auto h = nlohmann::json::parse(blob.substr(8, n));
  EXPECT_EQ(h["__metadata__"]["format"], "pt");
  EXPECT_FALSE(h.contains("lm_head.weight"));
  EXPECT_EQ(h["transformer.wte.weight"]["shape"], nlohmann::json({50, 16}));
  const auto& qkv = h["transformer.h.1.attn.c_attn.weight"];
  ASSERT_EQ(qkv["shape"], nlohmann::json({16, 48}));
  const float* file =
      reinterpret_cast<const float*>(blob.data() + 8 + n + qkv["data_offsets"][0].get<size_t>());
  const ParamInfo& p = a.param("h1.qkvw");  // [3C, C] = [out, in]
  for (int o = 0; o < 48; ++o)
    for (int i = 0; i < 16; ++i)
      ASSERT_EQ(file[i * 48 + o], a.params()[p.offset + o * 16 + i]) << o << "," << i;
}

TEST(Safetensors, SniffedWithoutTheExtensionAndNotForLlmc) {
  const GPTConfig c = tiny_config();
  auto be = make_cpu_backend(1);
  GPT a(c, *be, 1, 8);
  a.init_weights(4);
  const std::string st = scratch("weights.bin"), llmc = scratch("llmc.bin");
  save_safetensors_weights(a, st);
  save_llmc_weights(a, llmc);
  EXPECT_TRUE(is_safetensors(st));
  EXPECT_FALSE(is_safetensors(llmc));
  EXPECT_FALSE(is_safetensors(scratch("does-not-exist")));
  // model.init_from's readers take either.
  EXPECT_EQ(read_llmc_config(st).heads, c.heads);
  GPT b(c, *be, 1, 8);
  load_llmc_weights(b, st);
  EXPECT_EQ(0, std::memcmp(a.params(), b.params(), a.num_params() * 4));
}

TEST(Safetensors, RefusesWithTheFileAndTheProblem) {
  const GPTConfig c = tiny_config();
  auto be = make_cpu_backend(1);
  GPT a(c, *be, 1, 8);
  a.init_weights(5);
  const std::string good = scratch("good.safetensors");
  save_safetensors_weights(a, good);
  const std::string blob = read_all(good);
  const std::string bad = scratch("bad.safetensors");
  auto write = [&](const std::string& bytes) { std::ofstream(bad, std::ios::binary) << bytes; };

  uint64_t n = 0;
  std::memcpy(&n, blob.data(), 8);
  const std::string data = blob.substr(8 + n);
  // The file with header `h` and the good file's data.
  auto with_header = [&](const nlohmann::json& h) {
    const std::string text = h.dump();
    std::string out(8, '\0');
    const uint64_t len = text.size();
    std::memcpy(out.data(), &len, 8);
    write(out + text + data);
  };
  auto expect_refusal = [&](const std::string& what) {
    const std::string msg = refusal([&] { load_llmc_weights(a, bad); });
    EXPECT_NE(msg.find(bad), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << "expected \"" << what << "\" in: " << msg;
  };
  const auto header = nlohmann::json::parse(blob.substr(8, n));
  const std::string qkv = "transformer.h.0.attn.c_attn.weight";

  write(blob.substr(0, 4));
  expect_refusal("shorter than the 8-byte header length");
  write(std::string("\xff\xff\xff\x00\x00\x00\x00\x00{", 9) + data);
  expect_refusal("runs past the end of the file");
  write(blob.substr(0, 8) + "{\"x\":" + blob.substr(13));
  expect_refusal("header is not valid JSON");
  auto h = header;
  h[qkv]["dtype"] = "I32";
  with_header(h);
  expect_refusal(qkv + ": dtype I32 not supported");
  h = header;
  h[qkv]["shape"] = {48, 16};
  with_header(h);
  expect_refusal(qkv + ": shape [48, 16]");
  h = header;
  h[qkv]["shape"] = {16, 47};
  with_header(h);
  expect_refusal(qkv + ": data_offsets");
  h = header;
  h["transformer.ln_f.bias"]["data_offsets"][0] = data.size() + 4;
  h["transformer.ln_f.bias"]["data_offsets"][1] = data.size() + 4 + 16 * 4;
  with_header(h);
  expect_refusal("transformer.ln_f.bias: data_offsets");
  h = header;
  h.erase("__metadata__");
  with_header(h);
  expect_refusal("number of attention heads");
  // A model of another shape than the file's.
  GPTConfig other = c;
  other.heads = 4;
  GPT d(other, *be, 1, 8);
  const std::string msg = refusal([&] { load_safetensors_weights(d, good); });
  EXPECT_NE(msg.find("heads=2 vocab=50"), std::string::npos) << msg;
}

}  // namespace
}  // namespace trident
