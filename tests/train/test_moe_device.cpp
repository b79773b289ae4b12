// The mixture of experts on a device backend (Note [Mixtures on a device] in
// src/train/model_options.cpp): trained on StrictDeviceBackend, whose memory the host cannot
// touch, a Mixtral-family model and a sigmoid-router model with a gated shared expert reach the
// mixture's state only through the ops (Note [Mixture ops]) and copies, and equal the CPU
// backend's run bit for bit: losses, gradient norms, weights, and the mixtures' figures.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "moe_run.h"
#include "strict_device_backend.h"
#include "trident/deck.h"
#include "trident/train.h"

namespace trident {
namespace {

// 2 layers of Llama's block, 4 experts of SwiGLU width 32, top 2; accum 2 so that the
// transformers-form totals and the sigmoid loads add over micro-batches.
Deck moe_deck(std::vector<std::string> keys) {
  const std::string yaml = R"(
model: {layers: 2, d_model: 32, heads: 4, kv_heads: 2, vocab: 256, seq_len: 16, family: mixtral,
        mlp_hidden: 64, moe: {experts: 4, top_k: 2, ffn_width: 32}}
train: {micro_batch: 2, accum: 2, steps: 4, lr: 3.0e-3, warmup_steps: 1, seed: 11,
        val_every: 2, val_batches: 1, grad_clip: 1.0}
data: {train: inputs/data/tiny-train.bin, valid: inputs/data/tiny-valid.bin, shuffle: true}
run: {threads: 1}
)";
  return parse_deck(yaml, TRIDENT_SOURCE_DIR, keys);
}

struct Case {
  const char* name;
  std::vector<std::string> keys;
  bool drops;  // capacity drops some choices in these steps
};

TEST(MoeDevice, MixturesTouchBackendMemoryOnlyThroughOpsAndCopies) {
  const std::vector<Case> cases = {
      // Mixtral: softmax, top-2 renormalised; transformers' load-balancing form (its counts in
      // backend memory), the z-loss, and capacity 1.0 dropping the overflow.
      {"mixtral_hf_z_capacity",
       {"model.moe.aux_loss=hf", "model.moe.aux_loss_coeff=0.02", "model.moe.z_loss=0.001",
        "model.moe.capacity_factor=1.0"},
       true},
      // DeepSeek-style: sigmoid scores with the choice bias and its step (no auxiliary loss),
      // a dense layer beside the mixture, a gated shared expert.
      {"sigmoid_shared",
       {"model.moe.router=sigmoid", "model.moe.bias_update_rate=0.01", "model.moe.every=2",
        "model.moe.shared_experts=1", "model.moe.shared_gate=true"},
       false},
      // Qwen2-MoE's softmax without renormalising, Megatron-Core's switch loss and the z-loss.
      {"softmax_unnormalised_switch_z",
       {"model.moe.norm_topk=false", "model.moe.aux_loss=switch", "model.moe.aux_loss_coeff=0.01",
        "model.moe.z_loss=0.001"},
       false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Deck d = moe_deck(c.keys);
    auto cpu = make_cpu_backend(1);
    testing::StrictDeviceBackend strict;
    const testing::MoeRun want = testing::run_moe(*cpu, d, TrainContext{nullptr, 1e9});
    const testing::MoeRun got = testing::run_moe(strict, d, TrainContext{nullptr, 1e9});
    testing::expect_same_moe_run(got, want);
    if (d.model.moe_aux_loss != "none") EXPECT_GT(want.aux.back(), 0.0);
    if (c.drops) EXPECT_GT(want.dropped.front() + want.dropped.back(), 0);
    // Note [Expert counts on the host]: one summary a mixture layer and micro-batch, beside
    // what a dense step reads (the loss, the norm).
    EXPECT_GE(got.copies_in_last_step, size_t(d.train.accum));
  }
}

// The routing summary is the only read per layer: a step's reads grow by one a mixture layer
// and micro-batch when the mixture layers double.
TEST(MoeDevice, OneRoutingReadPerLayerAndMicroBatch) {
  auto reads = [](int every) {
    testing::StrictDeviceBackend strict;
    Deck d = moe_deck({"model.moe.every=" + std::to_string(every), "model.moe.z_loss=0.001"});
    d.train.val_every = 0;
    Trainer t(d, TrainContext{&strict, 1e9});
    t.train_step(0);
    const size_t before = strict.copies_to_host();
    t.train_step(1);
    return strict.copies_to_host() - before;
  };
  const size_t two = reads(1), one = reads(2);  // 2 and 1 mixture layers
  EXPECT_EQ(two - one, 2u);                     // accum 2: one read per micro-batch
}

}  // namespace
}  // namespace trident
