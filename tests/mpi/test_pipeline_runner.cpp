// run_pipeline under MPI, with the world (or part of it) as the pipeline: a toy model whose
// every stage scales its input by a per-stage weight, checked against the analytic result for
// GPipe, 1F1B and ZB-H1 (bitwise equal to each other), and a shape mismatch that the receiving
// stage reports, naming both shapes, while every other rank ends at the comm timeout.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>

#include "trident/check.h"
#include "trident/grid.h"
#include "trident/pipeline.h"

namespace trident {
namespace {

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// Powers of two, so every product and sum below is exact in fp32 and the analytic result can
// be compared with ==.
float stage_weight(int stage) { return std::ldexp(1.0f, stage % 3 - 1); }  // 0.5, 1, 2, 0.5, ...

struct ToyShape {
  int64_t batch = 2, seq = 3, width = 4;  // "hidden" [batch, seq, width]
  int64_t aux = 5;                        // "aux" [batch, aux]
  size_t hidden_count() const { return static_cast<size_t>(batch * seq * width); }
  size_t aux_count() const { return static_cast<size_t>(batch * aux); }
};

float input_hidden(int micro, size_t i) { return static_cast<float>(i % 7) + micro; }
float input_aux(int micro, size_t i) { return static_cast<float>(i % 3) - micro; }
float target_hidden(size_t i) { return static_cast<float>(i % 5) - 2; }

// Stage s maps (h, a) to (w·h, a + w). The last stage's loss is Σ target·h + Σ a, so the
// gradients flowing back are dh = target·Π(later weights), da = 1, and dw_s = Σ dh_out·h_in +
// Σ da_out, accumulated over micro-batches.
//
// Like a real model it keeps micro-batch m in slot m mod max_in_flight and computes the input
// gradient in place, into the buffer the input was received in — so a runner that reused a
// slot before its backward send completed would corrupt the previous stage's gradients (with
// large tensors, which MPI sends only once the receiver is ready). Split (zb-h1), its
// backward_input keeps the input for backward_weight, which reads the received gradient
// again: a runner that received into a slot before its W ran would change dw.
class ToyStage : public PipelineStage {
 public:
  ToyStage(PipeSchedule schedule, int stages, int stage, int micro_batches, ToyShape shape)
      : stages_(stages), stage_(stage), shape_(shape), w_(stage_weight(stage)),
        slots_(max_in_flight(schedule, stages, stage, micro_batches)), seen_(micro_batches) {
    for (auto* v : {&in_h_, &out_h_, &dout_h_, &kept_h_})
      v->assign(slots_, std::vector<float>(shape.hidden_count()));
    for (auto* v : {&in_a_, &out_a_, &dout_a_})
      v->assign(slots_, std::vector<float>(shape.aux_count()));
  }

  // A stage that declares a different shape for one micro-batch's forward input.
  void expect_wrong_input(int micro, std::vector<int64_t> hidden_shape) {
    wrong_micro_ = micro;
    wrong_shape_ = std::move(hidden_shape);
    wrong_buffer_.resize(StageTensor{"", wrong_shape_, nullptr}.count());
  }
  void expect_only_hidden() { only_hidden_ = true; }

