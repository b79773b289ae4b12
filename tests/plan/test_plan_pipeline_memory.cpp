// The plan's activation memory at pp > 1 (Note [Plan memory] in src/plan/memory.cpp) against
// what each pipeline stage's GPT allocates, built as the Trainer builds it: its options from
// stage_options (the stage's blocks, max_in_flight slots per chunk, the shared head of zb-h1);
// and its stage_buffers (Note [Plan stage buffers]) against what GPTStage allocates on a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "plan/plan_parts.h"
#include "plan_test_util.h"
#include "strict_device_backend.h"
#include "train/gpt_stage.h"
#include "train/trainer_parts.h"
#include "trident/backend.h"
#include "trident/check.h"
#include "trident/data.h"
#include "trident/pipeline.h"

namespace trident {
namespace {

// round_machine: a GPU without a fused attention rate, so the plan counts the CPU's T×T
// attention buffers, which the model on the CPU backend allocates (its bf16 ops' host
// definitions allocate what a device's do).
using testing::round_machine;

struct PipeCase {
  const char* schedule;
  int v;  // virtual stages (interleaved)
};

// Eight layers, so that pp 4 × v 2 gives each virtual stage one; accum 8 > pp, so that the slots
// are each schedule's own (GPipe 8, 1F1B pp − s, ZB-H1 pp, interleaved per chunk), not capped.
Deck pipeline_deck(const std::string& file, std::vector<std::string> keys, int pp,
                   const PipeCase& pc, const char* recompute) {
  keys.insert(
      keys.end(),
      {"model.layers=8", "model.d_model=64", "model.heads=4", "model.kv_heads=2", "model.vocab=250",
       "model.seq_len=16", "model.mlp_hidden=96", "train.micro_batch=2", "train.accum=8",
       fmt::format("parallel.pp={}", pp), fmt::format("parallel.schedule={}", pc.schedule),
       fmt::format("parallel.virtual_stages={}", pc.v),
       fmt::format("train.recompute={}", recompute)});
  return load_deck(std::string(TRIDENT_SOURCE_DIR) + "/inputs/" + file, keys);
}

// The device bytes GPTStage adds to its GPT for one step's shape: the GPT built on a counting
// backend over a device (what check_memory_plan does), the stage made with device links.
double stage_device_bytes(const GPTConfig& cfg, const Deck& deck, const GPTOptions& options,
                          const SampleOrder& order) {
  testing::StrictDeviceBackend device;
  size_t bytes = 0;
  auto counter = make_counting_backend(device, &bytes);
  GPT gpt(cfg, *counter, deck.train.micro_batch, deck.model.seq_len, options);
  const size_t model_bytes = bytes;
  GPTStage stage(gpt, nullptr, nullptr, true);
  GPTStage::StepInputs in;
  in.micro_batch = deck.train.micro_batch, in.seq_len = deck.model.seq_len;
  in.accum = deck.train.accum;
  stage.begin_step(in, order);
  return double(bytes - model_bytes);
}

// Every schedule, pp 2 and 4, every stage, fp32 and bf16, each recompute mode the schedule
// runs: the stage's activations + scratch equal the bytes its GPT allocates, and stage_buffers
// what its GPTStage allocates on a device, exactly (sums of integers below 2^53; the counting
// backend's 256 B rounding leaves these sizes whole).
void expect_stages_match(const std::string& file, const std::vector<std::string>& keys) {
  auto backend = make_cpu_backend(1);
  TrainContext ctx;
  ctx.backend = backend.get();
  const std::unique_ptr<TokenDataset> data = TokenDataset::open(
      std::string(TRIDENT_SOURCE_DIR) + "/inputs/data/tiny-train.bin", 256, "data.train");
  const SampleOrder order(*data, 16, false, 1);  // begin_step's argument; only kept, not read
  const std::vector<PipeCase> cases = {{"gpipe", 1}, {"1f1b", 1}, {"interleaved", 2}, {"zb-h1", 1}};
  for (const PipeCase& pc : cases)
    for (int pp : {2, 4})
      for (const char* recompute : {"none", "mlp", "full"}) {
        const PipeSchedule schedule = parse_pipe_schedule(pc.schedule, "schedule");
        if (splits_backward(schedule) && std::string(recompute) != "none") continue;  // refused
        const Deck deck = pipeline_deck(file, keys, pp, pc, recompute);
        const PlanModel m = PlanModel::from_deck(deck);
        PlanLayout l;
        l.pp = pp, l.v = pc.v, l.schedule = pc.schedule, l.accum = deck.train.accum;
        l.micro_batch = deck.train.micro_batch, l.recompute = recompute;
        const GPTConfig cfg = model_config_from_deck(deck, nullptr);
        for (const char* dtype : {"fp32", "bf16"}) {
          double most = 0;  // the largest stage's total
          for (int s = 0; s < pp; ++s) {
            double acts = 0, stage_buffers = -1, total = 0;
            for (const PlanTerm& t : stage_memory_terms(m, l, round_machine(dtype), s)) {
              if (t.name == "activations" || t.name == "scratch") acts += t.value;
              if (t.name == "stage_buffers") stage_buffers = t.value;
              total += t.value;
            }
            most = std::max(most, total);
            GPTOptions options = stage_options(deck, cfg, ctx, schedule, pp, s, 1);
            // The deck refuses bf16 on the CPU backend; the option is what parse_precision gives.
            if (std::string(dtype) == "bf16") options.precision = Precision::kBf16;
            GPT gpt(cfg, *backend, deck.train.micro_batch, deck.model.seq_len, options);
            const std::string where =
                fmt::format("{} {} pp {} stage {} {} recompute {} ({} slots)", file, pc.schedule,
                            pp, s, dtype, recompute, gpt.num_slots());
            EXPECT_DOUBLE_EQ(acts, double(gpt.activation_bytes())) << where;
            EXPECT_DOUBLE_EQ(stage_buffers, stage_device_bytes(cfg, deck, options, order)) << where;
          }
          // memory_terms reports the first or the last stage: one of them holds the most.
          double reported = 0;
          for (const PlanTerm& t : memory_terms(m, l, round_machine(dtype))) reported += t.value;
          EXPECT_DOUBLE_EQ(reported, most) << file << " " << pc.schedule << " pp " << pp;
        }
      }
}

TEST(PlanPipelineMemory, DenseStagesAllocateWhatThePlanCounts) {
  expect_stages_match("llama-124m.yaml", {});
}

// Mixture layers every second layer (dense ones between), gated shared experts and the sigmoid
// router's bias: the mixture's per-slot buffers follow the stage's slots.
TEST(PlanPipelineMemory, MixtureStagesAllocateWhatThePlanCounts) {
  expect_stages_match(
      "mixtral-8x7b.yaml",
      {"model.moe.experts=4", "model.moe.ffn_width=32", "model.moe.every=2",
       "model.moe.shared_experts=1", "model.moe.shared_gate=true", "model.moe.router=sigmoid"});
}

}  // namespace
}  // namespace trident
