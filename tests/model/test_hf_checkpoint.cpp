// The Hugging Face conversions (model/hf_config.cpp, hf_names.cpp) without transformers: each
// layout's conversion against a hand-made index formula, back and forth; config.json written for
// each family and read back to the same config; mixtures transformers cannot hold refused;
// Mixtral's experts stacked expert after expert.
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

// Llama's block with 3 experts of width 24, top 2, in every layer.
GPTConfig mixtral_config() {
  GPTConfig c = family_config(Family::kLlama);
  c.moe.experts = 3;
  c.moe.top_k = 2;
  c.moe.ffn_width = 24;
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

TEST(HfNames, MixtralExpertsStackExpertAfterExpert) {
  const GPTConfig c = mixtral_config();
  const int C = c.channels, Fe = 24;
  const auto maps = hf::tensor_maps(c);
  for (const hf::TensorMap& m : maps)
    EXPECT_TRUE(m.trident.find("fc") == std::string::npos || m.trident.starts_with("h1.exp") ||
                m.trident.starts_with("h0.exp"))
        << m.trident << ": a dense MLP tensor in a mixture";
  const hf::TensorMap& router = find(maps, "h1.router");
  EXPECT_EQ(router.hf, std::vector<std::string>{"model.layers.1.block_sparse_moe.gate.weight"});
  EXPECT_EQ(router.global_shape, (std::vector<int>{3, C}));
  const hf::TensorMap& fc = find(maps, "h0.expfcw");
  ASSERT_EQ(fc.hf.size(), 6u);
  EXPECT_EQ(fc.hf[2], "model.layers.0.block_sparse_moe.experts.1.w1.weight");
  EXPECT_EQ(fc.hf[3], "model.layers.0.block_sparse_moe.experts.1.w3.weight");
  EXPECT_EQ(fc.hf_shape[3], (std::vector<int64_t>{Fe, C}));
  EXPECT_EQ(fc.global_shape, (std::vector<int>{3 * 2 * Fe, C}));
  const auto parts = numbered_parts(fc);
  const std::vector<float> g = hf::to_trident(fc, parts);
  // Expert e's rows [e·2Fe, (e+1)·2Fe): w1 (gate), then w3 (up).
  for (int e = 0; e < 3; ++e)
    for (int r = 0; r < Fe; ++r) {
      ASSERT_EQ(g[size_t(e * 2 * Fe + r) * C + 5], parts[size_t(2 * e)][size_t(r) * C + 5]);
      ASSERT_EQ(g[size_t(e * 2 * Fe + Fe + r) * C], parts[size_t(2 * e + 1)][size_t(r) * C]);
    }
  EXPECT_EQ(hf::to_hf(fc, g), parts);
  const hf::TensorMap& proj = find(maps, "h1.expfcprojw");
  ASSERT_EQ(proj.hf.size(), 3u);
  EXPECT_EQ(proj.hf[2], "model.layers.1.block_sparse_moe.experts.2.w2.weight");
  EXPECT_EQ(proj.hf_shape[0], (std::vector<int64_t>{C, Fe}));
  EXPECT_EQ(proj.global_shape, (std::vector<int>{3 * C, Fe}));
  const auto w2 = numbered_parts(proj);
  const std::vector<float> gp = hf::to_trident(proj, w2);
  EXPECT_EQ(gp[size_t(2 * C + 7) * Fe + 3], w2[2][size_t(7) * Fe + 3]);  // expert 2, row 7
  EXPECT_EQ(hf::to_hf(proj, gp), w2);
}

TEST(HfConfig, MixtralReadsBackWhatExportWritesAndRefusesWhatItCannotHold) {
  GPTConfig c = mixtral_config();
  c.mlp_hidden = 24;  // a reader sets the dense width to the experts' (no dense layer is left)
  c.moe.aux_loss = MoeAux::kHF;
  c.moe.aux_coeff = 0.02f;
  const nlohmann::json j = hf::json_from_config(c);
  EXPECT_EQ(j["model_type"], "mixtral");
  EXPECT_EQ(j["architectures"][0], "MixtralForCausalLM");
  EXPECT_EQ(j["intermediate_size"], 24);
  EXPECT_TRUE(j["sliding_window"].is_null());
  EXPECT_EQ(j["output_router_logits"], true);
  const GPTConfig r = hf::config_from_json(j, "config.json", GPTConfig{});
  EXPECT_EQ(describe_block(r), describe_block(c)) << j.dump();
  EXPECT_EQ(r.moe, c.moe);
  const auto refused = [](const nlohmann::json& config, const std::string& key) {
    try {
      hf::config_from_json(config, "config.json", GPTConfig{});
      ADD_FAILURE() << key << " was read";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::kBadInput);
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  };
  nlohmann::json w = j;
  w["sliding_window"] = 4;  // below max_position_embeddings 8
  refused(w, "sliding_window 4");
  w.erase("sliding_window");  // transformers' default, 4096, is no window for 8 positions
  EXPECT_EQ(hf::config_from_json(w, "config.json", GPTConfig{}).moe.experts, 3);
  w = j;
  w["router_jitter_noise"] = 0.1;
  refused(w, "router_jitter_noise");
  w = j;
  w["num_experts_per_tok"] = 4;
  refused(w, "top_k 4");
  for (const char* key : {"every", "router", "shared_experts", "norm_topk"}) {
    GPTConfig x = mixtral_config();
    if (std::string(key) == "every") x.moe.every = 2;
    if (std::string(key) == "router") x.moe.router = MoeRouter::kSigmoid;
    if (std::string(key) == "shared_experts") x.moe.shared_experts = 1;
    if (std::string(key) == "norm_topk") x.moe.norm_topk = false;
    try {
      hf::json_from_config(x);
      ADD_FAILURE() << "model.moe." << key << " was written";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("model.moe.") + key), std::string::npos)
          << e.what();
    }
  }
}

TEST(HfConfig, EachFamilyReadsBackWhatExportWrites) {
  for (Family f : {Family::kGPT2, Family::kNeoX, Family::kLlama}) {
    GPTConfig c = family_config(f);
    if (f == Family::kNeoX) c.tied_head = true;  // a non-default, written explicitly
    const nlohmann::json j = hf::json_from_config(c);
    EXPECT_EQ(j["model_type"], hf::model_type(c));
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
