// transformers' tensor names and layouts for gpt2, gpt_neox, llama and mixtral, and the
// conversions to and from trident's global tensors (model/hf_checkpoint.h).
//
// Note [Hugging Face tensors]
// Trident's tensors are [out, in] row-major, qkv's rows q | k | v with each part head-major, and
// SwiGLU's fc gate | up. transformers stores some differently, converted both ways: GPT-2's
// Conv1D weights are [in, out]; GPT-NeoX's query_key_value rows go per head, [NH, 3, hs];
// Llama keeps q_proj, k_proj, v_proj and gate_proj, up_proj apart (their rows, in that order,
// are qkvw's and fcw's); Mixtral keeps each expert apart: expfcw's rows are, expert after
// expert, w1 (gate) then w3 (up), expfcprojw's w2 [C, Fe] (Note [Expert tensors]); router is
// block_sparse_moe.gate. Embedding and head rows are the real vocabulary; padded rows are zero.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "model/hf_checkpoint.h"
#include "trident/check.h"

namespace trident::hf {
namespace {

using Shape = std::vector<int64_t>;

// trident's per-block tensor, and transformers' name(s) for it after "<body>.<layers>.{l}.".
struct BlockTensor {
  const char* trident;
  std::vector<std::string> hf;
  Layout layout;
};

// Mixtral's mixture in place of Llama's MLP: the router, then the experts' tensors.
std::vector<BlockTensor> mixtral_tensors(const GPTConfig& c) {
  std::vector<std::string> fc, fcproj;
  for (int e = 0; e < c.moe.experts; ++e) {
    const std::string expert = fmt::format("block_sparse_moe.experts.{}.", e);
    fc.push_back(expert + "w1.weight");
    fc.push_back(expert + "w3.weight");
    fcproj.push_back(expert + "w2.weight");
  }
  return {{"router", {"block_sparse_moe.gate.weight"}, Layout::kSame},
          {"expfcw", fc, Layout::kRowBlocks},
          {"expfcprojw", fcproj, Layout::kRowBlocks}};
}

// Block l's tensors.
std::vector<BlockTensor> block_tensors(const GPTConfig& c, int l) {
  switch (c.family) {
    case Family::kGPT2:
      return {{"ln1w", {"ln_1.weight"}, Layout::kSame},
              {"ln1b", {"ln_1.bias"}, Layout::kSame},
              {"qkvw", {"attn.c_attn.weight"}, Layout::kConv1D},
              {"qkvb", {"attn.c_attn.bias"}, Layout::kSame},
              {"attprojw", {"attn.c_proj.weight"}, Layout::kConv1D},
              {"attprojb", {"attn.c_proj.bias"}, Layout::kSame},
              {"ln2w", {"ln_2.weight"}, Layout::kSame},
              {"ln2b", {"ln_2.bias"}, Layout::kSame},
              {"fcw", {"mlp.c_fc.weight"}, Layout::kConv1D},
              {"fcb", {"mlp.c_fc.bias"}, Layout::kSame},
              {"fcprojw", {"mlp.c_proj.weight"}, Layout::kConv1D},
              {"fcprojb", {"mlp.c_proj.bias"}, Layout::kSame}};
    case Family::kNeoX:
      return {{"ln1w", {"input_layernorm.weight"}, Layout::kSame},
              {"ln1b", {"input_layernorm.bias"}, Layout::kSame},
              {"ln2w", {"post_attention_layernorm.weight"}, Layout::kSame},
              {"ln2b", {"post_attention_layernorm.bias"}, Layout::kSame},
              {"qkvw", {"attention.query_key_value.weight"}, Layout::kNeoxQkv},
              {"qkvb", {"attention.query_key_value.bias"}, Layout::kNeoxQkv},
              {"attprojw", {"attention.dense.weight"}, Layout::kSame},
              {"attprojb", {"attention.dense.bias"}, Layout::kSame},
              {"fcw", {"mlp.dense_h_to_4h.weight"}, Layout::kSame},
              {"fcb", {"mlp.dense_h_to_4h.bias"}, Layout::kSame},
              {"fcprojw", {"mlp.dense_4h_to_h.weight"}, Layout::kSame},
              {"fcprojb", {"mlp.dense_4h_to_h.bias"}, Layout::kSame}};
    case Family::kLlama: {
      std::vector<BlockTensor> out = {
          {"qkvw",
           {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"},
           Layout::kRowBlocks},
          {"attprojw", {"self_attn.o_proj.weight"}, Layout::kSame}};
      if (c.is_moe(l)) {
        for (BlockTensor& b : mixtral_tensors(c)) out.push_back(std::move(b));
      } else {
        out.push_back({"fcw", {"mlp.gate_proj.weight", "mlp.up_proj.weight"}, Layout::kRowBlocks});
        out.push_back({"fcprojw", {"mlp.down_proj.weight"}, Layout::kSame});
      }
      out.push_back({"ln1w", {"input_layernorm.weight"}, Layout::kSame});
      out.push_back({"ln2w", {"post_attention_layernorm.weight"}, Layout::kSame});
      return out;
    }
  }
  return {};
}

// trident's global shape of block tensor `name` (model/trident.h's ParamInfo names).
std::vector<int> block_shape(const GPTConfig& c, const std::string& name) {
  const int C = c.channels, attn = c.heads * c.head_size();
  if (name == "qkvw") return {c.qkv_rows(), C};
  if (name == "qkvb") return {c.qkv_rows()};
  if (name == "attprojw") return {C, attn};
  if (name == "fcw") return {c.fc_rows(), C};
  if (name == "fcb") return {c.fc_rows()};
  if (name == "fcprojw") return {C, c.hidden()};
  const int E = c.moe.experts, Fe = c.expert_width();
  if (name == "router") return {E, C};
  if (name == "expfcw") return {E * c.fc_rows_of(Fe), C};
  if (name == "expfcprojw") return {E * C, Fe};
  return {C};  // norms and the row-parallel biases
}

// The shapes transformers gives the parts of trident tensor `global` laid out as `layout`.
std::vector<Shape> hf_shapes(const GPTConfig& c, const std::string& name, Layout layout,
                             const std::vector<int>& global) {
  if (layout == Layout::kConv1D) return {{global[1], global[0]}};
  if (layout != Layout::kRowBlocks) return {Shape(global.begin(), global.end())};
  const int64_t C = c.channels, hs = c.head_size();
  if (name == "qkvw")
    return {{c.heads * hs, C}, {c.kv_head_count() * hs, C}, {c.kv_head_count() * hs, C}};
  const int64_t Fe = c.expert_width();
  if (name == "expfcw") return std::vector<Shape>(size_t(2 * c.moe.experts), {Fe, C});
  if (name == "expfcprojw") return std::vector<Shape>(size_t(c.moe.experts), {C, Fe});
  return {{c.hidden(), C}, {c.hidden(), C}};  // fcw: gate, up
}

size_t numel(const Shape& s) {
  size_t n = 1;
  for (int64_t d : s) n *= size_t(d);
  return n;
}

// GPT-NeoX's query_key_value row of trident's q | k | v row `r` (heads × hs rows each part).
size_t neox_row(size_t r, int heads, int hs) {
  const size_t part = r / (size_t(heads) * hs), within = r % (size_t(heads) * hs);
  const size_t head = within / hs, d = within % hs;
  return (head * 3 + part) * hs + d;
}

}  // namespace

const char* body_prefix(Family f) {
  switch (f) {
    case Family::kGPT2: return "transformer.";
    case Family::kNeoX: return "gpt_neox.";
    case Family::kLlama: return "model.";
  }
  return "";
}

bool is_buffer(Family f, const std::string& bare) {
  const auto ends = [&](const std::string& tail) {
    return bare.size() > tail.size() &&
           bare.compare(bare.size() - tail.size(), tail.size(), tail) == 0;
  };
  switch (f) {
    case Family::kGPT2:
      return bare.starts_with("h.") && (ends(".attn.bias") || ends(".attn.masked_bias"));
    case Family::kNeoX:
      return bare.starts_with("layers.") &&
             (ends(".attention.bias") || ends(".attention.masked_bias") ||
              ends(".attention.rotary_emb.inv_freq"));
    case Family::kLlama:
      return bare.starts_with("layers.") && ends(".self_attn.rotary_emb.inv_freq");
  }
  return false;
}

std::vector<TensorMap> tensor_maps(const GPTConfig& c) {
  const std::string body = body_prefix(c.family);
  const int C = c.channels;
  const Shape vocab_rows = {c.vocab, C};
  std::vector<TensorMap> out;
  const auto add = [&](const std::string& trident, std::vector<int> global,
                       std::vector<std::string> hf, std::vector<Shape> shapes, Layout layout) {
    TensorMap m{trident, std::move(global), std::move(hf), std::move(shapes), layout};
    m.heads = c.heads;
    m.head_size = c.head_size();
    out.push_back(std::move(m));
  };
  const char* embed = c.family == Family::kGPT2   ? "wte.weight"
                      : c.family == Family::kNeoX ? "embed_in.weight"
                                                  : "embed_tokens.weight";
  add("wte", {c.padded_vocab, C}, {body + embed}, {vocab_rows}, Layout::kSame);
  if (c.has_wpe())
    add("wpe", {c.max_seq_len, C}, {body + "wpe.weight"}, {{c.max_seq_len, C}}, Layout::kSame);
  const char* layers = c.family == Family::kGPT2 ? "h" : "layers";
  TRIDENT_CHECK(!c.has_moe() || c.family == Family::kLlama,
                "a {} with experts has no Hugging Face names (Mixtral is Llama's block)",
                family_name(c.family));
  for (int l = 0; l < c.layers; ++l)
    for (const BlockTensor& b : block_tensors(c, l)) {
      const std::string name = b.trident;
      if (!c.bias && (name == "qkvb" || name == "attprojb" || name == "fcb" || name == "fcprojb"))
        continue;
      if (!c.norm_has_bias() && (name == "ln1b" || name == "ln2b")) continue;
      std::vector<std::string> hf;
      for (const std::string& part : b.hf)
        hf.push_back(fmt::format("{}{}.{}.{}", body, layers, l, part));
      const std::vector<int> global = block_shape(c, name);
      add(fmt::format("h{}.{}", l, name), global, hf, hf_shapes(c, name, b.layout, global),
          b.layout);
    }
  const std::string final_norm = c.family == Family::kGPT2   ? "ln_f"
                                 : c.family == Family::kNeoX ? "final_layer_norm"
                                                             : "norm";
  add("lnfw", {C}, {body + final_norm + ".weight"}, {{C}}, Layout::kSame);
  if (c.norm_has_bias()) add("lnfb", {C}, {body + final_norm + ".bias"}, {{C}}, Layout::kSame);
  if (!c.tied_head)
    add("lmw", {c.padded_vocab, C},
        {c.family == Family::kNeoX ? "embed_out.weight" : "lm_head.weight"}, {vocab_rows},
        Layout::kSame);
  return out;
}

std::vector<float> to_trident(const TensorMap& m, const std::vector<std::vector<float>>& parts) {
  TRIDENT_CHECK(parts.size() == m.hf.size(), "{}: {} parts for {} names", m.trident, parts.size(),
                m.hf.size());
  const size_t rows = size_t(m.global_shape[0]);
  const size_t cols = m.global_shape.size() > 1 ? size_t(m.global_shape[1]) : 1;
  std::vector<float> g(rows * cols, 0.0f);  // rows past the file's (padded vocabulary) stay zero
  switch (m.layout) {
    case Layout::kSame:
    case Layout::kRowBlocks: {
      size_t at = 0;
      for (const std::vector<float>& p : parts) {
        TRIDENT_CHECK(at + p.size() <= g.size(), "{}: parts overrun the tensor", m.trident);
        std::copy(p.begin(), p.end(), g.begin() + std::ptrdiff_t(at));
        at += p.size();
      }
      break;
    }
    case Layout::kConv1D:  // [cols, rows] → [rows, cols]
      for (size_t r = 0; r < rows; ++r)
        for (size_t k = 0; k < cols; ++k) g[r * cols + k] = parts[0][k * rows + r];
      break;
    case Layout::kNeoxQkv:
      for (size_t r = 0; r < rows; ++r) {
        const size_t from = neox_row(r, m.heads, m.head_size);
        std::copy_n(parts[0].begin() + std::ptrdiff_t(from * cols), cols,
                    g.begin() + std::ptrdiff_t(r * cols));
      }
      break;
  }
  return g;
}

std::vector<std::vector<float>> to_hf(const TensorMap& m, const std::vector<float>& g) {
  const size_t rows = size_t(m.global_shape[0]);
  const size_t cols = m.global_shape.size() > 1 ? size_t(m.global_shape[1]) : 1;
  TRIDENT_CHECK(g.size() == rows * cols, "{}: {} values for a [{} x {}] tensor", m.trident,
                g.size(), rows, cols);
  std::vector<std::vector<float>> parts;
  switch (m.layout) {
    case Layout::kSame:
    case Layout::kRowBlocks: {
      size_t at = 0;
      for (const Shape& s : m.hf_shape) {  // the embeddings: the real vocabulary's rows only
        parts.emplace_back(g.begin() + std::ptrdiff_t(at),
                           g.begin() + std::ptrdiff_t(at + numel(s)));
        at += numel(s);
      }
      break;
    }
    case Layout::kConv1D:
      parts.emplace_back(g.size());
      for (size_t r = 0; r < rows; ++r)
        for (size_t k = 0; k < cols; ++k) parts[0][k * rows + r] = g[r * cols + k];
      break;
    case Layout::kNeoxQkv:
      parts.emplace_back(g.size());
      for (size_t r = 0; r < rows; ++r)
        std::copy_n(g.begin() + std::ptrdiff_t(r * cols), cols,
                    parts[0].begin() + std::ptrdiff_t(neox_row(r, m.heads, m.head_size) * cols));
      break;
  }
  return parts;
}

}  // namespace trident::hf
