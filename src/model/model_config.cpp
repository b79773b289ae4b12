// The families' defaults, the block's checks and the FLOP count (trident/model_config.h).
#include <fmt/format.h>

#include <cmath>

#include "trident/check.h"
#include "trident/model_config.h"

namespace trident {

void GPTConfig::apply_family(Family f) {
  family = f;
  norm_eps = 1e-5f;
  rope_base = 10000.0f;
  mlp_hidden = 0;
  kv_heads = 0;
  moe = MoeConfig{};
  switch (f) {
    case Family::kGPT2:
      norm = Norm::kLayerNorm;
      position = Position::kLearned;
      rotary_pct = 1.0f;
      activation = Activation::kGeluTanh;
      bias = true;
      tied_head = true;
      parallel_residual = false;
      break;
    case Family::kNeoX:  // Pythia's and NeoX-20B's configs
      norm = Norm::kLayerNorm;
      position = Position::kRotary;
      rotary_pct = 0.25f;
      activation = Activation::kGeluErf;
      bias = true;
      tied_head = false;
      parallel_residual = true;
      break;
    case Family::kLlama:
      norm = Norm::kRMSNorm;
      position = Position::kRotary;
      rotary_pct = 1.0f;
      activation = Activation::kSwiGLU;
      bias = false;
      tied_head = false;
      parallel_residual = false;
      break;
  }
}

int GPTConfig::rotary_dims() const {
  if (position != Position::kRotary) return 0;
  return int(double(head_size()) * double(rotary_pct));  // transformers: int(hs · rotary_pct)
}

bool GPTConfig::is_gpt2_block() const {
  return norm == Norm::kLayerNorm && norm_eps == 1e-5f && position == Position::kLearned &&
         activation == Activation::kGeluTanh && hidden() == 4 * channels &&
         kv_head_count() == heads && bias && tied_head && !parallel_residual;
}

int GPTConfig::moe_layers() const {
  int n = 0;
  for (int l = 0; l < layers; ++l) n += is_moe(l) ? 1 : 0;
  return n;
}

double GPTConfig::matmul_params() const {
  const double C = channels, L = layers, hs = head_size();
  const double qkv = C * (heads + 2.0 * kv_head_count()) * hs, attproj = C * heads * hs;
  const double mlp = C * fc_rows() + double(hidden()) * C;
  const double Fe = expert_width(), Fs = shared_width();
  const double moe_mlp = C * moe.experts + moe.top_k * C * (fc_rows_of(int(Fe)) + Fe) +
                         (Fs > 0 ? C * (fc_rows_of(int(Fs)) + Fs) : 0.0) +
                         (moe.shared_gate && Fs > 0 ? C : 0.0);
  const double M = moe_layers();
  // The head's matmul reads C·V weights whether they are wte's or its own.
  return L * (qkv + attproj) + (L - M) * mlp + M * moe_mlp + C * vocab;
}

double GPTConfig::train_flops_per_token(int T) const {
  return 6.0 * matmul_params() + 12.0 * layers * double(T) * heads * head_size();
}

double GPTConfig::llmc_flops_per_token(int T) const {
  return 6.0 * matmul_params() + 6.0 * layers * double(T) * heads * head_size();
}

const char* family_name(Family f) {
  switch (f) {
    case Family::kGPT2: return "gpt2";
    case Family::kNeoX: return "neox";
    case Family::kLlama: return "llama";
  }
  return "?";
}
const char* moe_router_name(MoeRouter r) {
  return r == MoeRouter::kSoftmax ? "softmax" : "sigmoid";
}
const char* moe_aux_name(MoeAux a) {
  return a == MoeAux::kNone ? "none" : a == MoeAux::kSwitch ? "switch" : "hf";
}
const char* norm_name(Norm n) { return n == Norm::kLayerNorm ? "layernorm" : "rmsnorm"; }
const char* position_name(Position p) { return p == Position::kLearned ? "learned" : "rotary"; }
const char* activation_name(Activation a) {
  switch (a) {
    case Activation::kGeluTanh: return "gelu_tanh";
    case Activation::kGeluErf: return "gelu_erf";
    case Activation::kSwiGLU: return "swiglu";
  }
  return "?";
}

std::string describe_block(const GPTConfig& c) {
  std::string position = c.position == Position::kLearned
                             ? std::string("learned positions")
                             : fmt::format("rotary {}% base {:g}",
                                           std::lround(100.0 * c.rotary_pct), double(c.rope_base));
  std::string out = fmt::format(
      "{}: {} eps {:g}, {}, {} {}, kv_heads {}, {}, {} head, {} residual", family_name(c.family),
      norm_name(c.norm), double(c.norm_eps), position, activation_name(c.activation), c.hidden(),
      c.kv_head_count(), c.bias ? "biases" : "no bias", c.tied_head ? "tied" : "untied",
      c.parallel_residual ? "parallel" : "sequential");
  if (!c.has_moe()) return out;
  const MoeConfig& m = c.moe;
  out += fmt::format("; experts {} top {} width {} every {} ({} layers), router {}{}", m.experts,
                     m.top_k, c.expert_width(), m.every, c.moe_layers(), moe_router_name(m.router),
                     m.norm_topk ? "" : " unnormalised");
  if (m.aux_loss != MoeAux::kNone)
    out += fmt::format(", aux {} {:g}", moe_aux_name(m.aux_loss), double(m.aux_coeff));
  if (m.z_coeff > 0) out += fmt::format(", z-loss {:g}", double(m.z_coeff));
  if (m.capacity_factor > 0) out += fmt::format(", capacity {:g}", double(m.capacity_factor));
  if (m.shared_experts > 0)
    out += fmt::format(", shared {}{}", c.shared_width(), m.shared_gate ? " gated" : "");
  return out;
}

void check_model_config(const GPTConfig& c) {
  if (c.heads < 1 || c.channels % c.heads != 0)
    input_error("model.d_model {} is not a multiple of model.heads {}", c.channels, c.heads);
  const int kv = c.kv_head_count();
  if (c.kv_heads < 0 || kv > c.heads || c.heads % kv != 0)
    input_error("model.kv_heads {} must divide model.heads {} (each kv head serves a whole "
                "group of query heads)",
                c.kv_heads, c.heads);
  if (c.mlp_hidden < 0) input_error("model.mlp_hidden {} is negative", c.mlp_hidden);
  if (!(c.norm_eps > 0.0f)) input_error("model.norm_eps {} must be > 0", double(c.norm_eps));
  if (c.norm == Norm::kLayerNorm && c.norm_eps != 1e-5f)
    input_error("model.norm_eps {:g} with model.norm layernorm: trident's LayerNorm has eps "
                "1e-5 only (RMSNorm takes any)",
                double(c.norm_eps));
  if (c.has_moe()) {
    const MoeConfig& m = c.moe;
    if (m.experts > 256) input_error("model.moe.experts {} exceeds 256", m.experts);
    if (m.top_k < 1 || m.top_k > m.experts)
      input_error("model.moe.top_k {} must be in [1, model.moe.experts {}]", m.top_k, m.experts);
    if (m.every < 1) input_error("model.moe.every {} must be >= 1", m.every);
    if (m.ffn_width < 0) input_error("model.moe.ffn_width {} is negative", m.ffn_width);
    if (m.shared_experts < 0)
      input_error("model.moe.shared_experts {} is negative", m.shared_experts);
    if (m.shared_gate && m.shared_experts == 0)
      input_error("model.moe.shared_gate needs model.moe.shared_experts > 0");
    if (m.capacity_factor < 0)
      input_error("model.moe.capacity_factor {:g} is negative", double(m.capacity_factor));
    if (m.router == MoeRouter::kSigmoid && m.aux_loss != MoeAux::kNone)
      input_error("model.moe.aux_loss {} with model.moe.router sigmoid: the sigmoid router "
                  "balances by its choice bias (DeepSeek-V3's loss-free balancing); set "
                  "model.moe.aux_loss none",
                  moe_aux_name(m.aux_loss));
    if (m.router == MoeRouter::kSigmoid && m.z_coeff > 0)
      input_error("model.moe.z_loss with model.moe.router sigmoid: the z-loss is a softmax "
                  "router's (ST-MoE); set it to 0");
  }
  if (c.position == Position::kRotary) {
    if (!(c.rotary_pct > 0.0f && c.rotary_pct <= 1.0f))
      input_error("model.rotary_pct {:g} must be in (0, 1]", double(c.rotary_pct));
    if (!(c.rope_base > 1.0f)) input_error("model.rope_base {:g} must be > 1", double(c.rope_base));
    const int rot = c.rotary_dims();
    if (rot < 2 || rot % 2 != 0)
      input_error("model.rotary_pct {:g} of head size {} (model.d_model / model.heads) rotates {} "
                  "dimensions: RoPE needs an even number, at least 2",
                  double(c.rotary_pct), c.head_size(), rot);
  }
}

}  // namespace trident
