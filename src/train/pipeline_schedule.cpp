// Pipeline schedules: which forward and backward passes one stage runs, in which order.
//
// Note [1F1B]
// PipeDream-flush (Narayanan et al. 2021), as in Megatron-Core's schedules.py: after a warm-up
// of p − s − 1 forwards, stage s of p alternates one forward and one backward, so it holds at
// most p − s micro-batches' activations (GPipe: m) for the same bubble, (p−1)/(m+p−1). Both
// run backwards in micro-batch order, so gradients accumulate in the same order: bitwise equal
// results. Neither deadlocks under run_pipeline for any p, m ≥ 1 (test_pipeline_schedule.cpp
// simulates all stages with the runner's waits, Note [Slot reuse] in train/pipeline_runner.cpp).
//
//     warm-up    w = min(p − s − 1, m) forwards       F0 .. F(w−1)
//     steady     for i in 0 .. m−w−1:  F(w+i), B(i)   one forward, one backward
//     cool-down  the remaining backwards              B(m−w) .. B(m−1)
//
// Note [ZB-H1]
// The zero-bubble schedule of Qi et al. 2023 (its handcrafted ZB-H1): backward splits into B,
// the input gradient the previous stage waits for, and W, the weight gradients nobody waits for;
// stage s runs 1F1B's F and B and delays each W(i) until after B(i + s). Gradients travel back
// at B's pace and the held-back W's fill the cool-down, a third of 1F1B's bubble at equal costs.
// Every stage holds p slots (1F1B's stage-0 peak). W's run in micro-batch order, so gradients
// accumulate in 1F1B's order: bitwise equal results.
//
//     stage 0 of 4:  F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 ...
//     stage 3 of 4:  F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 ...   cool-down: B7 W4 W5 W6 W7
// With F, B and W of equal cost the bubble falls from (p−1)·3 units to (p−1)·1
// (test_pipeline_schedule.cpp replays both with unit costs). Stage s keeps p − s micro-batches'
// activations for F/B and s more awaiting W, and at most s + 1 micro-batches' weight-pass
// inputs (max_awaiting_weight).
//
// Note [Interleaved 1F1B]
// Megatron's virtual stages (Narayanan et al. 2021, section 2.2): stage s of p holds v model
// chunks, chunk c being virtual stage c·p + s, and runs the m·v chunk passes in groups of p
// micro-batches, Megatron's warm-up first. The bubble shrinks by v, to (p−1)/(v·m + p − 1)
// (bubble_model), for p − 1 more boundary crossings per micro-batch; m must be a multiple of p.
// Each chunk's passes run in micro-batch order, so gradients accumulate in 1F1B's order:
// bitwise the same results.
//
// Stage s's k-th forward is chunk (k mod p·v) / p of micro-batch (k / p·v)·p + k mod p, its
// k-th backward the same with the chunks in reverse (v − 1 − that). It starts with
// min((p − s − 1)·2 + (v − 1)·p, m·v) forwards, then alternates one forward / one backward,
// then runs the remaining backwards:
//
//     stage 0 of 2, v 2, m 4:  F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0
//                              B2.1 B3.1 B2.0 B3.0            (Fm.c: micro-batch m, chunk c)
// The unit-cost replay in test_pipeline_schedule.cpp gives exactly bubble_model's bubble. On
// stage 0 it holds (p − 1)/(p·v) more activation memory than 1F1B.
#include <fmt/format.h>

#include <algorithm>

#include "trident/check.h"
#include "trident/pipeline.h"

