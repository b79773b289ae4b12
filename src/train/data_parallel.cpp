#include "train/data_parallel.h"

#include <algorithm>

#include "trident/check.h"
#include "trident/grid.h"
#include "trident/pipeline.h"
#include "trident/trace.h"

namespace trident {
namespace {

size_t mib_to_bytes(double mb) {
  const double bytes = mb * 1024.0 * 1024.0;
  return bytes >= double(kOneBucket) ? kOneBucket : size_t(bytes);
}

}  // namespace

void DataParallel::check_deck(const Deck& deck, bool device, int chunks, bool split_backward) {
  // Note [ZeRO-1] (train/zero.h). Refused before anything is allocated.
  const int zero = deck.parallel.zero;
  if (deck.parallel.zero_reduce == "micro_batch" && (zero < 2 || chunks > 1 || split_backward))
    input_error("parallel.zero_reduce: micro_batch needs parallel.zero 2 or 3 (got {}), one chunk "
                "per stage (parallel.virtual_stages {}) and a schedule whose backward is one pass "
                "(parallel.schedule {}); use parallel.zero_reduce: step",
                zero, chunks, deck.parallel.schedule);
  // Note [When gradients are pooled] (train/grad_pool.h): on a device every micro-batch's round
  // writes into the pool, whose slots are zeroed as the link frees them; that needs overlap.
  if (zero >= 2 && device && deck.parallel.zero_reduce == "micro_batch" && !deck.comm.overlap)
    input_error("parallel.zero: {} with parallel.zero_reduce micro_batch on a device needs "
                "comm.overlap true: each round's gradients are written into a pool of slots "
                "that the reduce-scatters free as backward goes; use comm.overlap: true or "
                "parallel.zero_reduce: step",
                zero);
  // Note [bf16 unit gathers] (train/zero3_pool.h): the units' bf16 weights live in the pool.
  if (zero == 3 && deck.run.precision != "fp32" && !device)
    input_error("parallel.zero: 3 with run.precision {} needs a device backend: the bf16 "
                "weights are gathered into its unit pool; use run.precision fp32 on the host",
                deck.run.precision);
}

size_t DataParallel::first_bucket_bytes(const CommConfig& comm) {
  return mib_to_bytes(comm.first_bucket_mb);
}

size_t DataParallel::bucket_bytes(const CommConfig& comm) { return mib_to_bytes(comm.bucket_mb); }

DataParallel::DataParallel(const Deck& deck, const TrainContext& ctx) : deck_(deck), ctx_(ctx) {
  // Note [Context parallelism] (model/cp_attention.h): cp ranks hold the same parameters, so
  // the gradients reduce over dp × cp and ZeRO shards over it (dp_cp, dp_shard_cp; with cp 1
  // they are dp and dp_shard).
  TRIDENT_CHECK(ctx_.grid && ctx_.grid->layout().dp * ctx_.grid->layout().cp > 1,
                "DataParallel without dp × cp > 1");
  size_ = ctx_.grid->gradients().size();
  rank_ = ctx_.grid->gradients().rank();
  // Note [HSDP]: with replicas, ZeRO shards over dp_shard (× cp) only.
  replicas_ = ctx_.grid->layout().dp_replicate;
  const bool by_shard = deck_.parallel.zero > 0 && replicas_ > 1;
  shard_ranks_ = by_shard ? ctx_.grid->gradient_shards().size() : size_;
  shard_rank_ = by_shard ? ctx_.grid->gradient_shards().rank() : rank_;
  writes_shard_ = shard_ranks_ == size_ || ctx_.grid->coord().dp_replicate == 0;
  if (ctx_.backend->is_device() && !ctx_.dp_device)
    internal_error(__FILE__, __LINE__, "a device backend with dp > 1 needs a device communicator");
  sharded_ = deck_.parallel.zero > 0;
  device_ = ctx_.backend->is_device();
  // Note [ZeRO-2 on the host]; a device pools its gradients or keeps them whole
  release_grads_ = sharded_ && deck_.parallel.zero >= 2 && !device_;
  zero3_ = deck_.parallel.zero == 3;  // Note [ZeRO-3 units]
  // Note [Gradients in unit slots] (train/grad_pool.h).
  const PipeSchedule schedule = parse_pipe_schedule(deck_.parallel.schedule, "parallel.schedule");
  pooled_grads_ = trident::pools_grads(deck_, device_, splits_backward(schedule));
}

DataParallel::~DataParallel() {
  // Gathers still in flight must end before the communicator and the buffers go.
  try {
    if (zero3_ && unit_gathers_) unit_gathers_->release_all();
    else sync_params();
  } catch (...) {
  }
}

bool DataParallel::reduces_every_micro_batch() const {
  return (release_grads_ || pooled_grads_) && deck_.parallel.zero_reduce == "micro_batch";
}

void DataParallel::lay_out(const std::vector<ParamInfo>& params, int split_param,
                           const std::vector<int>& piece_rows, int row_elems, int alone_param,
                           GPTOptions& options) {
  split_param_ = split_param;
  piece_rows_ = piece_rows;
  row_elems_ = row_elems;
  const GradUnits units = grad_units(params, split_param, piece_rows, row_elems);
  // Note [Padded buckets] (trident/buckets.h): the pieces of a split parameter each get a bucket.
  alone_.clear();
  expert_.clear();
  for (size_t i = 0; i < params.size(); ++i)
    for (int u = units.first[i]; u < units.first[i + 1]; ++u) {
      // Note [Expert parallelism]: an ep-split expert tensor reduces (and shards) over its own
      // replicas, so it has a bucket of its own.
      const bool expert = ctx_.expert_dp && params[i].expert;
      alone_.push_back(int(i) == alone_param || units.pieces[size_t(u)] || expert);
      expert_.push_back(expert);
    }
  if (!sharded_) return;
  // Note [ZeRO-3 units]: a bucket never holds two units.
  breaks_.clear();
  if (deck_.parallel.zero >= 2) {  // ZeRO-2 too (Note [When gradients are pooled])
    const std::vector<std::string> names = zero3_unit_names(params);
    for (size_t i = 0; i < params.size(); ++i)
      for (int u = units.first[i]; u < units.first[i + 1]; ++u)
        breaks_.push_back(i > 0 && u == units.first[i] && names[i] != names[i - 1]);
  }
  // Note [bf16 unit gathers]: a weight read only in bf16 is gathered in bf16, alone in its bucket.
  gather_bf16_.clear();
  if (zero3_ && device_ && deck_.run.precision == "bf16") {
    for (size_t i = 0; i < params.size(); ++i)
      for (int u = units.first[i]; u < units.first[i + 1]; ++u)
        gather_bf16_.push_back(read_as_bf16(params[i]));
    for (size_t u = 0; u < alone_.size(); ++u) alone_[u] = alone_[u] || gather_bf16_[u];
  }
  const BucketLayout layout =
      padded_bucket_layout(units.counts(), sizeof(float), first_bucket_bytes(deck_.comm),
                           bucket_bytes(deck_.comm), size_t(shard_ranks_), alone_, breaks_);
  gather_order_ = forward_gather_order(units.units, layout.buckets);
  // The shard buffer: each bucket over its group's ranks (dp, or an expert's replicas), as the
  // reducer lays them out.
  shard_floats_ = 0;
  for (const Bucket& b : layout.buckets) {
    const bool expert = expert_[b.first_param];
    shard_floats_ += b.count / size_t(expert ? ctx_.expert_dp->size() : shard_ranks_);
  }
  // A parameter starts where its first unit does; a split parameter's pieces follow each other
  // with no padding between (its piece rows are aligned so).
  for (size_t i = 0; i + 1 < units.first.size(); ++i) {
    const size_t u0 = size_t(units.first[i]), u1 = size_t(units.first[i + 1]);
    options.param_offsets.push_back(layout.param_offsets[u0]);
    for (size_t u = u0 + 1; u < u1; ++u)
      TRIDENT_CHECK(
          layout.param_offsets[u] == layout.param_offsets[u - 1] + units.units[u - 1].count,
          "padding inside the pieces of {}", units.units[u].name);
  }
  options.param_total = layout.total;
  options.no_full_params = zero3_ && device_;  // Note [No full weights on a device]
}

void DataParallel::attach(GPT& model) {
  // The reducer's parameters: the model's (now at their padded offsets), split as laid out.
  const std::vector<ParamInfo>& infos = model.params_info();
  const GradUnits units = grad_units(infos, split_param_, piece_rows_, row_elems_);
  unit_first_ = units.first;
  std::vector<GradParam> params;
  for (const ParamInfo& u : units.units) params.push_back({u.name, u.offset, u.count});

  GradReducerOptions opt;
  opt.first_bucket_bytes = first_bucket_bytes(deck_.comm);
  opt.bucket_bytes = bucket_bytes(deck_.comm);
  opt.overlap = deck_.comm.overlap;
  if (ctx_.trace) opt.trace_origin = ctx_.trace->origin();
  // Note [HSDP]: the shards' group is dp_shard, and the emulated link (the one between nodes)
  // is dp_replicate's; without replicas both are dp.
  const bool hsdp = shard_ranks_ < size_;
  MpiComm& dp =
      hsdp ? ctx_.grid->gradient_shards() : ctx_.grid->gradients();  // timeouts: the grid's
  const CommConfig& cc = deck_.comm;
  const bool emulated = link_emulated_for(cc, "dp");  // comm.emulate_groups
  if (emulated && !hsdp) dp.set_emulated_link(cc.emulate_gbps, cc.emulate_latency_us);
  Communicator* reduce_comm = ctx_.dp_device ? ctx_.dp_device : &dp;
  // Note [HSDP] on a device: the shard group's and the replicas' own device communicators.
  if (hsdp && device_) {
    if (!ctx_.dp_shard_device || !ctx_.dp_replicate_device)
      internal_error(__FILE__, __LINE__, "HSDP on a device needs dp_shard and dp_replicate comms");
    reduce_comm = ctx_.dp_shard_device;
    opt.replicate_comm = ctx_.dp_replicate_device;
  }
  // Note [bf16 gradient compression] (comm.h) and Note [ZeRO-1]: on the host, the gradients get
  // a communicator of their own (bf16: so the loss, norms and row sets on dp stay exact; ZeRO:
  // its gathers run during the next forward). MPI_Comm_dup is collective over dp: every rank
  // of the group builds its DataParallel at the same point. A device backend's dp_device is
  // its own already.
  const bool bf16 = cc.grad_dtype == "bf16";
  if (!ctx_.backend->is_device() && (bf16 || sharded_)) {
    grad_comm_ =
        MpiComm::duplicate(dp.raw(), hsdp ? (bf16 ? "dp_shard (bf16 gradients)" : "dp_shard (ZeRO)")
                                     : bf16 ? "dp (bf16 gradients)"
                                            : "dp (ZeRO)");
    grad_comm_->set_timeout(dp.timeout());
    if (emulated && !hsdp) grad_comm_->set_emulated_link(cc.emulate_gbps, cc.emulate_latency_us);
    if (bf16) grad_comm_->set_bf16_sums(true);
    reduce_comm = grad_comm_.get();
  }
  if (hsdp && !device_) {
    MpiComm& replicate = ctx_.grid->dp_replicate();
    replicate_comm_ = MpiComm::duplicate(replicate.raw(), "dp_replicate (HSDP)");
    replicate_comm_->set_timeout(replicate.timeout());
    if (emulated) replicate_comm_->set_emulated_link(cc.emulate_gbps, cc.emulate_latency_us);
    if (bf16) replicate_comm_->set_bf16_sums(true);  // Note [HSDP with bf16 gradients]
    opt.replicate_comm = replicate_comm_.get();
  }
  // Note [Expert parallelism]: the experts' gradients sum over their own replicas.
  if (ctx_.expert_dp) {
    opt.expert = expert_;
    opt.expert_comm = ctx_.expert_dp;
    opt.expert_gather_comm = ctx_.expert_gather;
  }
  if (sharded_) {
    shard_grads_ = BackendBuffer<float>(*ctx_.backend, shard_floats_);
    opt.shard_grads = shard_grads_.data();
    opt.release_reduced = release_grads_;
    opt.pooled_grads = pooled_grads_;
    if (pooled_grads_ && reduces_every_micro_batch()) {  // Note [Shard sums on a device]
      Backend* be = ctx_.backend;
      opt.add_shard = [be](float* own, const float* sum, size_t n) { be->add(own, own, sum, n); };
    }
    // Note [Bounded gradient memory] (train/zero.h): one bucket on the wire while the next is
    // written.
    opt.max_held_bytes = release_grads_ ? opt.bucket_bytes : 0;
    opt.alone = alone_;
    opt.breaks = breaks_;
    opt.gather_order = gather_order_;
  }
  if (zero3_) {
    model_ = &model;
    shard_params_ = BackendBuffer<float>(*ctx_.backend, shard_floats_);
    opt.shard_params = shard_params_.data();
    if (device_) {  // Note [Weights in unit slots]: no full buffer, gathers on a device comm
      if (!ctx_.dp_gather_device)
        internal_error(__FILE__, __LINE__, "ZeRO-3 on a device needs a gather communicator");
      opt.gather_comm = ctx_.dp_gather_device;
      if (!gather_bf16_.empty()) {  // Note [bf16 unit gathers]
        shard_params16_ = BackendBuffer<bfloat16>(*ctx_.backend, shard_floats_);
        opt.shard_params16 = shard_params16_.data();
        opt.gather_bf16 = gather_bf16_;
      }
    } else {
      gather_comm_ = MpiComm::duplicate(dp.raw(), "dp (ZeRO-3 gathers)");
      gather_comm_->set_timeout(dp.timeout());
      // One emulated wire for the gathers and the reduce-scatters (both driven by the
      // reducer's thread), or ZeRO-3 would be measured on twice the link.
      if (emulated) gather_comm_->share_emulated_link(*grad_comm_);
      opt.params = model.params();
      opt.gather_comm = gather_comm_.get();
    }
  }
  TRIDENT_CHECK(pooled_grads_ == (model.grads() == nullptr),
                "the model's gradient buffer does not match the pool (GPTOptions::pooled_grads)");
  reducer_ = std::make_unique<GradReducer>(*reduce_comm, model.grads(), std::move(params), opt);
  if (!sharded_) return;
  owned_ = owned_pieces(infos, *reducer_);
  owned_runs_ = merge_pieces(owned_);
  if (pooled_grads_)
    grad_pool_ = std::make_unique<GradPool>(*ctx_.backend, model, *reducer_, unit_first_);
  if (zero3_) {
    // AdamW updates the shards where they are (Note [ZeRO-3 units]).
    shard_runs_ = owned_runs_;
    for (OwnedPiece& r : shard_runs_) r.flat = r.shard;
    UnitGathers::Options uo;
    uo.reshard_after_forward = deck_.parallel.reshard_after_forward;
    uo.per_step = deck_.parallel.zero3_gather == "step";
    unit_gathers_ = std::make_unique<UnitGathers>(*reducer_, model, unit_first_, uo);
    if (device_) {
      std::vector<size_t> first, floats;
      for (const Zero3Unit& u : unit_gathers_->units()) {
        const Bucket& last = reducer_->buckets()[u.end_bucket - 1];
        first.push_back(reducer_->buckets()[u.first_bucket].offset);
        floats.push_back(last.offset + last.count - first.back());
      }
      pool_ = std::make_unique<UnitPool>(*ctx_.backend, model, unit_gathers_->units(), first,
                                         floats, !uo.reshard_after_forward || uo.per_step);
      unit_gathers_->set_pool(pool_.get());
    }
    model.set_param_use([this](ParamPass pass, const std::vector<int>& indices) {
      refresh_shard16();
      unit_gathers_->use(pass, indices);
      if (grad_pool_) grad_pool_->use(pass, indices);  // Note [Gradients in unit slots]
    });
    return;
  }
  // Note [Gathers before use] (train/zero.h): the model calls this hook right before it first
  // reads a group of parameters in forward; it waits for the buckets holding them, and only
  // those. Set once here, for the model's lifetime (this unit outlives no model it serves).
  model.set_param_use([this](ParamPass pass, const std::vector<int>& indices) {
    if (grad_pool_) grad_pool_->use(pass, indices);  // Note [Gradients in unit slots]
    if (pass != ParamPass::kForward) return;         // gathered once, before the first forward read
    for (int i : indices)
      for (int u = unit_first_[size_t(i)]; u < unit_first_[size_t(i) + 1]; ++u)
        reducer_->wait_gathered(reducer_->bucket_of_param(size_t(u)));
  });
}

void DataParallel::init_params(GPT& model, uint64_t seed) {
  TRIDENT_CHECK(zero3_, "DataParallel::init_params without ZeRO-3");
  const std::vector<Zero3Unit>& units = unit_gathers_->units();
  for (size_t k = 0; k < units.size(); ++k) {
    const Zero3Unit& u = units[k];
    if (!device_) {
      model.init_params(seed, u.first_param, u.end_param);
      reducer_->take_shards(u.first_bucket, u.end_bucket);
      continue;
    }
    // Note [Weights in unit slots]: each unit in its slot (padding zero), then into the shards.
    float* base = pool_->take(int(k));
    const Bucket& first = reducer_->buckets()[u.first_bucket];
    const Bucket& last = reducer_->buckets()[u.end_bucket - 1];
    ctx_.backend->fill_zero(base + first.offset,
                            (last.offset + last.count - first.offset) * sizeof(float));
    model.init_params(seed, u.first_param, u.end_param, base);
    copy_shards(u, base);
    pool_->give_back(int(k));
  }
  if (device_) model.release_full_params();
  shard16_stale_ = true;
}

void DataParallel::take_params() {
  TRIDENT_CHECK(zero3_ && !device_, "DataParallel::take_params without ZeRO-3 on the host");
  for (const Zero3Unit& u : unit_gathers_->units())
    reducer_->take_shards(u.first_bucket, u.end_bucket);
}

// Calls fn(shard, from, n) for each part [from, from + n) of parameter p's floats that this
// rank's shard of a bucket holds, at `shard` in the shard parameters (padding is in no part).
template <typename Fn>
void DataParallel::for_each_shard_part(const ParamInfo& p, Fn&& fn) {
  for (size_t b = 0; b < reducer_->buckets().size(); ++b) {
    const size_t n = reducer_->shard_count(b);
    const size_t slice = reducer_->buckets()[b].offset + size_t(reducer_->shard_rank(b)) * n;
    const size_t lo = std::max(slice, p.offset), hi = std::min(slice + n, p.offset + p.count);
    if (lo < hi)
      fn(shard_params_.data() + reducer_->shard_offset(b) + (lo - slice), lo - p.offset, hi - lo);
  }
}

ParamWriteFn DataParallel::shard_writer() {
  TRIDENT_CHECK(zero3_ && device_, "DataParallel::shard_writer without ZeRO-3 on a device");
  shard16_stale_ = true;
  // Note [No full weights on a device]: a parameter's floats [offset, offset + count) of the
  // flat layout go to the parts of it that this rank's shards of the buckets hold (padding stays
  // the zero the shards were allocated with).
  return [this](const ParamInfo& p, const float* values) {
    for_each_shard_part(p, [&](float* shard, size_t from, size_t n) {
      ctx_.backend->copy(shard, values + from, n * sizeof(float));
    });
  };
}

ParamAddFn DataParallel::shard_adder() {
  TRIDENT_CHECK(zero3_, "DataParallel::shard_adder without ZeRO-3");
  return [this](const ParamInfo& p, const float* values) {
    shard16_stale_ = true;
    for_each_shard_part(p, [&](float* shard, size_t from, size_t n) {
      ctx_.backend->add(shard, shard, values + from, n);
    });
  };
}

void DataParallel::refresh_shard16() {
  if (!shard16_stale_ || shard_params16_.empty()) return;
  ctx_.backend->cast_to_bf16(shard_params16_.data(), shard_params_.data(), shard_floats_);
  shard16_stale_ = false;
}

void DataParallel::copy_shards(const Zero3Unit& u, const float* base) {
  for (size_t b = u.first_bucket; b < u.end_bucket; ++b) {
    const size_t n = reducer_->shard_count(b);
    ctx_.backend->copy(shard_params_.data() + reducer_->shard_offset(b),
                       base + reducer_->buckets()[b].offset + size_t(reducer_->shard_rank(b)) * n,
                       n * sizeof(float));
  }
}

size_t DataParallel::pool_bytes() const { return pool_ ? pool_->bytes() : 0; }

size_t DataParallel::grad_pool_bytes() const { return grad_pool_ ? grad_pool_->bytes() : 0; }

void DataParallel::begin_step() {
  if (grad_pool_) grad_pool_->begin_step();
}

void DataParallel::release_params() {
  if (zero3_) unit_gathers_->release_all();
}

DataParallel::ShardSlice DataParallel::shard_of(int unit) {
  const size_t b = reducer_->bucket_of_param(size_t(unit));
  const size_t n = reducer_->shard_count(b);
  return {shard_grads_.data() + reducer_->shard_offset(b),
          reducer_->buckets()[b].offset + size_t(shard_rank_) * n, n};
}

void DataParallel::finish(StepStats& s, const ReduceStats& earlier_rounds, double rows_ms) {
  reducer_->finish();
  // The step's rounds: one, or one per micro-batch (Note [ZeRO-2 and accumulation]), joined
  // only then (a copy of every record, which the usual one round does without).
  ReduceStats joined;
  const ReduceStats* rounds = &reducer_->stats();
  if (earlier_rounds.reduced) {
    joined = earlier_rounds;
    joined += *rounds;
    rounds = &joined;
  }
  const ReduceStats& rs = *rounds;
  s.comm_ms = rs.comm_ms + rows_ms;
  s.exposed_comm_ms = rs.exposed_comm_ms + rows_ms;
  s.comm_cpu_ms = rs.thread_cpu_ms;
  s.comm_polls = rs.progress_polls;
  s.grad_resident_bytes = rs.grad_resident_peak_bytes;
  s.held_wait_ms = rs.held_wait_ms;
  grad_resident_peak_ = std::max(grad_resident_peak_, rs.grad_resident_peak_bytes);
  s.overlap = s.comm_ms > 0 ? std::max(0.0, 1.0 - s.exposed_comm_ms / s.comm_ms) : 0.0;
  if (zero3_) {
    // Note [ZeRO-3 units]: the step's last units go back before the optimizer changes the
    // shards; this step's gathers are reported by this step.
    unit_gathers_->release_all();
    const GatherStats g = reducer_->take_gather_stats();
    const UnitGathers::Counts c = unit_gathers_->take_counts();
    s.gather_comm_ms = g.comm_ms;
    s.gather_exposed_ms = g.exposed_ms;
    s.unit_gathers = c.gathers;
    s.late_unit_gathers = c.late;
    params_resident_peak_ = std::max(params_resident_peak_, g.params_resident_peak_bytes);
    if (ctx_.trace)
      for (const BucketRecord& r : g.records)
        ctx_.trace->span("all-gather", r.name, r.start_ms, r.end_ms, "comm");
  }
  if (rs.ahead_bucket >= 0 && !ready_order_warned_) {  // Note [Ready order check]
    ready_order_warned_ = true;
    s.warning = fmt::format(
        "the gradient buckets did not become ready in order (step {}): {} was complete while "
        "{} still waited, and buckets start in order, so it and every later bucket waited "
        "for that one; overlap is lost. The parameters are not laid out in the order "
        "backward finishes them (gpt_param_layout)",
        s.step, reducer_->bucket_name(size_t(rs.ahead_bucket)),
        reducer_->bucket_name(size_t(rs.late_bucket)));
  }
  if (ctx_.trace)
    for (const BucketRecord& r : rs.records)
      ctx_.trace->span("all-reduce", r.name, r.start_ms, r.end_ms, "comm");
}

void DataParallel::update_shard(AdamW& opt, Backend& be, GPT& model, const TrainConfig& tc,
                                float lr, int t, float grad_scale, StepStats& s) {
  if (zero3_) {  // the units gather the updated shards when next used
    // Note [bf16 unit gathers]: AdamW's pass writes the bf16 copy too (the padding stays zero).
    opt.update_shard(be, shard_params_.data(), shard_grads_.data(), shard_runs_, tc, lr, t,
                     grad_scale, shard_params16_.empty() ? nullptr : shard_params16_.data());
    shard16_stale_ = false;  // the runs are every owned piece; the padding is zero in both
    return;
  }
  opt.update_shard(be, model.params(), shard_grads_.data(), owned_runs_, tc, lr, t, grad_scale);
  // The round waited for in this step: the last step's, launched after its optimizer and
  // complete now (forward read every bucket); with overlap off, this step's own.
  GatherStats g = reducer_->take_gather_stats();
  reducer_->start_param_gather(model.params());  // Note [Gathers before use]
  if (!deck_.comm.overlap) {
    reducer_->wait_all_gathered();
    g = reducer_->take_gather_stats();
  }
  s.gather_comm_ms = g.comm_ms;
  s.gather_exposed_ms = g.exposed_ms;
  if (ctx_.trace)
    for (const BucketRecord& r : g.records)
      ctx_.trace->span("all-gather", r.name, r.start_ms, r.end_ms, "comm");
}

void DataParallel::sync_params() {
  if (!sharded_ || !reducer_) return;
  if (!zero3_) {
    reducer_->wait_all_gathered();
    return;
  }
  refresh_shard16();
  unit_gathers_->gather_all();  // the whole model, held until the next step uses it
}

}  // namespace trident
