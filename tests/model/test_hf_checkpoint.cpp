// The Hugging Face conversions (model/hf_config.cpp, hf_names.cpp) without transformers: each
// layout's conversion against a hand-made index formula, back and forth; config.json written for
// each family and read back to the same config; mixtures transformers cannot hold refused.
// tests/oracle/test_hf_checkpoints.py checks the same against transformers' own files.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "model/hf_checkpoint.h"
#include "trident/check.h"

namespace trident {
namespace {

GPTConfig family_config(Family f) {
  GPTConfig c;
  c.apply_family(f);
  c.layers = 2;
  c.channels = 32;
  c.heads = 4;
  c.vocab = 50;
  c.padded_vocab = GPTConfig::pad_vocab(c.vocab);
  c.max_seq_len = 8;
  if (f == Family::kLlama) {
    c.kv_heads = 2;
    c.mlp_hidden = 48;
    c.norm_eps = 1e-6f;
    c.rope_base = 500000.0f;
  }
  return c;
}

const hf::TensorMap& find(const std::vector<hf::TensorMap>& maps, const std::string& name) {
  for (const hf::TensorMap& m : maps)
    if (m.trident == name) return m;
  throw std::runtime_error("no map for " + name);
}

// Distinct values, so a misplaced one is seen: 1000·part + index.
std::vector<std::vector<float>> numbered_parts(const hf::TensorMap& m) {
  std::vector<std::vector<float>> parts;
  for (size_t p = 0; p < m.hf_shape.size(); ++p) {
    size_t n = 1;
    for (int64_t d : m.hf_shape[p]) n *= size_t(d);
    parts.emplace_back(n);
    for (size_t i = 0; i < n; ++i) parts.back()[i] = float(100000 * p + i);
  }
  return parts;
}

TEST(HfNames, NeoxQueryKeyValueIsPerHeadInterleaved) {
  const GPTConfig c = family_config(Family::kNeoX);
  const auto maps = hf::tensor_maps(c);
  const hf::TensorMap& m = find(maps, "h1.qkvw");
  ASSERT_EQ(m.hf, std::vector<std::string>{"gpt_neox.layers.1.attention.query_key_value.weight"});
  const int hs = c.head_size(), C = c.channels;
  const auto parts = numbered_parts(m);
  const std::vector<float> g = hf::to_trident(m, parts);
  // trident row (part s, head j, d) is transformers' row (j·3 + s)·hs + d.
  for (int s = 0; s < 3; ++s)
    for (int j = 0; j < c.heads; ++j)
      for (int d = 0; d < hs; ++d)
        for (int k = 0; k < C; ++k)
          ASSERT_EQ(g[size_t((s * c.heads + j) * hs + d) * C + k],
                    parts[0][size_t((j * 3 + s) * hs + d) * C + k]);
  EXPECT_EQ(hf::to_hf(m, g), parts);
  const hf::TensorMap& b = find(maps, "h0.qkvb");
  const auto bias = numbered_parts(b);
  const std::vector<float> gb = hf::to_trident(b, bias);
  EXPECT_EQ(gb[size_t(1 * c.heads + 2) * hs + 3],
            bias[0][size_t(2 * 3 + 1) * hs + 3]);  // k, head 2
  EXPECT_EQ(hf::to_hf(b, gb), bias);
}

TEST(HfNames, LlamaProjectionsStackAndGpt2Conv1DTransposes) {
  const GPTConfig c = family_config(Family::kLlama);
  const auto maps = hf::tensor_maps(c);
  const hf::TensorMap& qkv = find(maps, "h0.qkvw");
  ASSERT_EQ(qkv.hf.size(), 3u);
  EXPECT_EQ(qkv.hf[1], "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(qkv.hf_shape[1], (std::vector<int64_t>{2 * 8, 32}));  // kv heads 2, head size 8
  EXPECT_EQ(qkv.global_shape, (std::vector<int>{(4 + 2 * 2) * 8, 32}));
  const auto parts = numbered_parts(qkv);
  const std::vector<float> g = hf::to_trident(qkv, parts);
  EXPECT_EQ(g[32 * 32], parts[1][0]);      // k starts after q's 32 rows
  EXPECT_EQ(g[48 * 32 + 5], parts[2][5]);  // v after k's 16
  EXPECT_EQ(hf::to_hf(qkv, g), parts);
  const hf::TensorMap& fc = find(maps, "h1.fcw");
  EXPECT_EQ(fc.hf, (std::vector<std::string>{"model.layers.1.mlp.gate_proj.weight",
                                             "model.layers.1.mlp.up_proj.weight"}));
  EXPECT_EQ(fc.global_shape, (std::vector<int>{96, 32}));
  // No biases, no LayerNorm shifts, no wpe; an untied head of the real vocabulary's rows.
  for (const hf::TensorMap& m : maps)
    EXPECT_EQ(m.trident.find('b', m.trident.size() - 1), std::string::npos) << m.trident;
  const hf::TensorMap& head = find(maps, "lmw");
  EXPECT_EQ(head.hf_shape[0], (std::vector<int64_t>{50, 32}));
  EXPECT_EQ(head.global_shape, (std::vector<int>{128, 32}));
  const std::vector<float> padded = hf::to_trident(head, numbered_parts(head));
  for (size_t i = 50 * 32; i < padded.size(); ++i) ASSERT_EQ(padded[i], 0.0f);

  const GPTConfig g2 = family_config(Family::kGPT2);
  const auto maps2 = hf::tensor_maps(g2);
  const hf::TensorMap& fcg = find(maps2, "h0.fcw");
  EXPECT_EQ(fcg.hf_shape[0], (std::vector<int64_t>{32, 128}));  // Conv1D: [in, out]
  const auto conv = numbered_parts(fcg);
  const std::vector<float> t = hf::to_trident(fcg, conv);
  EXPECT_EQ(t[5 * 32 + 7], conv[0][7 * 128 + 5]);
  EXPECT_EQ(hf::to_hf(fcg, t), conv);
}

TEST(HfConfig, EachFamilyReadsBackWhatExportWrites) {
  for (Family f : {Family::kGPT2, Family::kNeoX, Family::kLlama}) {
    GPTConfig c = family_config(f);
    if (f == Family::kNeoX) c.tied_head = true;  // a non-default, written explicitly
    const nlohmann::json j = hf::json_from_config(c);
    EXPECT_EQ(j["model_type"], hf::model_type(f));
    const GPTConfig r = hf::config_from_json(j, "config.json", GPTConfig{});
    EXPECT_EQ(describe_block(r), describe_block(c)) << j.dump();
    EXPECT_EQ(r.norm_eps, c.norm_eps);
    EXPECT_EQ(r.rope_base, c.rope_base);
    EXPECT_EQ(r.rotary_dims(), c.rotary_dims());
    EXPECT_EQ(r.layers, c.layers);
    EXPECT_EQ(r.max_seq_len, c.max_seq_len);
    EXPECT_EQ(r.padded_vocab, c.padded_vocab);
  }
  // The float as its shortest decimal: 1e-06, which reads back to the same float.
  EXPECT_EQ(hf::json_from_config(family_config(Family::kLlama))["rms_norm_eps"].dump(), "1e-06");
}

TEST(HfConfig, MixturesTransformersCannotHoldAreRefused) {
  GPTConfig c = family_config(Family::kLlama);
  c.bias = true;
  try {
    hf::json_from_config(c);
    FAIL() << "a Llama with biases was written";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    EXPECT_NE(std::string(e.what()).find("cannot be written as transformers' Llama"),
              std::string::npos)
        << e.what();
  }
  c = family_config(Family::kNeoX);
  c.activation = Activation::kSwiGLU;
  EXPECT_THROW(hf::json_from_config(c), Error);
}

}  // namespace
}  // namespace trident
