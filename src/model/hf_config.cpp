// config.json to and from GPTConfig for transformers' gpt2, gpt_neox, llama and mixtral
// (model/hf_checkpoint.h).
//
// Note [config.json keys]
// A config.json is read as from_pretrained reads it: the transformers 4.36 class's defaults,
// then the file's keys; a key trident cannot honour is refused by name rather than ignored, so
// a model never silently runs as something else. Keys that change no number (dropout, ids,
// use_cache, initializer_range, torch_dtype) are ignored. Export writes every key the block
// depends on explicitly, so a reader need not know the defaults.
#include <fmt/format.h>

#include <cmath>
#include <optional>
#include <string>

#include "model/hf_checkpoint.h"
#include "trident/check.h"

namespace trident::hf {
namespace {

using nlohmann::json;

// One config.json being read: typed access to its keys, each problem naming the path and key.
struct Keys {
  const json& j;
  const std::string& path;

  bool has(const char* key) const { return j.contains(key) && !j[key].is_null(); }

  [[noreturn]] void refuse(const char* key, const std::string& why) const {
    input_error("model.init_from: {}: {} {}: {}", path, key, has(key) ? j[key].dump() : "null",
                why);
  }

  int integer(const char* key, int fallback, int min = 1) const {
    if (!has(key)) return fallback;
    const json& v = j[key];
    if (!v.is_number_integer() || v.get<long long>() < min || v.get<long long>() > (1 << 30))
      refuse(key, fmt::format("not an integer >= {}", min));
    return int(v.get<long long>());
  }
  double number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    if (!j[key].is_number()) refuse(key, "not a number");
    return j[key].get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!j[key].is_boolean()) refuse(key, "not true or false");
    return j[key].get<bool>();
  }
  std::string text(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!j[key].is_string()) refuse(key, "not a string");
    return j[key].get<std::string>();
  }
  // A key that must keep the value trident implements.
  void require(const char* key, const json& want, const std::string& why) const {
    if (has(key) && j[key] != want) refuse(key, why);
  }
};

float as_float(const Keys& k, const char* key, double fallback) {
  const double v = k.number(key, fallback);
  if (!std::isfinite(v) || !(v > 0)) k.refuse(key, "must be a positive number");
  return float(v);
}

// GELU's spellings (transformers' ACT2FN) that trident computes, for GPT-2's and GPT-NeoX's MLP.
Activation gelu_kind(const Keys& k, const char* key, const std::string& fallback) {
  const std::string act = k.text(key, fallback);
  if (act == "gelu") return Activation::kGeluErf;
  if (act == "gelu_new" || act == "gelu_pytorch_tanh") return Activation::kGeluTanh;
  k.refuse(key, "not an activation trident implements for this model_type (gelu: exact erf; "
                "gelu_new or gelu_pytorch_tanh: tanh)");
}

void read_gpt2(const Keys& k, const GPTConfig& shape, GPTConfig& c) {
  c.apply_family(Family::kGPT2);
  c.vocab = k.integer("vocab_size", shape.vocab, 2);
  c.channels = k.integer("n_embd", shape.channels);
  c.layers = k.integer("n_layer", shape.layers);
  c.heads = k.integer("n_head", shape.heads);
  c.max_seq_len = k.integer("n_positions", shape.max_seq_len);
  c.mlp_hidden = k.integer("n_inner", 0);
  c.activation = gelu_kind(k, "activation_function", "gelu_new");
  c.norm_eps = as_float(k, "layer_norm_epsilon", 1e-5);
  c.tied_head = k.boolean("tie_word_embeddings", true);
  k.require("scale_attn_weights", true, "trident always scales attention by 1/sqrt(head size)");
  k.require("scale_attn_by_inverse_layer_idx", false, "trident does not scale by the layer index");
  k.require("add_cross_attention", false, "trident's blocks have no cross-attention");
}

