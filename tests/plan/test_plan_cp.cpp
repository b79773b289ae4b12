// Context parallelism in the plan model (Note [Plan context parallelism] in src/plan/model.cpp,
// Note [Plan attention state] in src/plan/memory.cpp): activations per rank at cp 2 against cp
// 1, the exchange buffers, ring against allgather on a slow link, the layouts refused, and the
// search proposing cp for a 128K-token Llama-1B and not for 2K tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "plan/plan_parts.h"
#include "plan_test_util.h"
#include "trident/backend.h"
#include "trident/check.h"

namespace trident {
namespace {

// inputs/llama-1b.yaml (16 layers, d_model 2048, 32 heads of 64, 8 kv heads, SwiGLU 8192) at
// seq_len T.
PlanModel llama_1b(int T) {
  const Deck deck = load_deck(std::string(TRIDENT_SOURCE_DIR) + "/inputs/llama-1b.yaml",
                              {"model.seq_len=" + std::to_string(T)});
  return PlanModel::from_deck(deck);
}

Hardware h100() {
  return load_hardware(std::string(TRIDENT_SOURCE_DIR) + "/inputs/hardware/dgx-h100.yaml");
}

PlanLayout layout(int dp, int cp, const std::string& comm = "ring") {
  PlanLayout l;
  l.dp = dp, l.cp = cp, l.cp_comm = comm, l.micro_batch = 1, l.recompute = "none";
  return l;
}

using testing::term;

// Every activation is per token, and the saved attention state is one float per row and head
// (rounded up to 4 floats): cp 2 holds half. Tolerance 0.1%, for that rounding.
TEST(PlanCp, ActivationsHalveAtCp2) {
  const PlanModel m = llama_1b(16384);
  const Hardware hw = h100();
  const double one = term(memory_terms(m, layout(1, 1), hw), "activations");
  const double two = term(memory_terms(m, layout(1, 2), hw), "activations");
  ASSERT_GT(one, 0);
  EXPECT_NEAR(two / one, 0.5, 0.001);
}

// The exchange buffers: a device's grouped ring's two K/V pairs, a dK/dV block and the received
// one, 6·kv; allgather's own K/V, the received dK/dV and the whole sequence of K/V and of dK/dV,
// (2 + 2·cp)·kv; kv = 2·(T/cp)·KVH·hd elements, fp32 (CpAttention's) in a bf16 run too.
TEST(PlanCp, RingAndAllgatherBuffers) {
  const PlanModel m = llama_1b(16384);
  const Hardware hw = h100();
  const double cp = 4, kv = 2 * (16384 / cp) * 8 * 64 * 4;  // bytes
  const double ring = term(memory_terms(m, layout(1, 4, "ring"), hw), "scratch");
  const double gather = term(memory_terms(m, layout(1, 4, "allgather"), hw), "scratch");
  EXPECT_DOUBLE_EQ(gather - ring, (2 * cp - 4) * kv);
}

// On NVLink a ring step's K/V transfer hides under its block of attention, where gathering is
// exposed. On slower links (InfiniBand's 46 GB/s down to 5 GB/s, 131072 tokens) the ring still
// exposes no more than allgather. Not on links so slow that nothing hides (1 GB/s): the ring's
// backward moves dK/dV with K/V, 11 blocks to allgather's 9 at cp 4 (docs/plan.md).
TEST(PlanCp, RingExposesNoMoreThanAllgatherOnSlowLinks) {
  const PlanModel m = llama_1b(131072);
  Hardware hw = h100();
  const Prediction fast_ring = predict(m, layout(1, 4, "ring"), hw);
  EXPECT_EQ(fast_ring.term("cp_comm_exposed"), 0);
  EXPECT_GT(fast_ring.term("cp_comm_hidden_s"), 0);
  EXPECT_GT(predict(m, layout(1, 4, "allgather"), hw).term("cp_comm_exposed"), 0);
  for (double gbytes_per_s : {46.0, 10.0, 5.0}) {
    hw.intra_node = {gbytes_per_s, 5};
    const Prediction ring = predict(m, layout(1, 4, "ring"), hw);
    const Prediction gather = predict(m, layout(1, 4, "allgather"), hw);
    EXPECT_GT(gather.term("cp_comm_exposed"), 0) << gbytes_per_s;
    EXPECT_LE(ring.term("cp_comm_exposed"), gather.term("cp_comm_exposed")) << gbytes_per_s;
    EXPECT_LT(ring.step_s, gather.step_s) << gbytes_per_s;
  }
  hw.intra_node = {1, 5};
  EXPECT_GT(predict(m, layout(1, 4, "ring"), hw).term("cp_comm_exposed"),
            predict(m, layout(1, 4, "allgather"), hw).term("cp_comm_exposed"));
}

// A bf16 run widens q|k|v before cp's attention (Note [Widening at the bf16 boundary]), so K/V
// and dK/dV travel in fp32. allgather by hand: per layer two all-gathers and a reduce-scatter
// of cp·kv bytes, kv = 2·(T/cp)·KVH·hd·4, each (cp−1)/cp of it at 100 GB/s without latency, all
// exposed; 16 layers, one micro-batch. The same in fp32 (at 2 B a bf16 run would show half).
TEST(PlanCp, ExchangeTravelsInFp32InBf16) {
  const PlanModel m = llama_1b(16384);
  Hardware hw = h100();
  hw.intra_node = {100, 0};
  const double cp = 4, kv = 2 * (16384 / cp) * 8 * 64 * 4.0;
  const double one = (cp - 1) / cp * (cp * kv) / 100e9;
  const Prediction bf16 = predict(m, layout(1, 4, "allgather"), hw);
  ASSERT_TRUE(bf16.fits) << bf16.why_not;
  EXPECT_NEAR(bf16.term("cp_comm_exposed"), 16 * 3 * one, 1e-12);
  hw.dtype = "fp32";
  EXPECT_NEAR(predict(m, layout(1, 4, "allgather"), hw).term("cp_comm_exposed"), 16 * 3 * one,
              1e-12);
}

// cp ranks hold the same parameters: the gradient reduction runs over dp·cp ranks, so dp 1 ×
// cp 2 reduces as dp 2 × cp 1 does (both inside a node).
TEST(PlanCp, GradientsReduceOverDpTimesCp) {
  const PlanModel m = llama_1b(16384);
  const Hardware hw = h100();
  const Prediction cp2 = predict(m, layout(1, 2), hw);
  const Prediction dp2 = predict(m, layout(2, 1), hw);
  EXPECT_GT(cp2.term("dp_reduce_s"), 0);
  EXPECT_DOUBLE_EQ(cp2.term("dp_reduce_s"), dp2.term("dp_reduce_s"));
}

TEST(PlanCp, RefusesSequencesThatDoNotSplitIn2Cp) {
  const PlanModel m = llama_1b(2048);
  const Prediction p = predict(m, layout(1, 3), h100());  // 2048 % 6 != 0
  EXPECT_FALSE(p.fits);
  EXPECT_EQ(p.step_s, 0);
  EXPECT_NE(p.why_not.find("not a multiple of 2·cp = 6"), std::string::npos) << p.why_not;
  EXPECT_TRUE(predict(m, layout(1, 4), h100()).why_not.empty());
  EXPECT_THROW(parse_layout("dp=1,cp=2,cp_comm=tree", 0), Error);
  PlanLayout bad = layout(1, 2);
  bad.cp_comm = "tree";
  EXPECT_NE(predict(m, bad, h100()).why_not.find("cp_comm"), std::string::npos);
}

// The CPU's T×T attention below kBlockwiseAttentionFromT, blockwise from it and under cp.
TEST(PlanCp, CpuAttentionGoesBlockwiseWithCpOrLongSequences) {
  Hardware cpu = h100();
  cpu.attention_tflops = 0;
  const int from = kBlockwiseAttentionFromT;
  EXPECT_FALSE(blockwise_attention(llama_1b(from / 2), layout(1, 1), cpu));
  EXPECT_TRUE(blockwise_attention(llama_1b(from / 2), layout(1, 2), cpu));
  EXPECT_TRUE(blockwise_attention(llama_1b(from), layout(1, 1), cpu));
  EXPECT_TRUE(blockwise_attention(llama_1b(from / 2), layout(1, 1), h100()));  // fused
}

// The planner's threshold is a copy of the CPU backend's (which decides): at T below it the
// backend saves the T×T probabilities, from it on less than T×T (the log-sum-exp rows).
TEST(PlanCp, BlockwiseThresholdIsTheCpuBackends) {
  auto be = make_cpu_backend(1);
  const size_t below = kBlockwiseAttentionFromT - 1, from = kBlockwiseAttentionFromT;
  EXPECT_EQ(be->attention_saved_floats(1, int(below), 64, 4), 4 * below * below);
  EXPECT_LT(be->attention_saved_floats(1, int(from), 64, 4), 4 * from * from);
}

// The MFU's FLOPs count attention's causal half (llm.c's count), as its time is counted.
TEST(PlanCp, ModelFlopsCountTheCausalHalf) {
  const PlanModel m = llama_1b(16384);
  const Prediction p = predict(m, layout(1, 2), h100());
  EXPECT_DOUBLE_EQ(p.model_flops_per_step,
                   gpt_config(m, p.layout).llmc_flops_per_token(16384) * 16384);
  EXPECT_LE(p.mfu, 1.0);
}

PlanSearch eight_h100s() {
  PlanSearch s;
  s.gpus = 8;
  s.global_batch = 4;  // the deck's micro_batch 4 × accum 1
  return s;
}

// 131072 tokens: attention is most of the step, and cp removes tp's all-reduces without the
// memory of a whole sequence per rank; the best layout that fits uses it.
TEST(PlanCp, SearchProposesCpFor128kTokens) {
  const std::vector<Prediction> ranked = rank_layouts(llama_1b(131072), h100(), eight_h100s());
  ASSERT_FALSE(ranked.empty());
  ASSERT_TRUE(ranked[0].fits) << ranked[0].why_not;
  EXPECT_GT(ranked[0].layout.cp, 1) << format_layout(ranked[0].layout);
}

// 2048 tokens: a chunk of T/(2·cp) would be shorter than kMinCpChunkTokens; no cp is tried.
TEST(PlanCp, SearchLeavesShortSequencesAlone) {
  const std::vector<Prediction> ranked = rank_layouts(llama_1b(2048), h100(), eight_h100s());
  ASSERT_FALSE(ranked.empty());
  EXPECT_TRUE(std::all_of(ranked.begin(), ranked.end(),
                          [](const Prediction& p) { return p.layout.cp == 1; }));
}

}  // namespace
}  // namespace trident
