// Pipeline schedules (pure): exact GPipe, 1F1B and ZB-H1 sequences, every micro-batch through
// each of its passes once, max_in_flight and max_awaiting_weight against a replay of the
// actions, a simulation of all stages together (nonblocking sends, blocking receives) that
// finds no deadlock, and the schedules' makespans with unit pass costs against the papers'.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "trident/check.h"
#include "trident/pipeline.h"

namespace trident {
namespace {

// "F0 F1 B0 ..." from and to action lists, so expected sequences read like the papers' figures.
std::string to_text(const std::vector<PipeAction>& actions) {
  std::string s;
  for (const PipeAction& a : actions) {
    if (!s.empty()) s += ' ';
    const char kind = a.kind == PipeAction::Kind::kForward    ? 'F'
                      : a.kind == PipeAction::Kind::kBackward ? 'B'
                                                              : 'W';
    s += kind + std::to_string(a.micro);
  }
  return s;
}

std::string actions_text(PipeSchedule s, int stages, int stage, int micro) {
  return to_text(pipeline_actions(s, stages, stage, micro));
}

TEST(PipeSchedule, GPipeRunsEveryForwardThenEveryBackward) {
  for (int stage = 0; stage < 4; ++stage)
    EXPECT_EQ(actions_text(PipeSchedule::kGPipe, 4, stage, 3), "F0 F1 F2 B0 B1 B2") << stage;
  EXPECT_EQ(actions_text(PipeSchedule::kGPipe, 1, 0, 1), "F0 B0");
}

TEST(PipeSchedule, OneFOneBFourStagesEightMicroBatches) {
  const auto s = PipeSchedule::kOneFOneB;
  // Warm-up 3, 2, 1, 0 forwards; then F/B pairs; then the cool-down backwards.
  EXPECT_EQ(actions_text(s, 4, 0, 8), "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  EXPECT_EQ(actions_text(s, 4, 1, 8), "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
  EXPECT_EQ(actions_text(s, 4, 2, 8), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7");
  EXPECT_EQ(actions_text(s, 4, 3, 8), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
}

TEST(PipeSchedule, OneFOneBWithFewerMicroBatchesThanStages) {
  const auto s = PipeSchedule::kOneFOneB;
  // 4 stages, 2 micro-batches: warm-up min(3, 2) = 2 on stage 0 (no steady state at all).
  EXPECT_EQ(actions_text(s, 4, 0, 2), "F0 F1 B0 B1");
  EXPECT_EQ(actions_text(s, 4, 1, 2), "F0 F1 B0 B1");
  EXPECT_EQ(actions_text(s, 4, 2, 2), "F0 F1 B0 B1");
  EXPECT_EQ(actions_text(s, 4, 3, 2), "F0 B0 F1 B1");
  // 4 stages, 1 micro-batch: every stage does F0 B0.
  for (int stage = 0; stage < 4; ++stage) EXPECT_EQ(actions_text(s, 4, stage, 1), "F0 B0");
  // 3 stages, 2 micro-batches.
  EXPECT_EQ(actions_text(s, 3, 0, 2), "F0 F1 B0 B1");
  EXPECT_EQ(actions_text(s, 3, 1, 2), "F0 F1 B0 B1");
  EXPECT_EQ(actions_text(s, 3, 2, 2), "F0 B0 F1 B1");
  // One stage: 1F1B is forward, backward, forward, backward.
  EXPECT_EQ(actions_text(s, 1, 0, 3), "F0 B0 F1 B1 F2 B2");
}

TEST(PipeSchedule, ZeroBubbleH1FourStagesEightMicroBatches) {
  const auto s = PipeSchedule::kZeroBubbleH1;
  // 1F1B's F and B; stage s runs W(i) right after B(i + s), the rest at the end.
  EXPECT_EQ(actions_text(s, 4, 0, 8),
            "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7");
  EXPECT_EQ(actions_text(s, 4, 1, 8),
            "F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 B6 W5 B7 W6 W7");
  EXPECT_EQ(actions_text(s, 4, 2, 8),
            "F0 F1 B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 F6 B5 W3 F7 B6 W4 B7 W5 W6 W7");
  EXPECT_EQ(actions_text(s, 4, 3, 8),
            "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7");
}

TEST(PipeSchedule, ZeroBubbleH1TwoAndFourStagesFourMicroBatches) {
  const auto s = PipeSchedule::kZeroBubbleH1;
  EXPECT_EQ(actions_text(s, 2, 0, 4), "F0 F1 B0 W0 F2 B1 W1 F3 B2 W2 B3 W3");
  EXPECT_EQ(actions_text(s, 2, 1, 4), "F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3");
  EXPECT_EQ(actions_text(s, 4, 0, 4), "F0 F1 F2 F3 B0 W0 B1 W1 B2 W2 B3 W3");
  EXPECT_EQ(actions_text(s, 4, 1, 4), "F0 F1 F2 B0 F3 B1 W0 B2 W1 B3 W2 W3");
  EXPECT_EQ(actions_text(s, 4, 2, 4), "F0 F1 B0 F2 B1 F3 B2 W0 B3 W1 W2 W3");
  EXPECT_EQ(actions_text(s, 4, 3, 4), "F0 B0 F1 B1 F2 B2 F3 B3 W0 W1 W2 W3");
  // One stage: F, B, W per micro-batch.
  EXPECT_EQ(actions_text(s, 1, 0, 2), "F0 B0 W0 F1 B1 W1");
}

TEST(PipeSchedule, OneFOneBFourStagesFourMicroBatches) {
  const auto s = PipeSchedule::kOneFOneB;
  EXPECT_EQ(actions_text(s, 4, 0, 4), "F0 F1 F2 F3 B0 B1 B2 B3");
  EXPECT_EQ(actions_text(s, 4, 1, 4), "F0 F1 F2 B0 F3 B1 B2 B3");
  EXPECT_EQ(actions_text(s, 4, 2, 4), "F0 F1 B0 F2 B1 F3 B2 B3");
  EXPECT_EQ(actions_text(s, 4, 3, 4), "F0 B0 F1 B1 F2 B2 F3 B3");
}

TEST(PipeSchedule, ZeroBubbleH1TwoStagesEightMicroBatches) {
  const auto s = PipeSchedule::kZeroBubbleH1;
  EXPECT_EQ(actions_text(s, 2, 0, 8),
            "F0 F1 B0 W0 F2 B1 W1 F3 B2 W2 F4 B3 W3 F5 B4 W4 F6 B5 W5 F7 B6 W6 B7 W7");
  EXPECT_EQ(actions_text(s, 2, 1, 8),
            "F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 F4 B4 W3 F5 B5 W4 F6 B6 W5 F7 B7 W6 W7");
}

TEST(PipeSchedule, OneFOneBTwoStages) {
  const auto s = PipeSchedule::kOneFOneB;
  EXPECT_EQ(actions_text(s, 2, 0, 4), "F0 F1 B0 F2 B1 F3 B2 B3");
  EXPECT_EQ(actions_text(s, 2, 1, 4), "F0 B0 F1 B1 F2 B2 F3 B3");
  EXPECT_EQ(actions_text(s, 2, 0, 8), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7");
  EXPECT_EQ(actions_text(s, 2, 1, 8), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
}

bool ends_micro_batch(PipeSchedule s, PipeAction::Kind kind) {
  return kind == (splits_backward(s) ? PipeAction::Kind::kWeight : PipeAction::Kind::kBackward);
}

// The most micro-batches forwarded and not yet through their whole backward, replaying the
// actions.
int simulated_in_flight(PipeSchedule s, const std::vector<PipeAction>& actions) {
  int alive = 0, most = 0;
  for (const PipeAction& a : actions) {
    if (a.kind == PipeAction::Kind::kForward) ++alive;
    if (ends_micro_batch(s, a.kind)) --alive;
    most = std::max(most, alive);
  }
  return most;
}

// The most micro-batches between their B and their W (0 where backward is not split).
int simulated_awaiting_weight(PipeSchedule s, const std::vector<PipeAction>& actions) {
  if (!splits_backward(s)) return 0;
  int waiting = 0, most = 0;
  for (const PipeAction& a : actions) {
    if (a.kind == PipeAction::Kind::kBackward) ++waiting;
    if (a.kind == PipeAction::Kind::kWeight) --waiting;
    most = std::max(most, waiting);
  }
  return most;
}

TEST(PipeSchedule, EveryMicroBatchOnceInOrderAndInFlightMatches) {
  using Kind = PipeAction::Kind;
  for (PipeSchedule s :
       {PipeSchedule::kGPipe, PipeSchedule::kOneFOneB, PipeSchedule::kZeroBubbleH1}) {
    const bool split = splits_backward(s);
    for (int stages = 1; stages <= 6; ++stages) {
      for (int micro = 1; micro <= 10; ++micro) {
        for (int stage = 0; stage < stages; ++stage) {
          const auto actions = pipeline_actions(s, stages, stage, micro);
          const std::string where =
              fmt::format("{} stages {} stage {} micro {}: {}", pipe_schedule_name(s), stages,
                          stage, micro, to_text(actions));
          ASSERT_EQ(actions.size(), (split ? 3u : 2u) * micro) << where;
          std::vector<int> at[3] = {std::vector<int>(micro, -1), std::vector<int>(micro, -1),
                                    std::vector<int>(micro, -1)};
          int next[3] = {0, 0, 0};
          for (size_t i = 0; i < actions.size(); ++i) {
            const PipeAction& a = actions[i];
            ASSERT_TRUE(a.micro >= 0 && a.micro < micro) << where;
            ASSERT_TRUE(split || a.kind != Kind::kWeight) << where;
            const int k = static_cast<int>(a.kind);
            ASSERT_EQ(at[k][a.micro], -1) << "twice: " << where;
            at[k][a.micro] = static_cast<int>(i);
            // Every kind of pass in micro-batch order: gradients accumulate in one order.
            ASSERT_EQ(a.micro, next[k]++) << "out of order: " << where;
          }
          for (int m = 0; m < micro; ++m) {
            ASSERT_GE(at[0][m], 0) << where;
            ASSERT_LT(at[0][m], at[1][m]) << where;
            if (split) ASSERT_LT(at[1][m], at[2][m]) << where;
          }
          EXPECT_EQ(max_in_flight(s, stages, stage, micro), simulated_in_flight(s, actions))
              << where;
          EXPECT_EQ(max_awaiting_weight(s, stages, stage, micro),
                    simulated_awaiting_weight(s, actions))
              << where;
        }
      }
    }
  }
}

// All stages at once, as run_pipeline runs them: sends never block; a forward waits for the
// previous (virtual) stage's forward of that micro-batch and, from micro-batch k =
// max_in_flight on, for the previous stage to have posted the receive of backward(m − k)'s
// gradients (Note [Slot reuse] in src/train/pipeline_runner.cpp); a backward waits for the
// next stage's backward. Each round every stage runs as many actions as it can; a round without
// progress is a deadlock. With chunks (interleaved), chunk c of stage st is virtual stage
// c·stages + st, and the neighbours are virtual stages.
bool actions_complete(PipeSchedule s, const std::vector<std::vector<PipeAction>>& actions,
                      int micro, int chunks = 1) {
  const int stages = static_cast<int>(actions.size()), virtual_stages = stages * chunks;
  auto index_of = [&](int st, PipeAction a) {
    return static_cast<size_t>(std::find(actions[st].begin(), actions[st].end(), a) -
                               actions[st].begin());
  };
  // By virtual stage.
  std::vector<std::vector<char>> fwd_done(virtual_stages, std::vector<char>(micro, 0));
  std::vector<std::vector<char>> bwd_done(virtual_stages, std::vector<char>(micro, 0));
  std::vector<size_t> next(stages, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int st = 0; st < stages; ++st) {
      while (next[st] < actions[st].size()) {
        const PipeAction& a = actions[st][next[st]];
        const int vs = a.chunk * stages + st;
        const int k = max_in_flight(s, stages, st, micro, chunks, a.chunk);
        const bool forward = a.kind == PipeAction::Kind::kForward;
        bool ready = forward ? vs == 0 || fwd_done[vs - 1][a.micro]
                             : vs == virtual_stages - 1 || bwd_done[vs + 1][a.micro];
        if (forward && vs > 0 && a.micro >= k) {
          const int prev = (vs - 1) % stages, prev_chunk = (vs - 1) / stages;
          ready = ready && next[prev] >= index_of(prev, {PipeAction::Kind::kBackward, a.micro - k,
                                                         prev_chunk});
        }
        if (!ready) break;
        if (a.kind != PipeAction::Kind::kWeight) (forward ? fwd_done : bwd_done)[vs][a.micro] = 1;
        ++next[st];
        progress = true;
      }
    }
  }
  for (int st = 0; st < stages; ++st)
    if (next[st] != actions[st].size()) return false;
  return true;
}

bool schedule_completes(PipeSchedule s, int stages, int micro, int chunks = 1) {
  std::vector<std::vector<PipeAction>> actions;
  for (int st = 0; st < stages; ++st)
    actions.push_back(pipeline_actions(s, stages, st, micro, chunks));
  return actions_complete(s, actions, micro, chunks);
}

TEST(PipeSchedule, NoDeadlockForAnyStagesAndMicroBatches) {
  // The simulation does find a deadlock: stage 0 without its warm-up waits for B0 while
  // stage 1 waits for F1.
  const auto one_f_one_b = PipeSchedule::kOneFOneB;
  EXPECT_FALSE(actions_complete(
      one_f_one_b,
      {pipeline_actions(one_f_one_b, 3, 2, 4), pipeline_actions(one_f_one_b, 3, 1, 4),
       pipeline_actions(one_f_one_b, 3, 2, 4)},
      4));

  for (PipeSchedule s :
       {PipeSchedule::kGPipe, PipeSchedule::kOneFOneB, PipeSchedule::kZeroBubbleH1})
    for (int stages = 1; stages <= 8; ++stages)
      for (int micro = 1; micro <= 20; ++micro)
        EXPECT_TRUE(schedule_completes(s, stages, micro))
            << pipe_schedule_name(s) << " stages " << stages << " micro " << micro;
  for (int stages = 2; stages <= 6; ++stages)
    for (int chunks = 2; chunks <= 4; ++chunks)
      for (int micro = stages; micro <= 4 * stages; micro += stages)
        EXPECT_TRUE(schedule_completes(PipeSchedule::kInterleaved, stages, micro, chunks))
            << "interleaved stages " << stages << " chunks " << chunks << " micro " << micro;
}

// All stages' actions as a list schedule with pass costs F, B, W (an unsplit backward costs
// B + W; a chunk's passes 1/chunks of them): each starts when its stage is free and, for F
// and B, when the neighbour's pass of that micro-batch it depends on ended. Returns the
// makespan; transfers cost nothing.
double makespan(PipeSchedule s, int stages, int micro, double f, double b, double w,
                int chunks = 1) {
  using Kind = PipeAction::Kind;
  std::vector<std::vector<PipeAction>> actions;
  for (int st = 0; st < stages; ++st)
    actions.push_back(pipeline_actions(s, stages, st, micro, chunks));
  const double backward = (splits_backward(s) ? b : b + w) / chunks;
  f /= chunks;
  const int virtual_stages = stages * chunks;
  std::vector<std::vector<double>> fwd_end(virtual_stages, std::vector<double>(micro, -1));
  std::vector<std::vector<double>> bwd_end = fwd_end;
  std::vector<double> free_at(stages, 0);
  std::vector<size_t> next(stages, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int st = 0; st < stages; ++st) {
      for (; next[st] < actions[st].size(); ++next[st], progress = true) {
        const PipeAction& a = actions[st][next[st]];
        const int vs = a.chunk * stages + st;
        double ready = free_at[st], cost = w;
        if (a.kind == Kind::kForward) {
          if (vs > 0 && fwd_end[vs - 1][a.micro] < 0) break;
          if (vs > 0) ready = std::max(ready, fwd_end[vs - 1][a.micro]);
          cost = f;
        } else if (a.kind == Kind::kBackward) {
          if (vs < virtual_stages - 1 && bwd_end[vs + 1][a.micro] < 0) break;
          if (vs < virtual_stages - 1) ready = std::max(ready, bwd_end[vs + 1][a.micro]);
          cost = backward;
        }
        free_at[st] = ready + cost;
        if (a.kind == Kind::kForward) fwd_end[vs][a.micro] = free_at[st];
        if (a.kind == Kind::kBackward) bwd_end[vs][a.micro] = free_at[st];
      }
    }
  }
  for (int st = 0; st < stages; ++st)
    if (next[st] != actions[st].size()) return -1;  // deadlock
  return *std::max_element(free_at.begin(), free_at.end());
}

TEST(PipeSchedule, UnitCostMakespansAreThePapers) {
  // With F = B = W = 1: 1F1B's bubble is (p − 1)(F + B + W), so its makespan 3(m + p − 1);
  // ZB-H1's bubble is (p − 1)(F + B − W) (Qi et al. 2023, section 3), so 3m + p − 1, a third.
  for (int p = 1; p <= 6; ++p) {
    for (int m = p; m <= 3 * p + 2; ++m) {
      SCOPED_TRACE(fmt::format("p {} m {}", p, m));
      EXPECT_EQ(makespan(PipeSchedule::kOneFOneB, p, m, 1, 1, 1), 3.0 * (m + p - 1));
      EXPECT_EQ(makespan(PipeSchedule::kGPipe, p, m, 1, 1, 1), 3.0 * (m + p - 1));
      EXPECT_EQ(makespan(PipeSchedule::kZeroBubbleH1, p, m, 1, 1, 1), 3.0 * m + (p - 1));
    }
  }
}

TEST(PipeSchedule, BubbleModelIsTheUnitCostReplays) {
  for (PipeSchedule s :
       {PipeSchedule::kGPipe, PipeSchedule::kOneFOneB, PipeSchedule::kZeroBubbleH1}) {
    for (int p = 1; p <= 6; ++p) {
      for (int m = 1; m <= 12; ++m) {
        const double busy = 3.0 * m;  // every stage's F + B + W
        EXPECT_NEAR(bubble_model(s, p, m), 1 - busy / makespan(s, p, m, 1, 1, 1), 1e-12)
            << pipe_schedule_name(s) << " p " << p << " m " << m;
      }
    }
  }
  EXPECT_NEAR(bubble_model(PipeSchedule::kOneFOneB, 4, 8), 3.0 / 11, 1e-12);
  EXPECT_NEAR(bubble_model(PipeSchedule::kZeroBubbleH1, 4, 8), 3.0 / 27, 1e-12);
}

// ZB-H1 with a lighter W (a mixture's weight gradients in B: Note [Mixtures in B]): F 2, W
// from 0 to 2 of the 6 that F + B + W take, replayed; with no W it is 1F1B's bubble. (A W
// heavier than F is outside the model: the replay then stalls elsewhere.)
TEST(PipeSchedule, ZeroBubbleModelWithALighterWeightPassIsTheReplay) {
  const PipeSchedule zb = PipeSchedule::kZeroBubbleH1;
  for (double w : {0.0, 0.5, 1.0, 1.5, 2.0})
    for (int p = 1; p <= 6; ++p)
      for (int m = 1; m <= 12; ++m) {
        const double busy = 6.0 * m;
        EXPECT_NEAR(bubble_model(zb, p, m, 1, w / 6.0), 1 - busy / makespan(zb, p, m, 2, 4 - w, w),
                    1e-12)
            << "W " << w << " p " << p << " m " << m;
      }
  EXPECT_NEAR(bubble_model(zb, 4, 8, 1, 0), bubble_model(PipeSchedule::kOneFOneB, 4, 8), 1e-12);
}

// "F0.1" is micro-batch 0 of chunk 1.
std::string chunk_text(const std::vector<PipeAction>& actions) {
  std::string s;
  for (const PipeAction& a : actions) {
    if (!s.empty()) s += ' ';
    s += (a.kind == PipeAction::Kind::kForward ? 'F' : 'B') + std::to_string(a.micro) + "." +
         std::to_string(a.chunk);
  }
  return s;
}

std::string interleaved_text(int stages, int stage, int micro, int chunks) {
  return chunk_text(pipeline_actions(PipeSchedule::kInterleaved, stages, stage, micro, chunks));
}

TEST(PipeSchedule, InterleavedTwoStagesTwoChunks) {
  // Warm-up (p − s − 1)·2 + (v − 1)·p: 4 on stage 0, 2 on stage 1; forwards in groups of p
  // micro-batches through chunk 0 then chunk 1, backwards through chunk 1 then chunk 0.
  EXPECT_EQ(interleaved_text(2, 0, 4, 2),
            "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(interleaved_text(2, 1, 4, 2),
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(interleaved_text(2, 0, 8, 2),
            "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 F4.0 B2.1 F5.0 B3.1 "
            "F4.1 B2.0 F5.1 B3.0 F6.0 B4.1 F7.0 B5.1 F6.1 B4.0 F7.1 B5.0 B6.1 B7.1 B6.0 B7.0");
  EXPECT_EQ(interleaved_text(2, 1, 8, 2),
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 F4.0 B2.0 "
            "F5.0 B3.0 F4.1 B4.1 F5.1 B5.1 F6.0 B4.0 F7.0 B5.0 F6.1 B6.1 F7.1 B7.1 B6.0 B7.0");
}

TEST(PipeSchedule, InterleavedFourStagesTwoChunks) {
  // m = 4 on stage 0: the warm-up (10) covers every forward.
  EXPECT_EQ(interleaved_text(4, 0, 4, 2),
            "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 B0.1 B1.1 B2.1 B3.1 B0.0 B1.0 B2.0 B3.0");
  EXPECT_EQ(interleaved_text(4, 3, 4, 2),
            "F0.0 F1.0 F2.0 F3.0 F0.1 B0.1 F1.1 B1.1 F2.1 B2.1 F3.1 B3.1 B0.0 B1.0 B2.0 B3.0");
  EXPECT_EQ(interleaved_text(4, 0, 8, 2),
            "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 F4.0 F5.0 F6.0 B0.1 F7.0 B1.1 F4.1 B2.1 "
            "F5.1 B3.1 F6.1 B0.0 F7.1 B1.0 B2.0 B3.0 B4.1 B5.1 B6.1 B7.1 B4.0 B5.0 B6.0 B7.0");
  EXPECT_EQ(interleaved_text(4, 3, 8, 2),
            "F0.0 F1.0 F2.0 F3.0 F0.1 B0.1 F1.1 B1.1 F2.1 B2.1 F3.1 B3.1 F4.0 B0.0 F5.0 B1.0 "
            "F6.0 B2.0 F7.0 B3.0 F4.1 B4.1 F5.1 B5.1 F6.1 B6.1 F7.1 B7.1 B4.0 B5.0 B6.0 B7.0");
}

TEST(PipeSchedule, InterleavedEveryChunkPassOnceInOrder) {
  for (int p = 2; p <= 5; ++p)
    for (int v = 2; v <= 3; ++v)
      for (int m = p; m <= 3 * p; m += p)
        for (int st = 0; st < p; ++st) {
          const auto actions = pipeline_actions(PipeSchedule::kInterleaved, p, st, m, v);
          SCOPED_TRACE(
              fmt::format("p {} v {} m {} stage {}: {}", p, v, m, st, chunk_text(actions)));
          ASSERT_EQ(actions.size(), 2u * m * v);
          std::vector<int> next(2 * size_t(v), 0);  // per (kind, chunk): the next micro-batch
          std::vector<int> alive(size_t(v), 0), most(size_t(v), 0);
          for (const PipeAction& a : actions) {
            ASSERT_TRUE(a.chunk >= 0 && a.chunk < v);
            const bool fwd = a.kind == PipeAction::Kind::kForward;
            ASSERT_EQ(a.micro, next[size_t(2 * a.chunk + (fwd ? 0 : 1))]++);
            alive[size_t(a.chunk)] += fwd ? 1 : -1;
            ASSERT_GE(alive[size_t(a.chunk)], 0) << "a backward before its forward";
            most[size_t(a.chunk)] = std::max(most[size_t(a.chunk)], alive[size_t(a.chunk)]);
          }
          for (int c = 0; c < v; ++c)
            EXPECT_EQ(max_in_flight(PipeSchedule::kInterleaved, p, st, m, v, c), most[size_t(c)]);
        }
}

TEST(PipeSchedule, InterleavedBubbleIsOneFOneBsOverV) {
  // Narayanan et al. 2021: the bubble time shrinks by v, (p−1)/(v·m + p − 1) of the step.
  for (int p = 2; p <= 6; ++p)
    for (int v = 2; v <= 4; ++v)
      for (int m = p; m <= 3 * p; m += p) {
        SCOPED_TRACE(fmt::format("p {} v {} m {}", p, v, m));
        const double span = makespan(PipeSchedule::kInterleaved, p, m, 1, 1, 1, v);
        EXPECT_NEAR(span, 3.0 * m + 3.0 * (p - 1) / v, 1e-9);
        EXPECT_NEAR(bubble_model(PipeSchedule::kInterleaved, p, m, v), 1 - 3.0 * m / span, 1e-12);
      }
  EXPECT_NEAR(bubble_model(PipeSchedule::kInterleaved, 4, 8, 2), 3.0 / 19, 1e-12);
}

TEST(PipeSchedule, BadInterleavedShapesAreRefused) {
  auto refused = [](PipeSchedule s, int p, int m, int v, int layers, const char* words) {
    try {
      check_pipe_schedule(s, p, m, v, layers);
      ADD_FAILURE() << "no error for " << words;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::kBadInput);
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused(PipeSchedule::kOneFOneB, 2, 4, 2, 8,
          "parallel.virtual_stages: 2 needs parallel.schedule: interleaved");
  refused(PipeSchedule::kInterleaved, 4, 6, 2, 8,
          "train.accum 6 is not a multiple of parallel.pp 4 (use 4 or 8)");
  refused(PipeSchedule::kInterleaved, 4, 2, 2, 8,
          "train.accum 2 is not a multiple of parallel.pp 4 (use 4)");
  refused(PipeSchedule::kInterleaved, 4, 8, 2, 6, "= 8 model chunks, but model.layers is 6");
  refused(PipeSchedule::kInterleaved, 1, 4, 2, 8, "needs parallel.pp ≥ 2");
  refused(PipeSchedule::kInterleaved, 2, 4, 1, 8, "needs parallel.virtual_stages ≥ 2");
  EXPECT_NO_THROW(check_pipe_schedule(PipeSchedule::kInterleaved, 4, 8, 2, 8));
  EXPECT_NO_THROW(check_pipe_schedule(PipeSchedule::kOneFOneB, 4, 6, 1, 4));
}

TEST(PipeSchedule, MaxInFlight) {
  EXPECT_EQ(max_in_flight(PipeSchedule::kZeroBubbleH1, 4, 0, 8), 4);
  EXPECT_EQ(max_in_flight(PipeSchedule::kZeroBubbleH1, 4, 3, 8), 4);
  EXPECT_EQ(max_awaiting_weight(PipeSchedule::kZeroBubbleH1, 4, 3, 8), 4);
  EXPECT_EQ(max_awaiting_weight(PipeSchedule::kZeroBubbleH1, 4, 0, 8), 1);
  EXPECT_EQ(max_awaiting_weight(PipeSchedule::kOneFOneB, 4, 0, 8), 0);
  EXPECT_EQ(max_in_flight(PipeSchedule::kGPipe, 4, 0, 8), 8);
  EXPECT_EQ(max_in_flight(PipeSchedule::kOneFOneB, 4, 0, 8), 4);
  EXPECT_EQ(max_in_flight(PipeSchedule::kOneFOneB, 4, 3, 8), 1);
  EXPECT_EQ(max_in_flight(PipeSchedule::kOneFOneB, 4, 0, 2), 2);
}

TEST(PipeSchedule, ParseAndName) {
  EXPECT_EQ(parse_pipe_schedule("gpipe", "parallel.schedule"), PipeSchedule::kGPipe);
  EXPECT_EQ(parse_pipe_schedule("1f1b", "parallel.schedule"), PipeSchedule::kOneFOneB);
  EXPECT_EQ(parse_pipe_schedule("zb-h1", "parallel.schedule"), PipeSchedule::kZeroBubbleH1);
  EXPECT_EQ(parse_pipe_schedule("interleaved", "parallel.schedule"), PipeSchedule::kInterleaved);
  EXPECT_STREQ(pipe_schedule_name(PipeSchedule::kGPipe), "gpipe");
  EXPECT_STREQ(pipe_schedule_name(PipeSchedule::kOneFOneB), "1f1b");
  for (PipeSchedule s :
       {PipeSchedule::kGPipe, PipeSchedule::kOneFOneB, PipeSchedule::kZeroBubbleH1})
    EXPECT_EQ(parse_pipe_schedule(pipe_schedule_name(s), "k"), s);
  try {
    parse_pipe_schedule("zb-v", "parallel.schedule");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("parallel.schedule"), std::string::npos) << msg;
    EXPECT_NE(msg.find("zb-v"), std::string::npos) << msg;
    EXPECT_NE(msg.find("gpipe"), std::string::npos) << msg;
    EXPECT_NE(msg.find("1f1b"), std::string::npos) << msg;
    EXPECT_NE(msg.find("zb-h1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("interleaved"), std::string::npos) << msg;
  }
}

TEST(PipeSchedule, BadArgumentsAreRefused) {
  EXPECT_THROW(pipeline_actions(PipeSchedule::kGPipe, 2, 2, 4), Error);
  EXPECT_THROW(pipeline_actions(PipeSchedule::kOneFOneB, 0, 0, 4), Error);
  EXPECT_THROW(pipeline_actions(PipeSchedule::kOneFOneB, 2, 0, 0), Error);
  EXPECT_THROW(max_in_flight(PipeSchedule::kGPipe, 2, -1, 4), Error);
}

TEST(StageTensor, CountIsTheProductOfTheShape) {
  float x = 0;
  EXPECT_EQ((StageTensor{"h", {4, 64, 32}, &x}).count(), 4u * 64 * 32);
  EXPECT_EQ((StageTensor{"s", {}, &x}).count(), 1u);
  EXPECT_EQ((StageTensor{"e", {3, 0}, nullptr}).count(), 0u);
}

}  // namespace
}  // namespace trident
