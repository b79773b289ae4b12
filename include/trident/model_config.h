// The model's shape and its block: GPT-2's (2019), GPT-NeoX's or Llama's, or a mixture.
//
// A family (model.family) only sets defaults; every choice is its own field, so a mixture is a
// config like any other. What a family sets (GPTConfig::apply_family):
//
//            norm       position        mlp         kv_heads  bias  head    residual
//   gpt2     LayerNorm  learned         GELU tanh   heads     on    tied    sequential
//   neox     LayerNorm  rotary, 25%     GELU erf    heads     on    untied  parallel
//   llama    RMSNorm    rotary, 100%    SwiGLU      heads     off   untied  sequential
//
// Note [Block shapes]
// A block is norm1 → qkv → (RoPE) → attention → attproj, norm2 → fc → act → fcproj. qkv's
// rows are q | k | v with kv_heads key/value heads (heads % kv_heads == 0; query head h reads
// kv head h / (heads / kv_heads)), so qkvw is [(heads + 2·kv_heads)·hs, C]. SwiGLU's fc is
// gate | up, [2·hidden, C], and act(gate, up) = silu(gate)·up. Sequential: x += attn(norm1(x));
// x += mlp(norm2(x)). Parallel: x += attn(norm1(x)) + mlp(norm2(x)), both reading x.
#pragma once

#include <string>

namespace trident {

enum class Family { kGPT2, kNeoX, kLlama };
enum class Norm { kLayerNorm, kRMSNorm };
enum class Position { kLearned, kRotary };
enum class Activation { kGeluTanh, kGeluErf, kSwiGLU };
enum class MoeRouter { kSoftmax, kSigmoid };
enum class MoeAux { kNone, kSwitch, kHF };

// Note [Mixture of experts]
// A block's MLP may be a mixture (model.moe.*, Mixtral's and Megatron-Core's form): a router
// [E, C] scores every token, the top k experts (ties to the lower index) each run a SwiGLU or
// GELU MLP of width ffn_width on it, and the token's output is their sum weighted by the
// router's k weights. Experts have no biases; the router's bias (sigmoid) only chooses. Layer
// l is a mixture when l % every == 0 (Megatron's moe_layer_freq). Shared experts are one
// dense MLP of width shared_experts · ffn_width every token runs, optionally scaled by
// sigmoid(x · shgate) (Qwen2-MoE). `model.family: mixtral` is llama's block with 8 experts, top 2.
struct MoeConfig {
  int experts = 0;  // 0: every MLP is dense
  int top_k = 2;
  int ffn_width = 0;  // each expert's hidden width (SwiGLU: of gate and of up); 0: model.mlp_hidden
  int every = 1;
  MoeRouter router = MoeRouter::kSoftmax;
  bool norm_topk = true;           // the k weights renormalised to sum 1
  float bias_update_rate = 1e-3f;  // sigmoid: the choice bias's step (DeepSeek-V3's gamma)
  MoeAux aux_loss = MoeAux::kNone;
  float aux_coeff = 0.01f;
  float z_coeff = 0.0f;          // router z-loss (ST-MoE); 0: off
  float capacity_factor = 0.0f;  // 0: dropless (Note [Expert capacity] in src/model/moe.h)
  int shared_experts = 0;
  bool shared_gate = false;
  bool operator==(const MoeConfig&) const = default;
};

struct GPTConfig {
  int max_seq_len = 64;  // wpe rows (learned positions); the RoPE table's rows (rotary)
  int vocab = 256;       // real vocabulary
  int padded_vocab = 256;
  int layers = 4;
  int heads = 4;
  int channels = 128;

