// Hugging Face checkpoints for the families (model/hf_config.cpp, hf_names.cpp,
// hf_checkpoint.cpp): config.json to and from GPTConfig, and transformers' tensors to and from
// trident's global tensors. Private to the model part. Mixtral is llama's family with experts
// (GPTConfig::has_moe()): its own model_type, the rest of the body as Llama's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trident/model_config.h"

namespace trident::hf {

// config.json's model_type for a config: "gpt2", "gpt_neox", "llama", "mixtral".
const char* model_type(const GPTConfig& c);
// As messages name the model: "GPT-2", "GPT-NeoX", "Llama", "Mixtral".
const char* display_name(const GPTConfig& c);

// The GPTConfig that config.json `j` (read from `path`) describes: the family's defaults as
// transformers 4.36 has them, then the file's keys. input_error naming the path and the key for
// what trident does not implement (another model_type, rope_scaling, attention or MLP biases
// the family does not have, an activation, head_dim != hidden_size / heads, ...). GPT-2's shape
// keys default to `gpt2_shape` (the shape its tensors imply) rather than to GPT-2 small's.
// mixtral: Note [Mixtral's config].
GPTConfig config_from_json(const nlohmann::json& j, const std::string& path,
                           const GPTConfig& gpt2_shape);

// config.json for `cfg` (export), which transformers' from_pretrained loads as
// GPT2LMHeadModel, GPTNeoXForCausalLM, LlamaForCausalLM or MixtralForCausalLM; input_error
// naming what the family's transformers class cannot express (e.g. a Llama with biases, a
// mixture with shared experts).
nlohmann::json json_from_config(const GPTConfig& cfg);

// How a trident tensor is stored by transformers (Note [Hugging Face tensors]).
enum class Layout {
  kSame,      // the same [out, in] rows (or vector)
  kConv1D,    // GPT-2's Conv1D: [in, out], the transpose
  kNeoxQkv,   // GPT-NeoX's query_key_value: rows per head [NH, 3, hs] → q | k | v
  kRowBlocks  // several tensors whose rows, one after another, are the trident tensor's
              // (Llama's q | k | v, gate | up; Mixtral's experts, expert after expert)
};

struct TensorMap {
  std::string trident;                         // "h0.qkvw"
  std::vector<int> global_shape;               // trident's global shape (wte, lmw: padded)
  std::vector<std::string> hf;                 // transformers' names, as save_pretrained writes
  std::vector<std::vector<int64_t>> hf_shape;  // each one's shape (embeddings: the real vocab)
  Layout layout = Layout::kSame;
  int heads = 0, head_size = 0;  // kNeoxQkv
};

// Every tensor of `cfg` in transformers' module order (the order export writes them).
std::vector<TensorMap> tensor_maps(const GPTConfig& cfg);

// The prefix of the model body's names ("transformer.", "gpt_neox.", "model."), which readers
// also accept without (the hub's gpt2 has none).
const char* body_prefix(Family f);

// Buffers some transformers versions saved with the weights (causal masks, RoPE's inv_freq),
// which carry no parameter: readers skip them. `bare`: the name without the body prefix.
bool is_buffer(Family f, const std::string& bare);

// The trident global tensor (row-major, padded vocabulary rows zero) from transformers'
// tensors `parts` (one per m.hf, fp32, in their shapes), and back.
std::vector<float> to_trident(const TensorMap& m, const std::vector<std::vector<float>>& parts);
std::vector<std::vector<float>> to_hf(const TensorMap& m, const std::vector<float>& global);

}  // namespace trident::hf