void read_neox(const Keys& k, GPTConfig& c) {
  c.apply_family(Family::kNeoX);
  c.vocab = k.integer("vocab_size", 50432, 2);
  c.channels = k.integer("hidden_size", 6144);
  c.layers = k.integer("num_hidden_layers", 44);
  c.heads = k.integer("num_attention_heads", 64);
  c.mlp_hidden = k.integer("intermediate_size", 24576);
  c.max_seq_len = k.integer("max_position_embeddings", 2048);
  c.activation = gelu_kind(k, "hidden_act", "gelu");
  c.rotary_pct = float(k.number("rotary_pct", 0.25));
  c.rope_base = as_float(k, "rotary_emb_base", 10000.0);
  c.norm_eps = as_float(k, "layer_norm_eps", 1e-5);
  c.tied_head = k.boolean("tie_word_embeddings", false);
  c.parallel_residual = k.boolean("use_parallel_residual", true);
  // Later transformers can drop the attention's biases; trident's NeoX block has them all.
  k.require("attention_bias", true, "trident's GPT-NeoX has biases on every linear layer");
}

// transformers 4.36's defaults where LlamaConfig and MixtralConfig differ.
struct LlamaDefaults {
  int intermediate, kv_heads, positions;
  double eps, theta;
};

void read_llama(const Keys& k, const LlamaDefaults& d, GPTConfig& c) {
  c.apply_family(Family::kLlama);
  c.vocab = k.integer("vocab_size", 32000, 2);
  c.channels = k.integer("hidden_size", 4096);
  c.layers = k.integer("num_hidden_layers", 32);
  c.heads = k.integer("num_attention_heads", 32);
  c.kv_heads = k.integer("num_key_value_heads", d.kv_heads > 0 ? d.kv_heads : c.heads);
  c.mlp_hidden = k.integer("intermediate_size", d.intermediate);
  c.max_seq_len = k.integer("max_position_embeddings", d.positions);
  if (k.text("hidden_act", "silu") != "silu")
    k.refuse("hidden_act", "trident's Llama MLP is SwiGLU (silu) only");
  c.norm_eps = as_float(k, "rms_norm_eps", d.eps);
  c.rope_base = as_float(k, "rope_theta", d.theta);
  c.tied_head = k.boolean("tie_word_embeddings", false);
  k.require("attention_bias", false, "trident's Llama attention has no biases");
  k.require("mlp_bias", false, "trident's Llama MLP has no biases");
  if (k.has("head_dim") && k.integer("head_dim", 0) * c.heads != c.channels)
    k.refuse("head_dim", fmt::format("trident's head size is hidden_size / num_attention_heads "
                                     "= {} / {}",
                                     c.channels, c.heads));
}

// Note [Mixtral's config]
// MixtralForCausalLM (transformers 4.36) is Llama's block with every MLP a mixture: softmax
// router, top num_experts_per_tok of num_local_experts renormalised, dropless, each expert a
// SwiGLU of width intermediate_size (moe.ffn_width; mlp_hidden too: no dense layer is left).
// sliding_window (absent: 4096) masks keys that many positions back, which trident does not:
// null or at least max_position_embeddings (no sequence is longer) reads, less is refused.
// transformers adds the auxiliary loss only with output_router_logits true (default false):
// then moe.aux_loss hf, coefficient router_aux_loss_coef; else none (aux_coeff still set).
void read_mixtral(const Keys& k, GPTConfig& c) {
  read_llama(k, {14336, 8, 4096 * 32, 1e-5, 1e6}, c);
  MoeConfig& m = c.moe;
  m.experts = k.integer("num_local_experts", 8);
  m.top_k = k.integer("num_experts_per_tok", 2);
  m.ffn_width = c.mlp_hidden;
  m.every = 1;
  m.router = MoeRouter::kSoftmax;
  m.norm_topk = true;
  m.capacity_factor = 0.0f;
  m.aux_coeff = float(k.number("router_aux_loss_coef", 0.001));
  if (!std::isfinite(m.aux_coeff) || m.aux_coeff < 0)
    k.refuse("router_aux_loss_coef", "must be a number >= 0");
  // 4.36's own load_balancing_loss_func softmaxes the top-k logits only and comes out a
  // constant, experts / top_k, without a gradient; trident's hf form is the one later
  // transformers fixed it to (Note [Auxiliary losses] in src/model/moe.h).
  m.aux_loss = k.boolean("output_router_logits", false) ? MoeAux::kHF : MoeAux::kNone;
  // An absent key is transformers' default, 4096; null turns the window off.
  const bool no_window = k.j.contains("sliding_window") && k.j["sliding_window"].is_null();
  const int window = no_window ? 0 : k.integer("sliding_window", 4096);
  if (window > 0 && window < c.max_seq_len)
    input_error("model.init_from: {}: sliding_window {}: trident's attention has no sliding "
                "window: it must be null or at least max_position_embeddings ({})",
                k.path, k.has("sliding_window") ? std::to_string(window) : "absent (4096)",
                c.max_seq_len);
  if (k.has("router_jitter_noise") && k.number("router_jitter_noise", 0) != 0)
    k.refuse("router_jitter_noise", "trident's router adds no noise (must be 0)");
  k.require("norm_topk_prob", true, "Mixtral renormalises the top-k weights (must be true)");
}