  Family family = Family::kGPT2;
  Norm norm = Norm::kLayerNorm;
  float norm_eps = 1e-5f;
  Position position = Position::kLearned;
  float rope_base = 10000.0f;
  float rotary_pct = 1.0f;  // the fraction of each head's dimensions that RoPE rotates
  Activation activation = Activation::kGeluTanh;
  int mlp_hidden = 0;     // the MLP's hidden width (SwiGLU: of gate and of up); 0: 4·channels
  int kv_heads = 0;       // key/value heads; 0: heads (multi-head), 1: multi-query
  bool bias = true;       // biases on the linear layers (and LayerNorm's shift)
  bool tied_head = true;  // the LM head's weight is wte
  bool parallel_residual = false;
  MoeConfig moe;

  // A family's defaults for every architecture field (the shape fields are left alone).
  void apply_family(Family f);

  int head_size() const { return channels / heads; }
  int kv_head_count() const { return kv_heads > 0 ? kv_heads : heads; }
  int hidden() const { return mlp_hidden > 0 ? mlp_hidden : 4 * channels; }
  // Rotated dimensions per head: int(head_size · rotary_pct) as transformers takes it; 0 with
  // learned positions.
  int rotary_dims() const;
  int qkv_rows() const { return (heads + 2 * kv_head_count()) * head_size(); }
  // fc's output rows: hidden, or 2·hidden for SwiGLU (gate | up).
  int fc_rows() const { return fc_rows_of(hidden()); }
  int fc_rows_of(int width) const { return activation == Activation::kSwiGLU ? 2 * width : width; }
  // Mixtures (Note [Mixture of experts]): whether block l's MLP is one, and the widths.
  bool is_moe(int layer) const { return moe.experts > 0 && layer % moe.every == 0; }
  bool has_moe() const { return moe.experts > 0; }
  int expert_width() const { return moe.ffn_width > 0 ? moe.ffn_width : hidden(); }
  int shared_width() const { return moe.shared_experts * expert_width(); }
  int moe_layers() const;
  bool has_wpe() const { return position == Position::kLearned; }
  bool norm_has_bias() const { return norm == Norm::kLayerNorm && bias; }
  // GPT-2's 2019 block exactly: the only one llm.c's format, the bf16 path and the CUDA
  // backend's fused ops know.
  bool is_gpt2_block() const;

  // Padded to a multiple of 128·tp, so every tp rank holds an equal, 128-aligned vocab slice.
  static int pad_vocab(int vocab, int tp = 1) {
    const int multiple = 128 * tp;
    return (vocab + multiple - 1) / multiple * multiple;
  }
  // Parameters taking part in matmuls (per block qkv, attproj, fc, fcproj; the LM head): the
  // FLOP count's N. GPT-2: 12·L·C² + C·V. A mixture counts its active parameters: the router,
  // top_k experts and the shared ones.
  double matmul_params() const;
  // Training FLOPs per token at sequence length T: 6·N_matmul + 12·L·T·C.
  double train_flops_per_token(int T) const;
  // llm.c's count, 6·N_matmul + 6·L·T·C (the attention FLOPs of a causal mask only), for
  // comparison with figures published with it.
  double llmc_flops_per_token(int T) const;
};

// Names as decks and config.json spell them ("gpt2", "neox", "llama"; "layernorm", ...).
const char* family_name(Family f);
const char* norm_name(Norm n);
const char* position_name(Position p);
const char* activation_name(Activation a);
const char* moe_router_name(MoeRouter r);
const char* moe_aux_name(MoeAux a);
// The architecture in one line, for the run's log ("llama: rmsnorm eps 1e-05, rotary 100% base
// 10000, swiglu 2048, kv_heads 4, no bias, untied head, sequential residual").
std::string describe_block(const GPTConfig& cfg);

// Refuses (input_error, exit 2, naming the keys) a config no block can have: kv_heads not
// dividing heads, an odd rotary dimension count, LayerNorm with an eps other than 1e-5, ...
// With tp > 1 also what tp cannot split (check_tensor_parallel in trident/model.h).
void check_model_config(const GPTConfig& cfg);

}  // namespace trident
