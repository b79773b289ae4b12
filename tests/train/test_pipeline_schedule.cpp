// Pipeline schedules (pure): exact GPipe and 1F1B sequences, every micro-batch forwarded and
// backwarded once, max_in_flight against a replay of the actions, and a simulation of all
// stages together (nonblocking sends, blocking receives) that finds no deadlock.
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
    s += (a.kind == PipeAction::Kind::kForward ? 'F' : 'B') + std::to_string(a.micro);
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
  EXPECT_EQ(actions_text(s, 4, 0, 8),
            "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  EXPECT_EQ(actions_text(s, 4, 1, 8),
            "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
  EXPECT_EQ(actions_text(s, 4, 2, 8),
            "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7");
  EXPECT_EQ(actions_text(s, 4, 3, 8),
            "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
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

// The most micro-batches forwarded and not yet backwarded, replaying the actions.
int simulated_in_flight(const std::vector<PipeAction>& actions) {
  int alive = 0, most = 0;
  for (const PipeAction& a : actions) {
    alive += a.kind == PipeAction::Kind::kForward ? 1 : -1;
    most = std::max(most, alive);
  }
  return most;
}

TEST(PipeSchedule, EveryMicroBatchOnceForwardBeforeBackwardAndInFlightMatches) {
  for (PipeSchedule s : {PipeSchedule::kGPipe, PipeSchedule::kOneFOneB}) {
    for (int stages = 1; stages <= 6; ++stages) {
      for (int micro = 1; micro <= 10; ++micro) {
        for (int stage = 0; stage < stages; ++stage) {
          const auto actions = pipeline_actions(s, stages, stage, micro);
          const std::string where = fmt::format("{} stages {} stage {} micro {}: {}",
                                                pipe_schedule_name(s), stages, stage, micro,
                                                to_text(actions));
          ASSERT_EQ(actions.size(), 2u * micro) << where;
          std::vector<int> forward_at(micro, -1), backward_at(micro, -1);
          int next_backward = 0;
          for (size_t i = 0; i < actions.size(); ++i) {
            const PipeAction& a = actions[i];
            ASSERT_TRUE(a.micro >= 0 && a.micro < micro) << where;
            auto& at = a.kind == PipeAction::Kind::kForward ? forward_at : backward_at;
            ASSERT_EQ(at[a.micro], -1) << "twice: " << where;
            at[a.micro] = static_cast<int>(i);
            if (a.kind == PipeAction::Kind::kBackward) {
              ASSERT_EQ(a.micro, next_backward++) << "backwards out of order: " << where;
            }
          }
          for (int m = 0; m < micro; ++m) {
            ASSERT_GE(forward_at[m], 0) << where;
            ASSERT_LT(forward_at[m], backward_at[m]) << where;
          }
          EXPECT_EQ(max_in_flight(s, stages, stage, micro), simulated_in_flight(actions)) << where;
        }
      }
    }
  }
}

// All stages at once, as run_pipeline runs them: sends never block; a forward waits for the
// previous stage's forward of that micro-batch and, from micro-batch k = max_in_flight on, for
// the previous stage to have posted the receive of backward(m − k)'s gradients (Note [Slot
// reuse] in pipeline_runner.cpp); a backward waits for the next stage's backward. Each round
// every stage runs as many actions as it can; a round without progress is a deadlock.
bool actions_complete(PipeSchedule s, const std::vector<std::vector<PipeAction>>& actions,
                      int micro) {
  const int stages = static_cast<int>(actions.size());
  auto index_of = [&](int st, PipeAction a) {
    return static_cast<size_t>(
        std::find(actions[st].begin(), actions[st].end(), a) - actions[st].begin());
  };
  std::vector<std::vector<char>> fwd_done(stages, std::vector<char>(micro, 0));
  std::vector<std::vector<char>> bwd_done(stages, std::vector<char>(micro, 0));
  std::vector<size_t> next(stages, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int st = 0; st < stages; ++st) {
      const int k = max_in_flight(s, stages, st, micro);
      while (next[st] < actions[st].size()) {
        const PipeAction& a = actions[st][next[st]];
        const bool forward = a.kind == PipeAction::Kind::kForward;
        bool ready = forward ? st == 0 || fwd_done[st - 1][a.micro]
                             : st == stages - 1 || bwd_done[st + 1][a.micro];
        if (forward && st > 0 && a.micro >= k)
          ready = ready && next[st - 1] >= index_of(st - 1, {PipeAction::Kind::kBackward,
                                                             a.micro - k});
        if (!ready) break;
        (forward ? fwd_done : bwd_done)[st][a.micro] = 1;
        ++next[st];
        progress = true;
      }
    }
  }
  for (int st = 0; st < stages; ++st)
    if (next[st] != actions[st].size()) return false;
  return true;
}

bool schedule_completes(PipeSchedule s, int stages, int micro) {
  std::vector<std::vector<PipeAction>> actions;
  for (int st = 0; st < stages; ++st) actions.push_back(pipeline_actions(s, stages, st, micro));
  return actions_complete(s, actions, micro);
}

TEST(PipeSchedule, NoDeadlockForAnyStagesAndMicroBatches) {
  // The simulation does find a deadlock: stage 0 without its warm-up waits for B0 while
  // stage 1 waits for F1.
  const auto one_f_one_b = PipeSchedule::kOneFOneB;
  EXPECT_FALSE(actions_complete(one_f_one_b, {pipeline_actions(one_f_one_b, 3, 2, 4),
                                 pipeline_actions(one_f_one_b, 3, 1, 4),
                                 pipeline_actions(one_f_one_b, 3, 2, 4)}, 4));

  for (PipeSchedule s : {PipeSchedule::kGPipe, PipeSchedule::kOneFOneB})
    for (int stages = 1; stages <= 8; ++stages)
      for (int micro = 1; micro <= 20; ++micro)
        EXPECT_TRUE(schedule_completes(s, stages, micro))
            << pipe_schedule_name(s) << " stages " << stages << " micro " << micro;
}

TEST(PipeSchedule, MaxInFlight) {
  EXPECT_EQ(max_in_flight(PipeSchedule::kGPipe, 4, 0, 8), 8);
  EXPECT_EQ(max_in_flight(PipeSchedule::kOneFOneB, 4, 0, 8), 4);
  EXPECT_EQ(max_in_flight(PipeSchedule::kOneFOneB, 4, 3, 8), 1);
  EXPECT_EQ(max_in_flight(PipeSchedule::kOneFOneB, 4, 0, 2), 2);
}

TEST(PipeSchedule, ParseAndName) {
  EXPECT_EQ(parse_pipe_schedule("gpipe", "parallel.schedule"), PipeSchedule::kGPipe);
  EXPECT_EQ(parse_pipe_schedule("1f1b", "parallel.schedule"), PipeSchedule::kOneFOneB);
  EXPECT_STREQ(pipe_schedule_name(PipeSchedule::kGPipe), "gpipe");
  EXPECT_STREQ(pipe_schedule_name(PipeSchedule::kOneFOneB), "1f1b");
  for (PipeSchedule s : {PipeSchedule::kGPipe, PipeSchedule::kOneFOneB})
    EXPECT_EQ(parse_pipe_schedule(pipe_schedule_name(s), "k"), s);
  try {
    parse_pipe_schedule("interleaved", "parallel.schedule");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("parallel.schedule"), std::string::npos) << msg;
    EXPECT_NE(msg.find("interleaved"), std::string::npos) << msg;
    EXPECT_NE(msg.find("gpipe"), std::string::npos) << msg;
    EXPECT_NE(msg.find("1f1b"), std::string::npos) << msg;
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
