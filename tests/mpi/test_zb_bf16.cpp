// run.precision bf16 with parallel.schedule zb-h1 (Note [Split backward in bf16] in
// src/model/gpt_bf16.cpp): B keeps the bf16 output gradients the weight GEMMs read, W computes
// the weight gradients from them later, so zb-h1 equals 1f1b bit for bit (losses, gradient
// norms, parameters) on the CPU backend's host bf16 ops and on the strict device backend
// (device communicators; ZeRO-3's gathers, there only). 2 ranks: pp 2 with GPT-2's blocks (the
// tied head; the dGELU GEMM's bias gradient stays in B), Llama's (SwiGLU, RMSNorm, RoPE),
// NeoX's (parallel residual, exact GELU) and a small Mixtral's (Note [Mixtures in B]). 4 ranks:
// dp 2 × pp 2 with ZeRO-1 and ZeRO-3, tp 2 × pp 2 with sequence parallelism (W gathers the
// kept bf16 rows again), with and without tp_overlap, and cp 2 × pp 2. The deck refuses bf16
// on the CPU (Note [bf16 activations]); the host bf16 ops run it here. Runs under mpirun with 2
// and 4 ranks.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "moe_run.h"
#include "train_harness.h"

namespace trident {
namespace {

using testing::world_size;

Deck bf16_deck(std::vector<std::string> keys, const char* schedule) {
  keys.insert(keys.end(),
              {"train.accum=4", "train.steps=3", fmt::format("parallel.schedule={}", schedule)});
  Deck d = testing::small_layout_deck(keys);
  d.run.precision = "bf16";
  return d;
}

// The strict device run; with the tp rings (tp_overlap), their own device communicator, as a
// device run's second NcclComm (tests/mpi/test_tp_overlap_bf16.cpp).
testing::MoeRun run_strict(const Deck& d, ProcessGrid& grid) {
  if (d.parallel.tp_overlap != "true") return testing::run_moe_strict(d, grid);
  testing::StrictDeviceBackend strict;
  testing::StrictComms comms(strict, grid, grid.layout().tp, 1);
  std::unique_ptr<MpiComm> host_ring = MpiComm::duplicate(grid.tp().raw(), "tp ring (test)");
  testing::StrictDeviceComm ring(strict, *host_ring);
  TrainContext ctx{nullptr, 1e9, &grid};
  comms.attach(ctx);
  ctx.tp_ring = &ring;
  return testing::run_moe(strict, d, ctx);
}

// zb-h1 against 1f1b at tp × cp × pp 2 (dp the rest), on both backends (ZeRO-3 in bf16: on a
// device only, its unit pool holds the bf16 weights).
void expect_zb_equals_1f1b(int tp, std::vector<std::string> keys, bool on_cpu = true, int cp = 1) {
  SCOPED_TRACE(
      fmt::format("{} ranks, tp {}, cp {}, pp 2, {}", world_size(), tp, cp, fmt::join(keys, " ")));
  ProcessGrid grid(complete_layout({.world = world_size(), .tp = tp, .pp = 2, .cp = cp}));
  keys.insert(keys.end(), {fmt::format("parallel.tp={}", tp), fmt::format("parallel.cp={}", cp),
                           "parallel.pp=2"});
  if (on_cpu) {
    SCOPED_TRACE("the CPU backend");
    auto cpu = make_cpu_backend(1);
    TrainContext on_grid;
    on_grid.grid = &grid;
    const testing::MoeRun one_f = testing::run_moe(*cpu, bf16_deck(keys, "1f1b"), on_grid);
    testing::expect_same_moe_run(testing::run_moe(*cpu, bf16_deck(keys, "zb-h1"), on_grid), one_f);
  }
  SCOPED_TRACE("the strict device backend");
  const testing::MoeRun one_f = run_strict(bf16_deck(keys, "1f1b"), grid);
  testing::expect_same_moe_run(run_strict(bf16_deck(keys, "zb-h1"), grid), one_f);
}

TEST(ZeroBubbleBf16, Pp2IsBitwise1F1BInEachFamily) {
  if (world_size() != 2) GTEST_SKIP() << "pp 2 on 2 ranks";
  expect_zb_equals_1f1b(1, {});  // GPT-2: tied head, tanh GELU in the GEMMs
  expect_zb_equals_1f1b(1, {"model.family=llama", "model.kv_heads=2", "model.mlp_hidden=64"});
  expect_zb_equals_1f1b(1, {"model.family=neox"});  // parallel residual, exact GELU
  expect_zb_equals_1f1b(
      1, {"model.family=mixtral", "model.kv_heads=2", "model.mlp_hidden=64", "model.moe.experts=4",
          "model.moe.top_k=2", "model.moe.ffn_width=32", "model.moe.every=2"});
}

TEST(ZeroBubbleBf16, DpTpCpPpLayoutsAreBitwise1F1B) {
  if (world_size() != 4) GTEST_SKIP() << "dp, tp or cp 2 × pp 2 on 4 ranks";
  expect_zb_equals_1f1b(1, {"parallel.zero=1"});
  expect_zb_equals_1f1b(1, {"parallel.zero=3"}, /*on_cpu=*/false);
  expect_zb_equals_1f1b(2, {"parallel.sequence_parallel=true"});
  expect_zb_equals_1f1b(2, {"parallel.sequence_parallel=true", "parallel.tp_overlap=true"});
  expect_zb_equals_1f1b(1, {"model.tied_head=false"}, true, /*cp=*/2);
}

}  // namespace
}  // namespace trident