namespace trident {

PipeSchedule parse_pipe_schedule(const std::string& text, const std::string& key) {
  if (text == "gpipe") return PipeSchedule::kGPipe;
  if (text == "1f1b") return PipeSchedule::kOneFOneB;
  if (text == "zb-h1") return PipeSchedule::kZeroBubbleH1;
  if (text == "interleaved") return PipeSchedule::kInterleaved;
  input_error("{}: unknown pipeline schedule '{}'; allowed: gpipe, 1f1b, zb-h1, interleaved", key,
              text);
}

const char* pipe_schedule_name(PipeSchedule s) {
  switch (s) {
    case PipeSchedule::kGPipe: return "gpipe";
    case PipeSchedule::kOneFOneB: return "1f1b";
    case PipeSchedule::kZeroBubbleH1: return "zb-h1";
    case PipeSchedule::kInterleaved: return "interleaved";
  }
  return "?";
}

bool splits_backward(PipeSchedule schedule) { return schedule == PipeSchedule::kZeroBubbleH1; }

namespace {

void check_schedule_args(PipeSchedule schedule, int stages, int stage, int micro_batches,
                         int chunks = 1) {
  TRIDENT_CHECK(stages >= 1 && stage >= 0 && stage < stages && micro_batches >= 1 && chunks >= 1,
                "pipeline schedule for stage {} of {} with {} micro-batches and {} chunks", stage,
                stages, micro_batches, chunks);
  TRIDENT_CHECK(schedule == PipeSchedule::kInterleaved || chunks == 1, "{} with {} chunks",
                pipe_schedule_name(schedule), chunks);
  TRIDENT_CHECK(schedule != PipeSchedule::kInterleaved || micro_batches % stages == 0,
                "interleaved with {} micro-batches on {} stages", micro_batches, stages);
}

// The schedule of Note [Interleaved 1F1B].
std::vector<PipeAction> interleaved_actions(int stages, int stage, int micro_batches, int chunks) {
  using Kind = PipeAction::Kind;
  const int p = stages, v = chunks, total = micro_batches * chunks;
  const int warmup = std::min((p - stage - 1) * 2 + (v - 1) * p, total);
  auto chunk_of = [&](int k, bool forward) {
    const int c = (k % (p * v)) / p;
    return forward ? c : v - 1 - c;
  };
  auto micro_of = [&](int k) { return (k / (p * v)) * p + k % p; };
  auto forward = [&](int k) { return PipeAction{Kind::kForward, micro_of(k), chunk_of(k, true)}; };
  auto backward = [&](int k) {
    return PipeAction{Kind::kBackward, micro_of(k), chunk_of(k, false)};
  };
  std::vector<PipeAction> actions;
  actions.reserve(2 * size_t(total));
  for (int k = 0; k < warmup; ++k) actions.push_back(forward(k));
  for (int i = 0; i < total - warmup; ++i) {
    actions.push_back(forward(warmup + i));
    actions.push_back(backward(i));
  }
  for (int k = total - warmup; k < total; ++k) actions.push_back(backward(k));
  return actions;
}

int warmup_forwards(int stages, int stage, int micro_batches) {
  return std::min(stages - stage - 1, micro_batches);
}

}  // namespace

std::vector<PipeAction> pipeline_actions(PipeSchedule schedule, int stages, int stage,
                                         int micro_batches, int chunks) {
  check_schedule_args(schedule, stages, stage, micro_batches, chunks);
  if (schedule == PipeSchedule::kInterleaved)
    return interleaved_actions(stages, stage, micro_batches, chunks);
  using Kind = PipeAction::Kind;
  std::vector<PipeAction> actions;
  actions.reserve(2 * static_cast<size_t>(micro_batches));
  if (schedule == PipeSchedule::kGPipe) {
    for (int m = 0; m < micro_batches; ++m) actions.push_back({Kind::kForward, m});
    for (int m = 0; m < micro_batches; ++m) actions.push_back({Kind::kBackward, m});
    return actions;
  }
  // After B(i), the W that is due, W(i − lag), where lag = stage (Note [ZB-H1]).
  const bool split = splits_backward(schedule);
  const int lag = stage;
  int next_weight = 0;
  auto backward = [&](int i) {
    actions.push_back({Kind::kBackward, i});
    if (split && i - next_weight >= lag) actions.push_back({Kind::kWeight, next_weight++});
  };
  const int warmup = warmup_forwards(stages, stage, micro_batches);
  for (int m = 0; m < warmup; ++m) actions.push_back({Kind::kForward, m});
  for (int i = 0; i < micro_batches - warmup; ++i) {
    actions.push_back({Kind::kForward, warmup + i});
    backward(i);
  }
  for (int m = micro_batches - warmup; m < micro_batches; ++m) backward(m);
  while (split && next_weight < micro_batches) actions.push_back({Kind::kWeight, next_weight++});
  return actions;
}

int max_in_flight(PipeSchedule schedule, int stages, int stage, int micro_batches, int chunks,
                  int chunk) {
  check_schedule_args(schedule, stages, stage, micro_batches, chunks);
  TRIDENT_CHECK(chunk >= 0 && chunk < chunks, "chunk {} of {}", chunk, chunks);
  if (schedule == PipeSchedule::kInterleaved) {
    int alive = 0, most = 0;
    for (const PipeAction& a : interleaved_actions(stages, stage, micro_batches, chunks)) {
      if (a.chunk != chunk) continue;
      alive += a.kind == PipeAction::Kind::kForward ? 1 : -1;
      most = std::max(most, alive);
    }
    return most;
  }
  if (schedule == PipeSchedule::kGPipe) return micro_batches;
  if (schedule == PipeSchedule::kZeroBubbleH1) return std::min(stages, micro_batches);
  return std::min(stages - stage, micro_batches);
}

int max_awaiting_weight(PipeSchedule schedule, int stages, int stage, int micro_batches) {
  check_schedule_args(schedule, stages, stage, micro_batches);
  if (!splits_backward(schedule)) return 0;
  return std::min(stage + 1, micro_batches);
}

double bubble_model(PipeSchedule schedule, int stages, int micro_batches, int chunks,
                    double weight_share) {
  check_schedule_args(schedule, stages, 0, micro_batches, chunks);
  TRIDENT_CHECK(weight_share >= 0 && weight_share <= 1.0 / 3, "a weight pass above a third");
  const double p = stages, m = micro_batches, v = chunks;
  if (!splits_backward(schedule)) return (p - 1) / (v * m + p - 1);
  // In thirds of a micro-batch's F + B + W (F a third): W = 3w, F + B = 3 − 3w. The idle time
  // is (p − 1)(F + B) less the W's that fill it, min(m − 1, p − 1) of them.
  const double w = 3 * weight_share;
  const double idle = (p - 1) * (3 - w) - std::min(m - 1, p - 1) * w;
  return idle / (3 * m + idle);
}

void check_pipe_schedule(PipeSchedule schedule, int stages, int micro_batches, int chunks,
                         int layers) {
  if (schedule != PipeSchedule::kInterleaved) {
    if (chunks != 1)
      input_error("parallel.virtual_stages: {} needs parallel.schedule: interleaved (it is {})",
                  chunks, pipe_schedule_name(schedule));
    return;
  }
  if (stages < 2)
    input_error("parallel.schedule: interleaved needs parallel.pp ≥ 2 (it is {})", stages);
  if (chunks < 2)
    input_error("parallel.schedule: interleaved needs parallel.virtual_stages ≥ 2 (it is {}); "
                "with one chunk per stage use 1f1b",
                chunks);
  if (micro_batches % stages != 0) {
    const int below = micro_batches / stages * stages, above = below + stages;
    input_error("parallel.schedule: interleaved runs micro-batches in groups of parallel.pp: "
                "train.accum {} is not a multiple of parallel.pp {} (use {})",
                micro_batches, stages,
                below > 0 ? fmt::format("{} or {}", below, above) : fmt::format("{}", above));
  }
  if (layers < stages * chunks)
    input_error("parallel.schedule: interleaved with parallel.pp {} × parallel.virtual_stages {} "
                "= {} model chunks, but model.layers is {}: each chunk needs a block",
                stages, chunks, stages * chunks, layers);
}

}  // namespace trident
