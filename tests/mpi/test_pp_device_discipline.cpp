// Note [Backend memory] in every parallel layout: trained on a backend whose memory the host
// cannot touch (StrictDeviceBackend), with "device" communicators for dp and tp
// (StrictDeviceComm: as a device backend gets NcclComms) and, for the pipeline's transfers,
// either host copies over host MPI or device links (Note [Stage transfers on a device] in
// trident/pipeline.h), every layout equals the CPU backend's run of the same layout. Any host
// access to backend memory on these paths — a buffer handed to host MPI, a host loop over
// activations — crashes the test instead; a link transfer not ordered with compute fails it.
// Runs under mpirun with 2, 4 and 8 ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <limits>
#include <memory>

#include "strict_device_backend.h"
#include "strict_links.h"
#include "train_harness.h"
#include "trident/grad_reducer.h"

namespace trident {
namespace {

using testing::world_size;

Deck deck(int tp, int pp, std::vector<std::string> extra) {
  const std::string yaml = R"(
model: {layers: 4, d_model: 32, heads: 4, vocab: 250, seq_len: 16}
train: {micro_batch: 2, accum: 2, steps: 4, lr: 3.0e-3, warmup_steps: 1, seed: 5,
        val_every: 2, val_batches: 2}
data: {train: inputs/data/tiny-train.bin, valid: inputs/data/tiny-valid.bin, shuffle: true}
run: {threads: 1}
)";
  extra.push_back(fmt::format("parallel.tp={}", tp));
  extra.push_back(fmt::format("parallel.pp={}", pp));
  return parse_deck(yaml, TRIDENT_SOURCE_DIR, extra);
}

struct Outcome {
  std::vector<double> losses;
  double val = 0;
  size_t optimizer_floats = 0, model_floats = 0;  // AdamW's state per moment; the model's
  size_t step_copies_to_host = 0;                 // the strict backend's, over the steps
};

struct Outcome;
Outcome train(Backend& be, const Deck& d, ProcessGrid& grid, Communicator* dp, Communicator* tp,
              const StageLinks* links = nullptr, Communicator* embedding = nullptr);

Outcome train(Backend& be, const Deck& d, ProcessGrid& grid, Communicator* dp, Communicator* tp,
              const StageLinks* links, Communicator* embedding) {
  Trainer t(d, TrainContext{&be, 1e9, &grid, nullptr, dp, tp, links, embedding});
  Outcome o;
  auto* strict = dynamic_cast<testing::StrictDeviceBackend*>(&be);
  const size_t copies_before = strict ? strict->copies_to_host() : 0;
  for (int s = 0; s < d.train.steps; ++s) o.losses.push_back(t.train_step(s).loss);
  o.step_copies_to_host = strict ? strict->copies_to_host() - copies_before : 0;
  o.val = t.validate();
  o.optimizer_floats = t.optimizer().size();
  o.model_floats = t.model().num_params();
  return o;
}

void expect_layout_matches_cpu(int dp, int tp, int pp, std::vector<std::string> extra = {}) {
  SCOPED_TRACE(fmt::format("dp {} tp {} pp {}", dp, tp, pp));
  ProcessGrid grid(make_layout(world_size(), dp, tp, pp));
  const Deck d = deck(tp, pp, extra);
  auto cpu = make_cpu_backend(1);
  const Outcome want = train(*cpu, d, grid, nullptr, nullptr);
  testing::StrictDeviceBackend strict;
  testing::StrictDeviceComm dp_comm(strict, grid.dp()), tp_comm(strict, grid.tp());
  const Outcome got =
      train(strict, d, grid, dp > 1 ? &dp_comm : nullptr, tp > 1 ? &tp_comm : nullptr);
  // Same ops, same reductions, except the tied embedding's gradient: a device backend reduces
  // it whole rather than as dense part + sparse rows (Note [Tied embedding gradient]), which
  // sums in another order: 1e-5 relative, as the other layout tests.
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], want.losses[i], 1e-5 * std::abs(want.losses[i])) << "step " << i + 1;
  EXPECT_NEAR(got.val, want.val, 1e-5 * std::abs(want.val));
  // Sharded where the CPU run is: AdamW holds 1/dp of the model on both (ZeRO), all of it on
  // both otherwise.
  EXPECT_EQ(got.optimizer_floats, want.optimizer_floats);
  if (d.parallel.zero > 0 && dp > 1) EXPECT_LE(got.optimizer_floats * dp, got.model_floats);
}
// ZeRO-1 on a device backend (Note [ZeRO-1] in train/zero.h): the reduce-scatters and the
// parameter all-gathers run through the device communicator (here the strict one, as NcclComm
// would on a GPU), the shards and AdamW's moments live in device memory, and every host access
// goes through a copy. It must train as the CPU's ZeRO-1 does, in every layout with dp 2;
// the bound is the other layouts' 1e-5 (the device reduces wte whole, the CPU in dense part and
// rows). A sharded code path that read a shard or a gathered bucket on the host would crash.
TEST(DeviceDiscipline, ZeroOneInEveryDataParallelLayout) {
  const int world = world_size();
  if (world == 2) {
    expect_layout_matches_cpu(2, 1, 1, {"parallel.zero=1"});
  } else if (world == 4) {
    expect_layout_matches_cpu(2, 1, 2, {"parallel.zero=1"});
    expect_layout_matches_cpu(2, 2, 1, {"parallel.zero=1", "parallel.sequence_parallel=true"});
  } else {
    GTEST_SKIP() << "dp 2 layouts for 2 and 4 ranks";
  }
}

