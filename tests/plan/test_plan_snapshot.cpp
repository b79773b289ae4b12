// checkpoint.async's snapshot in the plan (Note [Plan checkpoint snapshot] in
// src/plan/memory.cpp): its bytes per rank at each ZeRO stage against hand-computed figures for
// a small model, its copy time, where it is counted (a cpu rank's memory and fit; a gpu node's
// pinned host memory, never the device's), and GPT-2 124M's 1.49 GB.
#include <gtest/gtest.h>

#include <string>

#include "plan/plan_parts.h"
#include "plan_test_util.h"

namespace trident {
namespace {

Hardware gpu_machine() {
  Hardware hw = testing::round_machine("bf16", 8, 100);
  hw.name = "round-gpu";
  hw.host_copy_gbytes_per_s = 50;
  return hw;
}

Hardware cpu_machine() {
  Hardware hw = gpu_machine();
  hw.name = "round-cpu";
  hw.kind = "cpu";
  hw.dtype = "fp32";
  hw.devices_per_node = 4;
  hw.host_copy_gbytes_per_s = 0;  // the default: half of memory_gbytes_per_s, 50 GB/s
  return hw;
}

// GPT-2's block, 8 layers of C = 64, vocabulary 128 (tied head), 16 positions: per block
// 12·C² + 9·C + 4·C = 49,984; wte 8,192; wpe 1,024; final LayerNorm 128;
// Ψ = 8,192 + 1,024 + 8·49,984 + 128 = 409,216 (as tests/plan/test_plan_zero3.cpp).
PlanModel small_model(bool async) {
  PlanModel m;
  m.layers = 8, m.d_model = 64, m.heads = 2, m.vocab = 128, m.seq_len = 16;
  m.async_checkpoint = async;
  return m;
}
constexpr double kPsi = 409216;

PlanLayout data_parallel(int dp, int zero, int dp_shard = 0) {
  PlanLayout l;
  l.dp = dp, l.zero = zero, l.dp_shard = dp_shard;
  return l;
}

TEST(PlanSnapshot, BytesPerRankByZeroStage) {
  const PlanModel m = small_model(true);
  // ZeRO-0: every dp rank holds its parameters, m and v whole: 3 × 4 B × Ψ.
  EXPECT_DOUBLE_EQ(snapshot_bytes(m, data_parallel(4, 0), 0), 12 * kPsi);  // 4,910,592
  // ZeRO-1 and -2: the parameters whole, m and v a quarter each: 4Ψ + 8Ψ/4 = 6Ψ.
  EXPECT_DOUBLE_EQ(snapshot_bytes(m, data_parallel(4, 1), 0), 6 * kPsi);
  EXPECT_DOUBLE_EQ(snapshot_bytes(m, data_parallel(4, 2), 0), 6 * kPsi);
  // ZeRO-3: all three are the rank's quarter: 12Ψ/4 = 3Ψ; HSDP 2 × 2: halves, 6Ψ.
  EXPECT_DOUBLE_EQ(snapshot_bytes(m, data_parallel(4, 3), 0), 3 * kPsi);
  EXPECT_DOUBLE_EQ(snapshot_bytes(m, data_parallel(4, 3, 2), 0), 6 * kPsi);
  // Tensor parallelism halves the blocks' matrices (not their LayerNorms and row biases) and
  // pads the vocabulary per rank: the stage's own count, times 12.
  PlanLayout tp2;
  tp2.tp = 2;
  EXPECT_DOUBLE_EQ(snapshot_bytes(m, tp2, 0), 12 * stage_params(m, tp2, 0));
  EXPECT_LT(snapshot_bytes(m, tp2, 0), 12 * kPsi * 0.6);
}

TEST(PlanSnapshot, OnAGpuInPinnedHostMemoryNotTheDevices) {
  const Hardware hw = gpu_machine();
  for (int zero : {0, 1, 3}) {
    SCOPED_TRACE(zero);
    const PlanLayout l = data_parallel(4, zero);
    const Prediction with = predict(small_model(true), l, hw);
    const Prediction without = predict(small_model(false), l, hw);
    const double bytes = zero == 0 ? 12 * kPsi : zero == 1 ? 6 * kPsi : 3 * kPsi;
    EXPECT_DOUBLE_EQ(with.snapshot.bytes_per_rank, bytes);
    EXPECT_EQ(with.snapshot.node_ranks, 4);  // 4 ranks, 8 devices per node: one node
    EXPECT_DOUBLE_EQ(with.snapshot.host_bytes_per_node, 4 * bytes);
    EXPECT_DOUBLE_EQ(with.snapshot.copy_s, bytes / 50e9);
    EXPECT_DOUBLE_EQ(with.memory_bytes, without.memory_bytes);  // the device holds none of it
    EXPECT_EQ(with.term("checkpoint_snapshot"), 0);
  }
  // 16 ranks on nodes of 8: a node holds 8 snapshots.
  EXPECT_EQ(predict(small_model(true), data_parallel(16, 1), hw).snapshot.node_ranks, 8);
  // No rate in the file: no time, rather than a guess.
  Hardware unknown = hw;
  unknown.host_copy_gbytes_per_s = 0;
  EXPECT_EQ(predict(small_model(true), data_parallel(4, 0), unknown).snapshot.copy_s, 0);
}

TEST(PlanSnapshot, PinnedHostMemoryOfTheNodeIsChecked) {
  Hardware hw = gpu_machine();
  hw.host_memory_gb = 4 * 12 * kPsi / 1e9 * 0.99;  // just short of 4 ZeRO-0 snapshots
  const Prediction with = predict(small_model(true), data_parallel(4, 0), hw);
  EXPECT_FALSE(with.fits);
  EXPECT_NE(with.why_not.find("pinned host memory"), std::string::npos) << with.why_not;
  EXPECT_TRUE(predict(small_model(false), data_parallel(4, 0), hw).fits);  // not asked for
  EXPECT_TRUE(predict(small_model(true), data_parallel(4, 1), hw).fits);   // 6Ψ per rank
}

TEST(PlanSnapshot, OnACpuInTheRanksMemoryAndFit) {
  const Hardware hw = cpu_machine();
  for (int zero : {0, 1, 3}) {
    SCOPED_TRACE(zero);
    const PlanLayout l = data_parallel(2, zero);
    const Prediction with = predict(small_model(true), l, hw);
    const Prediction without = predict(small_model(false), l, hw);
    const double bytes = zero == 0 ? 12 * kPsi : zero == 1 ? 8 * kPsi : 6 * kPsi;
    EXPECT_DOUBLE_EQ(testing::term(with.memory, "checkpoint_snapshot"), bytes);
    EXPECT_DOUBLE_EQ(with.memory_bytes, without.memory_bytes + bytes);
    EXPECT_EQ(without.term("checkpoint_snapshot"), 0);
    EXPECT_DOUBLE_EQ(with.snapshot.copy_s, bytes / 50e9);  // memory_gbytes_per_s / 2
  }
  // A node whose memory holds the rank without the snapshot but not with it (2 ranks share it).
  Hardware tight = hw;
  const double without = predict(small_model(false), data_parallel(2, 0), hw).memory_bytes;
  tight.memory_gb = 2 * (without + 6 * kPsi) / 1e9;
  EXPECT_TRUE(predict(small_model(false), data_parallel(2, 0), tight).fits);
  EXPECT_FALSE(predict(small_model(true), data_parallel(2, 0), tight).fits);
  // A measured rate replaces the default.
  Hardware measured = hw;
  measured.host_copy_gbytes_per_s = 4;
  EXPECT_DOUBLE_EQ(host_copy_bytes_per_s(measured), 4e9);
  EXPECT_DOUBLE_EQ(predict(small_model(true), data_parallel(2, 0), measured).snapshot.copy_s,
                   12 * kPsi / 4e9);
}

TEST(PlanSnapshot, Gpt2SmallIsOnePointFiveGigabytes) {
  // GPT-2 124M: wte 50,304 (padded) × 768 + wpe 1,024 × 768 + 12 blocks of 7,087,872 + the
  // final LayerNorm 1,536 = 124,475,904 parameters; fp32 params, m and v: 1,493,710,848 B.
  PlanModel m;
  m.layers = 12, m.d_model = 768, m.heads = 12, m.vocab = 50257, m.seq_len = 1024;
  EXPECT_DOUBLE_EQ(snapshot_bytes(m, PlanLayout{}, 0), 1493710848.0);
}

}  // namespace
}  // namespace trident
