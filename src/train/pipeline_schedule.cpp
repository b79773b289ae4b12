// Pipeline schedules: which forward and backward passes one stage runs, in which order.
//
// Note [1F1B]: PipeDream-flush (Narayanan et al. 2021), as in Megatron-Core's schedules.py.
// Stage s of p, with m micro-batches, runs
//
//     warm-up    w = min(p − s − 1, m) forwards       F0 .. F(w−1)
//     steady     for i in 0 .. m−w−1:  F(w+i), B(i)   one forward, one backward
//     cool-down  the remaining backwards              B(m−w) .. B(m−1)
//
// so the last stage alternates from the start (F0 B0 F1 B1 ...) and stage s holds at most
// p − s micro-batches' activations, against m for GPipe (all forwards, then all backwards).
// Both run backwards in micro-batch order, so gradients accumulate in the same order and the
// two schedules give bitwise equal results. The bubble is the same, (p−1)/(m+p−1); 1F1B only
// bounds the memory. With run_pipeline's nonblocking sends and blocking receives neither
// deadlocks, for any p ≥ 1 and m ≥ 1 (m < p included): test_pipeline_schedule.cpp simulates all
// stages together, with the runner's waits (Note [Slot reuse] in pipeline_runner.cpp), up to
// 8 stages × 20 micro-batches.
#include <algorithm>

#include "trident/check.h"
#include "trident/pipeline.h"

namespace trident {

PipeSchedule parse_pipe_schedule(const std::string& text, const std::string& key) {
  if (text == "gpipe") return PipeSchedule::kGPipe;
  if (text == "1f1b") return PipeSchedule::kOneFOneB;
  input_error("{}: unknown pipeline schedule '{}'; allowed: gpipe, 1f1b", key, text);
}

const char* pipe_schedule_name(PipeSchedule s) {
  switch (s) {
    case PipeSchedule::kGPipe: return "gpipe";
    case PipeSchedule::kOneFOneB: return "1f1b";
  }
  return "?";
}

namespace {

void check_schedule_args(int stages, int stage, int micro_batches) {
  TRIDENT_CHECK(stages >= 1 && stage >= 0 && stage < stages && micro_batches >= 1,
                "pipeline schedule for stage {} of {} with {} micro-batches", stage, stages,
                micro_batches);
}

int warmup_forwards(int stages, int stage, int micro_batches) {
  return std::min(stages - stage - 1, micro_batches);
}

}  // namespace

std::vector<PipeAction> pipeline_actions(PipeSchedule schedule, int stages, int stage,
                                         int micro_batches) {
  check_schedule_args(stages, stage, micro_batches);
  using Kind = PipeAction::Kind;
  std::vector<PipeAction> actions;
  actions.reserve(2 * static_cast<size_t>(micro_batches));
  if (schedule == PipeSchedule::kGPipe) {
    for (int m = 0; m < micro_batches; ++m) actions.push_back({Kind::kForward, m});
    for (int m = 0; m < micro_batches; ++m) actions.push_back({Kind::kBackward, m});
    return actions;
  }
  const int warmup = warmup_forwards(stages, stage, micro_batches);
  for (int m = 0; m < warmup; ++m) actions.push_back({Kind::kForward, m});
  for (int i = 0; i < micro_batches - warmup; ++i) {
    actions.push_back({Kind::kForward, warmup + i});
    actions.push_back({Kind::kBackward, i});
  }
  for (int m = micro_batches - warmup; m < micro_batches; ++m)
    actions.push_back({Kind::kBackward, m});
  return actions;
}

int max_in_flight(PipeSchedule schedule, int stages, int stage, int micro_batches) {
  check_schedule_args(stages, stage, micro_batches);
  if (schedule == PipeSchedule::kGPipe) return micro_batches;
  return std::min(stages - stage, micro_batches);
}

}  // namespace trident