// The bf16 path (Note [bf16 activations]) with ZeRO-1 on a device backend. AdamW then updates
// only this rank's shard and does not write the bf16 weight copy (the other pieces arrive in
// fp32, by the gather), so forward must cast each block's weights after its gather, once per
// step (GPT::params16), and the second micro-batch must reuse that cast. Unsharded, AdamW
// writes the whole copy and forward casts nothing. The two train alike: 1e-5, as the layouts
// above (the gradient norm sums in another order when sharded). A copy left from the step
// before is one update (lr 3e-3) behind: about 1e-3 of the loss.
TEST(DeviceDiscipline, Bf16WithZeroOneCastsTheGatheredWeights) {
  if (world_size() != 2) GTEST_SKIP() << "dp 2 on 2 ranks";
  ProcessGrid grid(make_layout(2, 2, 1, 1));
  testing::StrictDeviceBackend strict;
  auto run = [&](const std::vector<std::string>& extra) {
    Deck d = deck(1, 1, extra);
    d.run.precision = "bf16";  // past the deck's refusal of a CPU run, for the test
    testing::StrictDeviceComm dp_comm(strict, grid.dp());
    return train(strict, d, grid, &dp_comm, nullptr);
  };
  const Outcome whole = run({}), sharded = run({"parallel.zero=1"});
  ASSERT_EQ(sharded.losses.size(), whole.losses.size());
  for (size_t i = 0; i < whole.losses.size(); ++i)
    EXPECT_NEAR(sharded.losses[i], whole.losses[i], 1e-5 * std::abs(whole.losses[i]))
        << "step " << i + 1;
  EXPECT_NEAR(sharded.val, whole.val, 1e-5 * std::abs(whole.val));
  EXPECT_LE(sharded.optimizer_floats * 2, sharded.model_floats);  // it did shard
}

