// Shared by the mixture-of-experts device tests (tests/train and tests/mpi test_moe_device): a
// few steps of a deck on any backend, the mixture's figures recorded step by step, and the
// check that two such runs are the same bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "strict_device_backend.h"
#include "strict_links.h"
#include "strict_zero_run.h"
#include "train/data_parallel.h"
#include "trident/train.h"

namespace trident::testing {

struct MoeRun {
  std::vector<double> losses, norms, aux, z, load;
  std::vector<int64_t> dropped;
  double val = 0;                  // the validation loss; 0 without data.valid
  std::vector<float> params;       // this rank's (ZeRO-3: its shard), read through copies
  size_t copies_in_last_step = 0;  // the strict backend's reads of its memory (else 0)
};

// Trains d.train.steps steps on `be` in `context` (its backend set here), then validates
// where the deck has a validation set.
inline MoeRun run_moe(Backend& be, const Deck& d, TrainContext context) {
  context.backend = &be;
  Trainer t(d, context);
  MoeRun o;
  auto* strict = dynamic_cast<StrictDeviceBackend*>(&be);
  for (int s = 0; s < d.train.steps; ++s) {
    const size_t before = strict ? strict->copies_to_host() : 0;
    const StepStats st = t.train_step(s);
    if (strict) o.copies_in_last_step = strict->copies_to_host() - before;
    o.losses.push_back(st.loss);
    o.norms.push_back(st.grad_norm);
    o.aux.push_back(st.moe.aux_loss);
    o.z.push_back(st.moe.z_loss);
    o.load.push_back(st.moe.load_max_over_mean);
    o.dropped.push_back(st.moe.dropped);
  }
  if (!d.data.valid.empty()) o.val = t.validate();
  DataParallel* dp = t.data_parallel();
  if (dp && dp->zero3()) {  // a device holds the shards only (Note [No full weights on a device])
    o.params.resize(dp->shard_size());
    be.copy(o.params.data(), dp->shard_params(), o.params.size() * sizeof(float));
    return o;
  }
  t.sync_params();  // ZeRO-1/2: the last update's all-gather (else a race with the read)
  HostView<float> p(be, t.model().params(), t.model().num_params(), /*load=*/true);
  o.params.assign(p.data(), p.data() + p.size());
  return o;
}

// The run on the strict backend with a GPU run's device communicators: dp's, the gathers' and
// tp's (StrictComms), cp's ring, and the groups the Trainer splits (ep, expert-dp, the experts'
// gathers) through TrainContext::device_group, their number into *made. `links`: with pp, the
// stages' tensors over strict device links (Note [Stage transfers on a device]), else staged
// through host copies.
inline MoeRun run_moe_strict(const Deck& d, ProcessGrid& grid, size_t* made = nullptr,
                             bool links = false) {
  StrictDeviceBackend strict;
  const StrictComms comms(strict, grid, grid.layout().tp, grid.layout().dp_replicate);
  std::unique_ptr<StrictDeviceComm> cp;
  std::vector<std::unique_ptr<MpiComm>> hosts;
  TrainContext ctx;
  comms.attach(ctx);
  std::unique_ptr<StrictLinks> pp;
  if (links) {
    pp = strict_links(strict, grid);
    ctx.pp_links = &pp->links;
    ctx.embedding_device = pp->embedding.get();
  }
  if (grid.layout().cp > 1) {
    cp = std::make_unique<StrictDeviceComm>(strict, grid.cp());
    ctx.cp_device = cp.get();
  }
  ctx.device_group = strict_device_groups(strict, hosts, made);
  ctx.grid = &grid;
  return run_moe(strict, d, ctx);
}

inline void expect_same_moe_run(const MoeRun& got, const MoeRun& want) {
  EXPECT_EQ(got.losses, want.losses);
  EXPECT_EQ(got.norms, want.norms);
  EXPECT_EQ(got.aux, want.aux);
  EXPECT_EQ(got.z, want.z);
  EXPECT_EQ(got.load, want.load);
  EXPECT_EQ(got.dropped, want.dropped);
  EXPECT_EQ(got.val, want.val);
  EXPECT_EQ(got.params, want.params);
}

// The strict device run of `d` on `grid` equals the CPU backend's, bit for bit.
inline void expect_strict_moe_equals_cpu(const Deck& d, ProcessGrid& grid) {
  auto cpu = make_cpu_backend(1);
  TrainContext on_grid;
  on_grid.grid = &grid;
  const MoeRun want = run_moe(*cpu, d, on_grid);
  expect_same_moe_run(run_moe_strict(d, grid), want);
}

}  // namespace trident::testing