// What config.json says a float is: the float's shortest decimal (1e-06, not 9.99999997e-07),
// which reads back to the same float.
double decimal(float v) { return std::stod(fmt::format("{}", v)); }

// Note [Mixtral's export]
// What changes the function MixtralForCausalLM computes is refused, naming the key: a dense
// layer among the mixtures (moe.every), the sigmoid router and its bias, unnormalised top-k
// weights, shared experts. What only shapes training is not the model's and transformers'
// Mixtral has no key for it: moe.aux_loss hf is written (output_router_logits true,
// router_aux_loss_coef), switch and the z-loss are left out, and the capacity, which drops
// choices in training, is left to transformers' dropless routing.
template <typename Cannot>
void check_mixtral_export(const GPTConfig& c, const Cannot& cannot) {
  const MoeConfig& m = c.moe;
  if (c.moe_layers() != c.layers)
    cannot(fmt::format("model.moe.every {} (Mixtral's every layer is a mixture)", m.every));
  if (m.router != MoeRouter::kSoftmax)
    cannot(fmt::format("model.moe.router {} (Mixtral's router is a softmax, without a bias)",
                       moe_router_name(m.router)));
  if (!m.norm_topk) cannot("model.moe.norm_topk false (Mixtral renormalises the top-k weights)");
  if (m.shared_experts > 0)
    cannot(fmt::format("model.moe.shared_experts {} (Mixtral has none)", m.shared_experts));
}

}  // namespace

const char* model_type(const GPTConfig& c) {
  switch (c.family) {
    case Family::kGPT2: return "gpt2";
    case Family::kNeoX: return "gpt_neox";
    case Family::kLlama: return c.has_moe() ? "mixtral" : "llama";
  }
  return "?";
}

const char* display_name(const GPTConfig& c) {
  switch (c.family) {
    case Family::kGPT2: return "GPT-2";
    case Family::kNeoX: return "GPT-NeoX";
    case Family::kLlama: return c.has_moe() ? "Mixtral" : "Llama";
  }
  return "?";
}

GPTConfig config_from_json(const json& j, const std::string& path, const GPTConfig& gpt2_shape) {
  if (!j.is_object()) input_error("model.init_from: {}: not a JSON object", path);
  const Keys k{j, path};
  if (!k.has("model_type"))
    input_error("model.init_from: {}: no \"model_type\" (trident reads gpt2, gpt_neox, llama, "
                "mixtral)",
                path);
  const std::string type = k.text("model_type", "");
  if (k.has("rope_scaling"))
    k.refuse("rope_scaling", "trident's RoPE has no scaling (rope_scaling must be null)");
  GPTConfig c;
  if (type == "gpt2") read_gpt2(k, gpt2_shape, c);
  else if (type == "gpt_neox") read_neox(k, c);
  else if (type == "llama") read_llama(k, {11008, 0, 2048, 1e-6, 10000.0}, c);
  else if (type == "mixtral") read_mixtral(k, c);
  else k.refuse("model_type", "not a model trident reads (gpt2, gpt_neox, llama, mixtral)");
  if (c.channels % c.heads != 0)
    input_error("model.init_from: {}: the width {} is not a multiple of the {} heads", path,
                c.channels, c.heads);
  if (c.norm == Norm::kLayerNorm && c.norm_eps != 1e-5f)
    input_error("model.init_from: {}: LayerNorm eps {:g} (layer_norm_eps / layer_norm_epsilon): "
                "trident's LayerNorm has eps 1e-5 only",
                path, double(c.norm_eps));
  c.padded_vocab = GPTConfig::pad_vocab(c.vocab);
  try {
    check_model_config(c);
  } catch (const Error& e) {
    input_error("model.init_from: {}: a {} config trident cannot run: {}", path, type, e.what());
  }
  return c;
}