// Note [Ready order check] on a device backend, which has no row sink
// (Note [Tied embedding gradient]): wte's gradient is final only after the embedding's
// backward, so the Trainer lays it out last. Then the buckets become ready in order (the check
// stays quiet), wte's is the last bucket, and the first bucket starts while backward still
// runs. Laid out first, wte's bucket 0 would be ready last and hold every bucket back until
// backward ended (this test would fail on all three). The CPU run (with the sink) is checked
// alike.
TEST(DeviceDiscipline, DataParallelBucketsStartDuringBackward) {
  if (world_size() != 2) GTEST_SKIP() << "dp 2 on 2 ranks";
  ProcessGrid grid(make_layout(2, 2, 1, 1));
  const Deck d = deck(1, 1,
                      {"model.layers=8", "model.d_model=128", "model.seq_len=64",
                       "comm.first_bucket_mb=0.05", "comm.bucket_mb=0.2"});
  auto cpu = make_cpu_backend(1);
  testing::StrictDeviceBackend strict;
  testing::StrictDeviceComm dp_comm(strict, grid.dp());
  for (Backend* be : {static_cast<Backend*>(cpu.get()), static_cast<Backend*>(&strict)}) {
    SCOPED_TRACE(be->is_device() ? "strict device backend" : "CPU backend");
    Trainer t(d, TrainContext{be, 1e9, &grid, nullptr, be->is_device() ? &dp_comm : nullptr});
    for (int step = 0; step < 2; ++step) {
      const StepStats s = t.train_step(step);
      EXPECT_EQ(s.warning, "") << "step " << step + 1;
      const ReduceStats& rs = t.reducer()->stats();
      EXPECT_EQ(rs.ahead_bucket, -1) << "step " << step + 1 << ": bucket " << rs.ahead_bucket
                                     << " waited for bucket " << rs.late_bucket;
      std::vector<const BucketRecord*> buckets;
      for (const BucketRecord& r : rs.records)
        if (r.bucket >= 0) buckets.push_back(&r);
      ASSERT_GE(buckets.size(), 4u);
      const BucketRecord& last = *buckets.back();
      if (be->is_device())  // the CPU's sink makes wte ready after the head, first
        EXPECT_NE(last.name.find("wte"), std::string::npos) << last.name;
      // Bucket 0 was started before the first block's gradients (the last bucket but one)
      // were ready: during backward, a whole model's backward before its end. Laid out first,
      // wte would be bucket 0, ready after that bucket, and bucket 0 cannot start before it is
      // ready. (When later buckets start depends here on the strict communicator, which
      // reduces one bucket at a time, and on the thread getting one of the 2 cores.)
      const BucketRecord& first_block = *buckets[buckets.size() - 2];
      EXPECT_LT(buckets[0]->start_ms, first_block.ready_ms)
          << buckets[0]->name << " started at " << buckets[0]->start_ms << " ms, "
          << first_block.name << " was ready at " << first_block.ready_ms << " ms";
      EXPECT_LT(buckets[1]->ready_ms, first_block.ready_ms) << buckets[1]->name;
    }
  }
}

TEST(DeviceDiscipline, EveryLayout) {
  const int world = world_size();
  if (world == 2) {
    expect_layout_matches_cpu(1, 1, 2);
    expect_layout_matches_cpu(1, 2, 1);
    expect_layout_matches_cpu(2, 1, 1);
  } else if (world == 4) {
    expect_layout_matches_cpu(2, 1, 2);
    expect_layout_matches_cpu(1, 2, 2, {"parallel.sequence_parallel=true"});
    expect_layout_matches_cpu(2, 2, 1);
  } else if (world == 8) {
    expect_layout_matches_cpu(2, 2, 2, {"parallel.sequence_parallel=true"});
  } else {
    GTEST_SKIP() << "layouts for 2, 4 and 8 ranks";
  }
}

// Note [Stage transfers on a device] with the strict backend and strict links, in every
// schedule: the boundary tensors go from device memory to device memory over the links (a
// host access to them crashes; a transfer not ordered after compute, or a receive read before
// compute waited for it, fails: StrictDeviceComm), and the tied wte is summed over the stages
// in device memory. The run must equal the host-staged one bit for bit (the same ops on the same
// data; only where the bytes travel differs) and so the CPU's within the layouts' 1e-5, and it
// must save the staging's copies to the host: per step and stage, one per micro-batch (stage
// 0's activations out, the last stage's gradients out) and one of wte's gradient.
void expect_links_match_staged(int dp, int pp, std::vector<std::string> extra) {
  SCOPED_TRACE(fmt::format("dp {} pp {} {}", dp, pp, fmt::join(extra, " ")));
  ProcessGrid grid(make_layout(world_size(), dp, 1, pp));
  const Deck d = deck(1, pp, extra);
  auto cpu = make_cpu_backend(1);
  const Outcome want = train(*cpu, d, grid, nullptr, nullptr);
  testing::StrictDeviceBackend strict;
  testing::StrictDeviceComm dp_comm(strict, grid.dp());
  Communicator* dpc = dp > 1 ? &dp_comm : nullptr;
  const Outcome staged = train(strict, d, grid, dpc, nullptr);
  auto links = testing::strict_links(strict, grid);
  const Outcome linked =
      train(strict, d, grid, dpc, nullptr, &links->links, links->embedding.get());
  EXPECT_GT(links->transfers(), 0u);
  ASSERT_EQ(linked.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_EQ(linked.losses[i], staged.losses[i]) << "step " << i + 1;
    EXPECT_NEAR(linked.losses[i], want.losses[i], 1e-5 * std::abs(want.losses[i]))
        << "step " << i + 1;
  }
  EXPECT_EQ(linked.val, staged.val);
  // Staged, each micro-batch's send from a chunk copies to the host: activations from every
  // virtual stage but the last, gradients from every one but the first; wte's sum one more.
  const int v = d.parallel.virtual_stages, stage = grid.coord().pp;
  size_t per_step = (stage == 0 || stage == pp - 1) ? 1 : 0;
  for (int chunk = 0; chunk < v; ++chunk) {
    const int vs = chunk * pp + stage;
    per_step += size_t(d.train.accum) * ((vs != pp * v - 1) + (vs != 0));
  }
  EXPECT_EQ(staged.step_copies_to_host - linked.step_copies_to_host,
            size_t(d.train.steps) * per_step)
      << "staged " << staged.step_copies_to_host << ", linked " << linked.step_copies_to_host;
}