  std::vector<StageTensor> forward_inputs(int m, int) override {
    const int k = m % slots_;
    if (m == wrong_micro_) return {{"hidden", wrong_shape_, wrong_buffer_.data()}, aux(in_a_[k])};
    if (only_hidden_) return {hidden(in_h_[k])};
    return {hidden(in_h_[k]), aux(in_a_[k])};
  }
  void forward(int m, int) override {
    log_.push_back({PipeAction::Kind::kForward, m});
    const int k = m % slots_;
    if (stage_ == 0) {
      for (size_t i = 0; i < in_h_[k].size(); ++i) in_h_[k][i] = input_hidden(m, i);
      for (size_t i = 0; i < in_a_[k].size(); ++i) in_a_[k][i] = input_aux(m, i);
    }
    for (size_t i = 0; i < out_h_[k].size(); ++i) out_h_[k][i] = w_ * in_h_[k][i];
    for (size_t i = 0; i < out_a_[k].size(); ++i) out_a_[k][i] = in_a_[k][i] + w_;
    seen_[m] = in_h_[k];
    seen_[m].insert(seen_[m].end(), in_a_[k].begin(), in_a_[k].end());
  }
  std::vector<StageTensor> forward_outputs(int m, int) override {
    return {hidden(out_h_[m % slots_]), aux(out_a_[m % slots_])};
  }
  std::vector<StageTensor> backward_inputs(int m, int) override {
    return {hidden(dout_h_[m % slots_]), aux(dout_a_[m % slots_])};
  }
  void backward(int m, int) override {
    log_.push_back({PipeAction::Kind::kBackward, m});
    backward_part(m, true);
  }
  bool can_split_backward() const override { return true; }
  void backward_input(int m, int) override {
    log_.push_back({PipeAction::Kind::kBackward, m});
    backward_part(m, false);
  }
  void backward_weight(int m, int) override {
    log_.push_back({PipeAction::Kind::kWeight, m});
    const int k = m % slots_;
    for (size_t i = 0; i < dout_h_[k].size(); ++i) dw_ += dout_h_[k][i] * kept_h_[k][i];
    for (size_t i = 0; i < dout_a_[k].size(); ++i) dw_ += dout_a_[k][i];
  }
  void backward_part(int m, bool weights) {
    const int k = m % slots_;
    if (stage_ == stages_ - 1) {
      for (size_t i = 0; i < dout_h_[k].size(); ++i) dout_h_[k][i] = target_hidden(i);
      std::fill(dout_a_[k].begin(), dout_a_[k].end(), 1.0f);
    }
    for (size_t i = 0; i < dout_h_[k].size(); ++i) {
      if (weights) dw_ += dout_h_[k][i] * in_h_[k][i];
      kept_h_[k][i] = in_h_[k][i];
      in_h_[k][i] = w_ * dout_h_[k][i];  // the input's gradient, in place
    }
    for (size_t i = 0; i < dout_a_[k].size(); ++i) {
      if (weights) dw_ += dout_a_[k][i];
      in_a_[k][i] = dout_a_[k][i];
    }
    seen_[m].insert(seen_[m].end(), in_h_[k].begin(), in_h_[k].end());
    seen_[m].insert(seen_[m].end(), in_a_[k].begin(), in_a_[k].end());
    // The forward outputs' buffers are the model's again (the runner completed their send).
    std::fill(out_h_[k].begin(), out_h_[k].end(), -1e30f);
  }
  std::vector<StageTensor> backward_outputs(int m, int) override {
    return {hidden(in_h_[m % slots_]), aux(in_a_[m % slots_])};
  }

  float dw() const { return dw_; }
  const std::vector<PipeAction>& log() const { return log_; }
  // Per micro-batch: the inputs (hidden, aux) as forward saw them, then their gradients.
  const std::vector<std::vector<float>>& seen() const { return seen_; }

 private:
  StageTensor hidden(std::vector<float>& v) {
    return {"hidden", {shape_.batch, shape_.seq, shape_.width}, v.data()};
  }
  StageTensor aux(std::vector<float>& v) { return {"aux", {shape_.batch, shape_.aux}, v.data()}; }