json json_from_config(const GPTConfig& c) {
  const auto cannot = [&](const std::string& what) {
    input_error(
        "export: {} with {} cannot be written as transformers' {} ({}): {}", describe_block(c),
        what, display_name(c), model_type(c),
        c.has_moe() ? "a checkpoint keeps it" : "export --format llmc or a checkpoint keep it");
  };
  if (c.has_moe() && c.family != Family::kLlama)
    cannot(fmt::format("model.moe.experts {} (transformers' mixture is Mixtral, Llama's block)",
                       c.moe.experts));
  const bool tanh = c.activation == Activation::kGeluTanh;
  json j = {{"model_type", model_type(c)},
            {"vocab_size", c.vocab},
            {"tie_word_embeddings", c.tied_head},
            {"torch_dtype", "float32"}};
  switch (c.family) {
    case Family::kGPT2:
      if (c.norm != Norm::kLayerNorm || c.position != Position::kLearned ||
          c.activation == Activation::kSwiGLU || c.kv_head_count() != c.heads || !c.bias ||
          c.parallel_residual)
        cannot("a block other than GPT-2's");
      j.update({{"architectures", {"GPT2LMHeadModel"}},
                {"n_embd", c.channels},
                {"n_layer", c.layers},
                {"n_head", c.heads},
                {"n_positions", c.max_seq_len},
                {"n_ctx", c.max_seq_len},
                {"n_inner", c.hidden()},
                {"activation_function", tanh ? "gelu_new" : "gelu"},
                {"layer_norm_epsilon", decimal(c.norm_eps)}});
      break;
    case Family::kNeoX:
      if (c.norm != Norm::kLayerNorm || c.position != Position::kRotary ||
          c.activation == Activation::kSwiGLU || c.kv_head_count() != c.heads || !c.bias)
        cannot("a block other than GPT-NeoX's");
      j.update({{"architectures", {"GPTNeoXForCausalLM"}},
                {"hidden_size", c.channels},
                {"num_hidden_layers", c.layers},
                {"num_attention_heads", c.heads},
                {"intermediate_size", c.hidden()},
                {"max_position_embeddings", c.max_seq_len},
                {"hidden_act", tanh ? "gelu_new" : "gelu"},
                {"rotary_pct", double(c.rotary_pct)},  // exactly: int(hs · pct) must agree
                {"rotary_emb_base", decimal(c.rope_base)},
                {"layer_norm_eps", decimal(c.norm_eps)},
                {"use_parallel_residual", c.parallel_residual},
                {"rope_scaling", nullptr}});
      break;
    case Family::kLlama:
      if (c.norm != Norm::kRMSNorm || c.position != Position::kRotary || c.rotary_pct != 1.0f ||
          c.activation != Activation::kSwiGLU || c.bias || c.parallel_residual)
        cannot("a block other than Llama's");
      j.update({{"hidden_size", c.channels},
                {"num_hidden_layers", c.layers},
                {"num_attention_heads", c.heads},
                {"num_key_value_heads", c.kv_head_count()},
                {"max_position_embeddings", c.max_seq_len},
                {"hidden_act", "silu"},
                {"rms_norm_eps", decimal(c.norm_eps)},
                {"rope_theta", decimal(c.rope_base)}});
      if (c.has_moe()) {
        check_mixtral_export(c, cannot);
        j.update({{"architectures", {"MixtralForCausalLM"}},
                  {"intermediate_size", c.expert_width()},
                  {"num_local_experts", c.moe.experts},
                  {"num_experts_per_tok", c.moe.top_k},
                  {"sliding_window", nullptr},
                  {"output_router_logits", c.moe.aux_loss == MoeAux::kHF},
                  {"router_aux_loss_coef", decimal(c.moe.aux_coeff)}});
      } else {
        j.update({{"architectures", {"LlamaForCausalLM"}},
                  {"intermediate_size", c.hidden()},
                  {"rope_scaling", nullptr},
                  {"attention_bias", false}});
      }
      break;
  }
  return j;
}

}  // namespace trident::hf