TEST(DeviceDiscipline, PipelineOverDeviceLinksInEverySchedule) {
  const int world = world_size();
  if (world == 2) {
    for (const char* schedule : {"gpipe", "1f1b", "zb-h1"})
      expect_links_match_staged(1, 2, {fmt::format("parallel.schedule={}", schedule)});
    expect_links_match_staged(1, 2, {"parallel.schedule=interleaved", "parallel.virtual_stages=2"});
  } else if (world == 4) {
    expect_links_match_staged(2, 2, {"parallel.schedule=1f1b"});
    expect_links_match_staged(2, 2, {"parallel.schedule=1f1b", "parallel.zero=1"});
    expect_links_match_staged(1, 4,
                              {"parallel.schedule=interleaved", "parallel.virtual_stages=2",
                               "train.accum=4", "model.layers=8"});
  } else {
    GTEST_SKIP() << "pipeline layouts for 2 and 4 ranks";
  }
}

// The strict links themselves must catch the two mistakes they stand for: a transfer started
// without ordering after compute, and a received buffer read before compute waited for it.
TEST(DeviceDiscipline, StrictLinksCatchAMissingOrderOrWait) {
  if (world_size() != 2) GTEST_SKIP() << "one link of 2 ranks";
  ProcessGrid grid(make_layout(2, 1, 1, 2));
  testing::StrictDeviceBackend strict;
  auto links = testing::strict_links(strict, grid);
  const bool sender = grid.coord().pp == 0;
  Communicator& link = sender ? *links->links.send[0] : *links->links.recv[0];
  const size_t n = 64;
  BackendBuffer<float> buf(strict, n);
  std::vector<float> host(n, 0.0f);
  for (size_t i = 0; i < n; ++i) host[i] = float(i) + 0.5f;
  if (sender) strict.copy(buf.data(), host.data(), n * sizeof(float));
  // No mark at all: refused on both sides.
  EXPECT_THROW(sender ? link.send(buf.data(), n, 1) : link.recv(buf.data(), n, 0), Error);
  auto mark = link.new_mark(false);
  ASSERT_NE(mark, nullptr);
  link.record_mark(*mark);
  strict.fill_zero(host.data(), 0);  // a backend op after the mark: the mark is stale
  link.order_after(mark.get());
  EXPECT_THROW(sender ? link.send(buf.data(), n, 1) : link.recv(buf.data(), n, 0), Error);
  link.record_mark(*mark);
  link.order_after(mark.get());
  if (sender) {
    link.send(buf.data(), n, 1).wait();
    return;
  }
  Work w = link.recv(buf.data(), n, 0);
  w.wait();
  std::vector<float> got(n, 0.0f);
  strict.copy(got.data(), buf.data(), n * sizeof(float));
  EXPECT_TRUE(std::isnan(got[0])) << "complete on the link, but compute has not waited";
  link.compute_waits_for_comm();
  strict.copy(got.data(), buf.data(), n * sizeof(float));
  EXPECT_EQ(got, host);
}

}  // namespace
}  // namespace trident