  int stages_, stage_;
  ToyShape shape_;
  float w_;
  int slots_;
  float dw_ = 0;
  std::vector<std::vector<float>> in_h_, in_a_, out_h_, out_a_, dout_h_, dout_a_, kept_h_;
  std::vector<std::vector<float>> seen_;
  std::vector<PipeAction> log_;
  int wrong_micro_ = -1;
  std::vector<int64_t> wrong_shape_;
  std::vector<float> wrong_buffer_;
  bool only_hidden_ = false;
};

struct ToyResult {
  float dw = 0;
  std::vector<std::vector<float>> values;  // ToyStage::seen()
  PipelineStats stats;
};

ToyResult run_toy(Communicator& pp, PipeSchedule schedule, int micro_batches, ToyShape shape = {}) {
  const int stages = pp.size(), stage = pp.rank();
  ToyStage model(schedule, stages, stage, micro_batches, shape);
  ToyResult r;
  r.stats = run_pipeline(schedule, pp, stages, stage, micro_batches, model);
  EXPECT_EQ(model.log(), pipeline_actions(schedule, stages, stage, micro_batches));
  r.dw = model.dw();
  r.values = model.seen();
  return r;
}

// What stage `stage` of `stages` must have seen, from the formulas in ToyStage's comment.
void expect_analytic(const ToyResult& r, int stages, int stage, int micro_batches, ToyShape shape) {
  float before = 1, after = 1, shift = 0;  // Π weights before / from this stage; Σ before
  for (int s = 0; s < stage; ++s) before *= stage_weight(s), shift += stage_weight(s);
  for (int s = stage; s < stages; ++s) after *= stage_weight(s);
  const float later = after / stage_weight(stage);  // Π weights after this stage
  float dw = 0;
  for (int m = 0; m < micro_batches; ++m) {
    const std::vector<float>& v = r.values[m];
    const size_t nh = shape.hidden_count(), na = shape.aux_count();
    ASSERT_EQ(v.size(), 2 * (nh + na));
    for (size_t i = 0; i < nh; ++i) {
      ASSERT_EQ(v[i], before * input_hidden(m, i)) << "hidden, micro " << m << " i " << i;
      ASSERT_EQ(v[nh + na + i], after * target_hidden(i)) << "dhidden, micro " << m;
      dw += later * target_hidden(i) * v[i];
    }
    for (size_t i = 0; i < na; ++i) {
      ASSERT_EQ(v[nh + i], input_aux(m, i) + shift) << "aux, micro " << m << " i " << i;
      ASSERT_EQ(v[2 * nh + na + i], 1.0f) << "daux, micro " << m;
      dw += 1.0f;
    }
  }
  EXPECT_EQ(r.dw, dw);
}

TEST(Pipeline, ToyModelMatchesTheAnalyticResultAndSchedulesAgreeBitwise) {
  ProcessGrid grid(make_layout(world_size(), 1, 1, world_size()));
  MpiComm& pp = grid.pp();
  const int stages = pp.size(), stage = pp.rank();
  for (int micro : {1, 2, 3, 5, 8}) {
    SCOPED_TRACE(fmt::format("{} stages, {} micro-batches", stages, micro));
    const ToyResult gpipe = run_toy(pp, PipeSchedule::kGPipe, micro);
    const ToyResult one_f_one_b = run_toy(pp, PipeSchedule::kOneFOneB, micro);
    const ToyResult zb = run_toy(pp, PipeSchedule::kZeroBubbleH1, micro);
    expect_analytic(gpipe, stages, stage, micro, {});
    expect_analytic(one_f_one_b, stages, stage, micro, {});
    expect_analytic(zb, stages, stage, micro, {});
    EXPECT_EQ(gpipe.values, one_f_one_b.values);
    EXPECT_EQ(zb.values, one_f_one_b.values);
    EXPECT_EQ(std::memcmp(&gpipe.dw, &one_f_one_b.dw, sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(&zb.dw, &one_f_one_b.dw, sizeof(float)), 0);
    // Two tensors per boundary crossing, in each direction this stage sends.
    const int sending_directions = (stage > 0) + (stage < stages - 1);
    EXPECT_EQ(one_f_one_b.stats.messages_sent, sending_directions * micro);
    EXPECT_EQ(one_f_one_b.stats.bytes_sent,
              sending_directions * micro * (ToyShape{}.hidden_count() + ToyShape{}.aux_count()) *
                  sizeof(float));
    EXPECT_GE(one_f_one_b.stats.total_ms, one_f_one_b.stats.compute_ms);
  }
}

// Large tensors go through MPI's rendezvous protocol: a send moves only while the sender is
// inside MPI (no progress thread) and completes only once the receiver posted its receive,
// which is what Note [Slot reuse] guards. Several pipelines side by side (dp 2 × pp world/2, or
// dp 2 × pp 1 on two ranks) must not hear each other.
TEST(Pipeline, LargeTensorsAndSideBySidePipelines) {
  const ToyShape big{2, 128, 512, 3000};  // "hidden" is 512 KiB
  for (int dp : {1, 2}) {
    ProcessGrid grid(make_layout(world_size(), dp, 1, world_size() / dp));
    MpiComm& pp = grid.pp();
    for (PipeSchedule s :
         {PipeSchedule::kGPipe, PipeSchedule::kOneFOneB, PipeSchedule::kZeroBubbleH1}) {
      SCOPED_TRACE(fmt::format("dp {}, {} stages, {}", dp, pp.size(), pipe_schedule_name(s)));
      const ToyResult r = run_toy(pp, s, 5, big);
      expect_analytic(r, pp.size(), pp.rank(), 5, big);
    }
  }
}

// Tags repeat every 512 micro-batches (Note [Pipeline messages]); MPI's ordering keeps the
// pairs right.
TEST(Pipeline, MoreMicroBatchesThanTheTagPeriod) {
  ProcessGrid grid(make_layout(world_size(), 1, 1, world_size()));
  MpiComm& pp = grid.pp();
  const ToyShape small{1, 1, 2, 1};
  for (PipeSchedule s :
       {PipeSchedule::kGPipe, PipeSchedule::kOneFOneB, PipeSchedule::kZeroBubbleH1}) {
    const ToyResult r = run_toy(pp, s, 1100, small);
    expect_analytic(r, pp.size(), pp.rank(), 1100, small);
  }
}

// A stage without backward_input/backward_weight is refused zb-h1 before anything moves.
class UnsplitStage : public PipelineStage {
 public:
  std::vector<StageTensor> forward_inputs(int, int) override { return {}; }
  void forward(int, int) override {}
  std::vector<StageTensor> forward_outputs(int, int) override { return {}; }
  std::vector<StageTensor> backward_inputs(int, int) override { return {}; }
  void backward(int, int) override {}
  std::vector<StageTensor> backward_outputs(int, int) override { return {}; }
};

TEST(Pipeline, ZeroBubbleNeedsASplitBackward) {
  MpiComm self(MPI_COMM_SELF, "self");
  UnsplitStage model;
  try {
    run_pipeline(PipeSchedule::kZeroBubbleH1, self, 1, 0, 2, model);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    EXPECT_NE(std::string(e.what()).find("zb-h1 splits each backward"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(run_pipeline(PipeSchedule::kOneFOneB, self, 1, 0, 2, model));
  // Interleaved needs a stage of several chunks.
  try {
    run_pipeline(PipeSchedule::kInterleaved, self, 1, 0, 2, model);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    EXPECT_NE(std::string(e.what()).find("interleaved needs stages of 2 or more"),
              std::string::npos)
        << e.what();
  }
}

TEST(Pipeline, OneStageSendsNothing) {
  MpiComm self(MPI_COMM_SELF, "self");
  for (PipeSchedule s :
       {PipeSchedule::kGPipe, PipeSchedule::kOneFOneB, PipeSchedule::kZeroBubbleH1}) {
    const ToyResult r = run_toy(self, s, 4);
    expect_analytic(r, 1, 0, 4, {});
    EXPECT_EQ(r.stats.messages_sent, 0);
    EXPECT_EQ(r.stats.bytes_received, 0u);
  }
}

// Runs the toy pipeline with `configure` applied to the last stage's model and returns the
// message of the Error each rank caught ("" if none). The receiving stage throws at once; its
// neighbours then wait for messages that never come and end at the (short) comm timeout —
// so no rank hangs, and the test ends within a few seconds.
std::string run_expecting_error(PipeSchedule schedule, int micro_batches,
                                const std::function<void(ToyStage&)>& configure) {
  ProcessGrid grid(make_layout(world_size(), 1, 1, world_size()));
  grid.set_timeout(2.0);
  MpiComm& pp = grid.pp();
  ToyStage model(schedule, pp.size(), pp.rank(), micro_batches, {});
  if (pp.rank() == pp.size() - 1) configure(model);
  std::string caught;
  try {
    run_pipeline(schedule, pp, pp.size(), pp.rank(), micro_batches, model);
  } catch (const Error& e) {
    caught = e.what();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return caught;
}

TEST(Pipeline, ShapeMismatchNamesBothShapesOnTheReceivingStage) {
  const auto start = std::chrono::steady_clock::now();
  const std::string msg = run_expecting_error(PipeSchedule::kOneFOneB, 4, [](ToyStage& m) {
    m.expect_wrong_input(2, {2, 3, 8});
  });
  int stage = 0, stages = world_size();
  MPI_Comm_rank(MPI_COMM_WORLD, &stage);
  if (stage == stages - 1) {
    EXPECT_NE(msg.find(fmt::format("stage {} expected 'hidden' [2, 3, 8] from stage {} for "
                                   "micro-batch 2 (activations) but received 'hidden' [2, 3, 4]",
                                   stage, stage - 1)),
              std::string::npos)
        << msg;
  } else {
    // Every other rank waited for a message the failed stage never sent, and timed out.
    EXPECT_NE(msg.find("did not complete within the timeout"), std::string::npos) << msg;
    EXPECT_NE(msg.find(fmt::format("pipeline: stage {} receiving the", stage)), std::string::npos)
        << msg;
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 15);
}

TEST(Pipeline, TensorCountMismatchListsBothSides) {
  const std::string msg =
      run_expecting_error(PipeSchedule::kGPipe, 2, [](ToyStage& m) { m.expect_only_hidden(); });
  int stage = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &stage);
  if (stage == world_size() - 1)
    EXPECT_NE(
        msg.find("expected 1 tensor 'hidden' [2, 3, 4] from stage " + std::to_string(stage - 1) +
                 " for micro-batch 0 (activations) but "
                 "received 2 tensors 'hidden' [2, 3, 4], 'aux' [2, 5]"),
        std::string::npos)
        << msg;
  else EXPECT_NE(msg.find("timeout"), std::string::npos) << msg;
}

}  // namespace
}  // namespace trident
