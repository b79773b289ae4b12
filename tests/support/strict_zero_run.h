// Shared by the ZeRO device tests (tests/mpi test_zero3_device_discipline and
// test_zero_device_grad_pool): the strict run's device communicators over host communicators of
// their own, as a device's are, and a step loop that counts the strict backend's allocations
// and releases after the first step.
#pragma once

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "strict_device_backend.h"
#include "trident/deck.h"
#include "trident/grid.h"
#include "trident/train.h"

namespace trident::testing {

// A small ZeRO deck at `zero` on the layout. val_batches 3: uneven over dp 2 and 4, so
// validation's uncounted forwards (the ranks with fewer micro-batches, Trainer::validate) keep
// ZeRO-3's gathers paired, or the test hangs.
inline Deck zero_deck(int zero, int tp, int pp, std::vector<std::string> extra, int replicas = 1) {
  const std::string yaml = R"(
model: {layers: 4, d_model: 32, heads: 4, vocab: 250, seq_len: 16, tied_head: false}
train: {micro_batch: 2, accum: 1, steps: 4, lr: 3.0e-3, warmup_steps: 1, seed: 7,
        val_every: 0, val_batches: 3}
data: {train: inputs/data/tiny-train.bin, valid: inputs/data/tiny-valid.bin, shuffle: true}
comm: {bucket_mb: 0.02, first_bucket_mb: 0.005}
run: {threads: 1}
)";
  extra.push_back(fmt::format("parallel.zero={}", zero));
  extra.push_back(fmt::format("parallel.tp={}", tp));
  extra.push_back(fmt::format("parallel.pp={}", pp));
  extra.push_back(fmt::format("parallel.dp_replicate={}", replicas));
  return parse_deck(yaml, TRIDENT_SOURCE_DIR, extra);
}

struct StrictComms {
  std::unique_ptr<MpiComm> dp_host, gather_host;        // as a device comm is, the group's own
  std::unique_ptr<MpiComm> shard_host, replicate_host;  // HSDP's
  std::unique_ptr<StrictDeviceComm> dp, gather, tp, shard, replicate;

  // Note [HSDP]: with replicas the gathers and reduce-scatters run over dp_shard, the second hop
  // over the replicas. `gbps` > 0: the reduce-scatters' link is emulated at that speed.
  // `bf16_grads` (comm.grad_dtype bf16): the gradients' groups sum in bf16, as the backend
  // factory's NcclComms do (grad_bf16; Note [HSDP with bf16 gradients]).
  StrictComms(StrictDeviceBackend& strict, ProcessGrid& grid, int tp_size, int replicas,
              double gbps = 0, bool bf16_grads = false) {
    dp_host = MpiComm::duplicate(grid.gradients().raw(), "dp (test)");
    if (gbps > 0) dp_host->set_emulated_link(gbps, 0);
    MpiComm& shards = replicas > 1 ? grid.gradient_shards() : grid.gradients();
    gather_host = MpiComm::duplicate(shards.raw(), "dp gathers (test)");
    if (replicas > 1) {
      shard_host = MpiComm::duplicate(shards.raw(), "dp_shard (test)");
      replicate_host = MpiComm::duplicate(grid.dp_replicate().raw(), "dp_replicate (test)");
      shard = std::make_unique<StrictDeviceComm>(strict, *shard_host);
      replicate = std::make_unique<StrictDeviceComm>(strict, *replicate_host);
      shard->set_asynchronous(true);
      replicate->set_asynchronous(true);
    }
    for (MpiComm* c : {dp_host.get(), shard_host.get(), replicate_host.get()})
      if (c && bf16_grads) c->set_bf16_sums(true);
    dp = std::make_unique<StrictDeviceComm>(strict, *dp_host);
    gather = std::make_unique<StrictDeviceComm>(strict, *gather_host);
    dp->set_asynchronous(true);
    gather->set_asynchronous(true);
    if (tp_size > 1) tp = std::make_unique<StrictDeviceComm>(strict, grid.tp());
  }

  // `ctx` on the device communicators.
  void attach(TrainContext& ctx) const {
    ctx.dp_device = dp.get();
    ctx.tp_device = tp.get();
    ctx.dp_gather_device = gather.get();
    ctx.dp_shard_device = shard.get();
    ctx.dp_replicate_device = replicate.get();
  }
};

// TrainContext::device_group on the strict backend: each group over a host communicator of
// its own (kept in `hosts`), as an NcclComm is; those the reducer's thread drives (compute
// false: expert-dp, the experts' gathers) complete asynchronously, as on a stream: with ZeRO-3
// blocking ones on shared groups deadlock (the gathers and reduce-scatters interleave
// differently on each rank). `made`, if given, counts them.
inline auto strict_device_groups(StrictDeviceBackend& strict,
                                 std::vector<std::unique_ptr<MpiComm>>& hosts,
                                 size_t* made = nullptr) {
  return [&strict, &hosts, made](MpiComm& group, const char* name, bool compute) {
    if (made) ++*made;
    hosts.push_back(MpiComm::duplicate(group.raw(), name));
    auto c = std::make_unique<StrictDeviceComm>(strict, *hosts.back());
    c->set_asynchronous(!compute);
    return std::unique_ptr<Communicator>(std::move(c));
  };
}

// d.train.steps steps of `t`, each one's figures given to `record`; on the strict backend, the
// backend memory allocated and released in steps 2 on.
struct StepMemory {
  size_t allocations = 0, releases = 0;
};
inline StepMemory run_steps_counted(Trainer& t, Backend& be, int steps,
                                    const std::function<void(const StepStats&)>& record) {
  auto* strict = dynamic_cast<StrictDeviceBackend*>(&be);
  size_t allocations = 0, releases = 0;
  for (int s = 0; s < steps; ++s) {
    if (s == 1 && strict) {
      allocations = strict->allocations();
      releases = strict->releases();
    }
    record(t.train_step(s));
  }
  if (!strict) return {};
  return {strict->allocations() - allocations, strict->releases() - releases};
}

// A strict-device comparison's run: the steps' figures, this rank's whole parameters after the
// last update, and the backend allocations in steps 2 on. `ctx` names the communicators; its
// backend is set here.
struct StrictOutcome {
  std::vector<double> losses, norms;
  std::vector<float> params;
  size_t step_allocations = 0;
  bool tp_rings = false;  // the model ran parallel.tp_overlap's rings
};
inline StrictOutcome train_outcome(Backend& be, const Deck& d, TrainContext ctx) {
  ctx.backend = &be;
  Trainer t(d, ctx);
  StrictOutcome o;
  o.tp_rings = t.model().tp_overlap() != nullptr;
  o.step_allocations = run_steps_counted(t, be, d.train.steps, [&](const StepStats& st) {
                         o.losses.push_back(st.loss);
                         o.norms.push_back(st.grad_norm);
                       }).allocations;
  t.sync_params();
  o.params.resize(t.model().num_params());
  be.copy(o.params.data(), t.model().params(), o.params.size() * sizeof(float));
  return o;
}
// Bit for bit, and nothing allocated after step 1.
inline void expect_same_outcome(const StrictOutcome& got, const StrictOutcome& want) {
  EXPECT_EQ(got.losses, want.losses);
  EXPECT_EQ(got.norms, want.norms);
  ASSERT_EQ(got.params.size(), want.params.size());
  EXPECT_TRUE(got.params.empty() || std::memcmp(got.params.data(), want.params.data(),
                                                got.params.size() * sizeof(float)) == 0)
      << "the parameters differ";
  EXPECT_EQ(got.step_allocations, 0u) << "backend allocations during steps 2 on";
}

}  // namespace trident::testing
