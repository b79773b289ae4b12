// GPT-2: token + learned position embeddings, L pre-LN blocks (causal self-attention, 4C
// tanh-GELU MLP), final LayerNorm, LM head tied to the token embedding.
//
// Note [Parameter layout]: all parameters live in ONE flat buffer, laid out in the order their
// gradients become final during backward (the reverse of the forward/declaration order, as
// Megatron lays out its grad buffer): wte (its dense LM-head gradient comes first), lnf, then
// blocks L-1 … 0 (within a block: fcproj, fc, ln2, attproj, qkv, ln1 — again backward order),
// and wpe last. Gradients mirror the buffer, so a gradient bucket is an (offset, count) slice.
//
// The vocabulary is padded to a multiple of 128 (Vp); padded rows of wte start at zero, their
// logits are excluded from the softmax, so they never receive a gradient and stay zero.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "trident/backend.h"

namespace trident {

struct GPTConfig {
  int max_seq_len = 64;  // wpe rows
  int vocab = 256;       // real vocabulary
  int padded_vocab = 256;
  int layers = 4;
  int heads = 4;
  int channels = 128;

  static int pad_vocab(int vocab, int multiple = 128) {
    return (vocab + multiple - 1) / multiple * multiple;
  }
  // Parameters taking part in matmuls (12·L·C² + C·V): the FLOP count's N.
  double matmul_params() const;
  // Training FLOPs per token at sequence length T: 6·N_matmul + 12·L·T·C.
  double train_flops_per_token(int T) const;
};

struct ParamInfo {
  std::string name;        // llm.c name with block index, e.g. "h3.qkvw", "wte"
  std::vector<int> shape;
  size_t offset = 0;       // in floats, into the flat buffer
  size_t count = 0;
  bool decay = false;      // weight decay applies (matrices only; not biases or LayerNorm)
  int layer = -1;          // block index, -1 for embeddings and final LayerNorm
};

// The parameter list in ready (= buffer) order. Pure function of the config.
std::vector<ParamInfo> gpt_param_layout(const GPTConfig& cfg);

// Called by backward() with a parameter's index once its gradient is final.
using GradReadyFn = std::function<void(int param_index)>;

// Note [Tied embedding gradient]: wte gets two gradient contributions — a dense one from the
// LM head at the very start of backward and a sparse one (only the rows of the batch's tokens)
// at the very end. With an EmbeddingRowSink the sparse part goes into a compact [R, C] buffer
// instead (rows[k] is the gradient of token row_ids[k]; row_of_input[i] is the k of input i), so
// wte's dense gradient is final — and reported ready — right after the LM head, and a
// data-parallel reducer can all-reduce the 150 MB dense part while backward runs and the small
// compact buffer at the end. The caller adds the rows into wte's gradient afterwards.
struct EmbeddingRowSink {
  const int32_t* row_of_input = nullptr;  // [B*T]
  float* rows = nullptr;                  // [R, C], accumulated (+=)
};

// Receives the model's compute phases for a timeline: "forward block 3", "backward head", ...
using PhaseFn = std::function<void(const std::string& phase,
                                   std::chrono::steady_clock::time_point begin,
                                   std::chrono::steady_clock::time_point end)>;

class GPT {
 public:
  // B, T: the largest micro-batch this instance will run (activations are sized for it).
  GPT(const GPTConfig& cfg, Backend& backend, int B, int T);

  const GPTConfig& config() const { return cfg_; }
  const std::vector<ParamInfo>& params_info() const { return infos_; }
  float* params() { return params_.data(); }
  float* grads() { return grads_.data(); }
  size_t num_params() const { return params_.size(); }
  const ParamInfo& param(const std::string& name) const;

  // GPT-2 initialisation: N(0, 0.02); residual projections (attproj, fcproj) N(0, 0.02/√(2L));
  // LayerNorm weight 1; biases and padded vocabulary rows 0. A counter-based generator keyed by
  // (seed, parameter name, element index) makes it independent of thread count and layout.
  void init_weights(uint64_t seed);

  // Forward over inputs [B,T]; with targets it returns the mean cross-entropy loss over B·T
  // tokens (and keeps what backward needs), without it returns 0 and leaves logits.
  float forward(const int32_t* inputs, const int32_t* targets, int B, int T);
  // Backward of (dloss_scale × mean loss) of the last forward with targets. Gradients are
  // ACCUMULATED into grads() (so micro-batches add up); on_ready may be empty.
  // With `sink`, see Note [Tied embedding gradient].
  void backward(float dloss_scale, const GradReadyFn& on_ready = {},
                const EmbeddingRowSink* sink = nullptr);
  // Optional timeline of forward/backward phases (empty: none).
  void set_phase_recorder(PhaseFn fn) { phases_ = std::move(fn); }
  void zero_grads();

  // Logits [B,T,Vp] of the last forward without targets.
  const float* logits() const { return acts_.logits.data(); }

 private:
  struct Activations {
    std::vector<float> encoded, ln1, ln1_mean, ln1_rstd, qkv, att, atty, residual2, ln2,
        ln2_mean, ln2_rstd, fch, fch_gelu, residual3, lnf, lnf_mean, lnf_rstd, logits, losses;
    // backward scratch
    std::vector<float> dresidual, dbuf_c, dbuf_c2, dbuf_3c, dbuf_4c, dbuf_4c2, datt;
  };
  struct BlockWeights {
    float *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw,
        *fcprojb;
  };
  BlockWeights block(float* base, int l) const;
  float* at(float* base, const std::string& name) const;

  GPTConfig cfg_;
  Backend& be_;
  int maxB_, maxT_;
  std::vector<ParamInfo> infos_;
  std::vector<float> params_, grads_;
  Activations acts_;
  // last forward's shape and tokens
  int B_ = 0, T_ = 0;
  std::vector<int32_t> inputs_, targets_;
  PhaseFn phases_;
};

// llm.c's GPT-2 checkpoint (int32[256] header: magic 20240326, version 3, maxT, V, L, NH, C, Vp;
// then fp32 tensors in llm.c's order). read_llmc_config checks the header (input_error on any
// mismatch); load_llmc_weights copies the tensors into the model, whose config must match.
GPTConfig read_llmc_config(const std::string& path);
void load_llmc_weights(GPT& model, const std::string& path);
// Writes the model in the same format (tests, and handing weights to llm.c).
void save_llmc_weights(GPT& model, const std::string& path);

}  // namespace trident
