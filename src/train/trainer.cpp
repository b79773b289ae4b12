// The training step: micro-batches through the pipeline schedule (pp = 1 is a one-stage
// pipeline, the same code), the data-parallel reduction overlapped with the last micro-batch's
// backward (DataParallel), the tied embedding's gradient (TiedEmbedding), the global gradient
// norm (GradNorm), clipping and AdamW.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "core/elapsed.h"
#include "train/data_parallel.h"
#include "train/gpt_stage.h"
#include "train/grad_norm.h"
#include "train/tied_embedding.h"
#include "train/trainer_parts.h"
#include "trident/check.h"
#include "trident/comm.h"
#include "trident/grad_reducer.h"
#include "trident/grid.h"
#include "trident/peak_check.h"
#include "trident/train.h"

namespace trident {

Trainer::Trainer(const Deck& deck, TrainContext ctx) : deck_(deck), ctx_(ctx) {
  const GPTConfig cfg = model_config_from_deck(deck_, nullptr);
  place_on_grid();
  schedule_ = parse_pipe_schedule(deck_.parallel.schedule, "parallel.schedule");
  chunks_ = deck_.parallel.virtual_stages;
  GPTOptions options = stage_options(deck_, cfg, ctx_, schedule_, pp_size_, pp_rank_, dp_size_);
  const int T = deck_.model.seq_len / cp_size_;  // this rank's rows of each sequence
  check_moe_deck(deck_, cfg, dp_size_ * cp_size_);
  if (deck_.parallel.ep > 1) make_expert_groups(options);
  DataParallel::check_deck(deck_, ctx_.backend->is_device(), chunks_, splits_backward(schedule_));
  // The parts that shape the model's parameter layout, before it is allocated.
  if (cfg.tied_head && (options.stage.has_embedding || options.stage.has_head))
    tied_ = std::make_unique<TiedEmbedding>(cfg, dp_size_ * cp_size_, pp_size_,
                                            ctx_.backend->is_device(),
                                            DataParallel::bucket_bytes(deck_.comm), options);
  if (dp_size_ * cp_size_ > 1) {  // gradients reduce over dp × cp
    dp_ = std::make_unique<DataParallel>(deck_, ctx_);
    options.pooled_grads = dp_->pools_grads();  // Note [Gradients in unit slots]
    const std::vector<ParamInfo> layout =
        gpt_param_layout(cfg, options.tp.size, options.tp.rank, options.stage,
                         options.wte_after_head, options.ep.size, options.ep.rank);
    const int wte = tied_ ? tied_->wte_index(layout) : -1;  // reported in pieces, maybe alone
    const bool alone = tied_ && tied_->needs_own_bucket();
    dp_->lay_out(layout, wte, tied_ ? tied_->piece_rows() : std::vector<int>{}, cfg.channels,
                 alone ? wte : -1, options);
  }
  open_data(cfg);
  check_memory_plan(cfg, deck_.train.micro_batch, T, options, *ctx_.backend,
                    dp_ && dp_->sharded() ? dp_->shard_ranks() : 1,  // Note [Memory plan]
                    ctx_.pp_links && ctx_.backend->is_device(), zero3_memory(),
                    deck_.checkpoint.async && !deck_.checkpoint.dir.empty());
  model_ = std::make_unique<GPT>(cfg, *ctx_.backend, deck_.train.micro_batch, T, options);
  // The parts that work on the model's buffers. ZeRO-3 initialises its shards a unit at a time
  // (Note [ZeRO-3 units]); weights read from a file come whole, then go into the shards.
  const bool zero3 = dp_ && dp_->zero3();
  if (zero3) dp_->attach(*model_);
  if (deck_.model.init_from.empty()) {
    if (zero3) dp_->init_params(*model_, deck_.train.seed);
    else model_->init_weights(deck_.train.seed);
  } else if (zero3 && ctx_.backend->is_device()) {
    // Note [No full weights on a device]: each tensor read goes into the shards.
    load_llmc_weights(*model_, deck_.model.init_from, dp_->shard_writer());
    model_->release_full_params();  // none was held; a bf16 tied head's cast is made
  } else {
    load_llmc_weights(*model_, deck_.model.init_from);
    if (zero3) dp_->take_params();
  }
  if (dp_ && !zero3) dp_->attach(*model_);
  if (tied_)
    tied_->attach(*model_, dp_.get(), ctx_.grid, ctx_.embedding_device, *train_order_, ctx_.trace,
                  tokens_per_step());
  opt_ = std::make_unique<AdamW>(*ctx_.backend,
                                 dp_ && dp_->sharded() ? dp_->shard_size() : model_->num_params());
  stage_ = std::make_unique<GPTStage>(*model_, dp_.get(), tied_.get(), ctx_.pp_links != nullptr);
  norm_ = std::make_unique<GradNorm>(*model_, dp_.get(), tied_.get(), ctx_.grid, *pp_comm_,
                                     ep_comm_.get());
  if (ctx_.trace)
    model_->set_phase_recorder([this](const std::string& phase, auto b, auto e) {
      ctx_.trace->span("compute", phase, b, e);
    });
  fault_nan_steps_ = fault_nan_steps_from_env();  // Note [Non-finite steps]
}

Trainer::~Trainer() = default;

// The mixture layers' figures of the step (src/model/moe.h), over every rank: the losses as
// means per micro-batch of the sum over layers, and per replica of the model; the load a mean
// over layer forwards; the all-to-all times means over ranks. One collective, every rank.
MoeStats Trainer::moe_step_stats() {
  const MoeStats m = model_->take_moe_stats();
  // Eight sums, then per global layer the max/mean sum and its forwards (each stage holds its
  // own layers: the sum over ranks gives every layer's); one collective for all.
  const size_t L = size_t(model_->config().layers);
  std::vector<double> v = {m.aux_loss, m.z_loss,         double(m.dropped), double(m.choices),
                           m.a2a_ms,   m.a2a_exposed_ms, m.layer_ms,        m.route_ms};
  v.resize(8 + 2 * L, 0.0);
  for (size_t l = 0; l < m.layer_load.size(); ++l) {
    v[8 + l] = m.layer_load[l];
    v[8 + L + l] = m.layer_forwards[l];
  }
  int ranks = 1;
  if (ctx_.grid) {
    ctx_.grid->world().all_reduce(v.data(), v.size()).wait();
    ranks = ctx_.grid->world_size();
  }
  const double replicas = double(dp_size_) * cp_size_ * deck_.train.accum;
  const int tp = ctx_.grid ? ctx_.grid->layout().tp : 1;
  MoeStats s;
  s.aux_loss = v[0] / (replicas * tp);
  s.z_loss = v[1] / (replicas * tp);
  s.dropped = int64_t(v[2]);
  s.choices = int64_t(v[3]);
  s.a2a_ms = v[4] / ranks;
  s.a2a_exposed_ms = v[5] / ranks;
  s.layer_ms = v[6] / ranks;
  s.route_ms = v[7] / ranks;
  double load_sum = 0, forwards = 0;
  for (size_t l = 0; l < L; ++l) {
    load_sum += v[8 + l];
    forwards += v[8 + L + l];
    if (!model_->config().is_moe(int(l))) continue;
    s.layer_load.push_back(v[8 + L + l] > 0 ? v[8 + l] / v[8 + L + l] : 0.0);
    s.layer_forwards.push_back(v[8 + L + l]);
  }
  s.load_max_over_mean = forwards > 0 ? load_sum / forwards : 0.0;
  s.layers_seen = int(forwards);
  return s;
}

// Note [Expert parallelism]: split from the gradients' group (dp × cp) by its rank order, ep
// consecutive ranks to a group; every rank of dp × cp calls this at the same point. With HSDP
// (Note [Experts with HSDP] in train/zero3.h) the experts' shards are split from the replica's
// shard group (dp_shard × cp), which holds whole ep groups: ep divides it (check_moe_deck).
void Trainer::make_expert_groups(GPTOptions& options) {
  MpiComm& g = ctx_.grid->gradients();
  const bool hsdp = deck_.parallel.zero > 0 && ctx_.grid->layout().dp_replicate > 1;
  MpiComm& shards = hsdp ? ctx_.grid->gradient_shards() : g;
  ep_size_ = deck_.parallel.ep;
  ep_rank_ = g.rank() % ep_size_;
  expert_dp_rank_ = g.rank() / ep_size_;  // over every replica: 0 writes the whole experts
  TRIDENT_CHECK(shards.rank() % ep_size_ == ep_rank_ && shards.size() % ep_size_ == 0,
                "ep {} does not split the shard group ({} ranks)", ep_size_, shards.size());
  MPI_Comm ep = MPI_COMM_NULL, edp = MPI_COMM_NULL;
  TRIDENT_MPI(MPI_Comm_split(g.raw(), expert_dp_rank_, g.rank(), &ep));
  TRIDENT_MPI(MPI_Comm_split(shards.raw(), ep_rank_, shards.rank(), &edp));
  ep_comm_ = std::make_unique<MpiComm>(ep, "ep");
  expert_dp_comm_ = std::make_unique<MpiComm>(edp, "expert_dp");
  ep_comm_->set_timeout(g.timeout());
  expert_dp_comm_->set_timeout(g.timeout());
  // Note [bf16 gradient compression]: the experts' gradients travel as the others do (a
  // device's expert-dp NcclComm gets grad_bf16 from the backend factory).
  if (deck_.comm.grad_dtype == "bf16") expert_dp_comm_->set_bf16_sums(true);
  // The emulated link (comm.emulate_gbps, when comm.emulate_groups names ep) carries the
  // tokens, both ways.
  if (link_emulated_for(deck_.comm, "ep")) {
    ep_comm_->set_emulated_link(deck_.comm.emulate_gbps, deck_.comm.emulate_latency_us);
    ep_comm_->set_duplex_link(true);
  }
  if (ctx_.device_group) {  // the model's tokens and the experts' gradients in device memory
    ep_device_ = ctx_.device_group(*ep_comm_, "ep (device)", /*compute=*/true);
    expert_dp_device_ = ctx_.device_group(*expert_dp_comm_, "expert_dp (device)", false);
  }
  options.ep = {ep_device_ ? ep_device_.get() : ep_comm_.get(), ep_size_, ep_rank_, ep_comm_.get()};
  ctx_.expert_dp = expert_dp_device_ ? expert_dp_device_.get() : expert_dp_comm_.get();
  if (deck_.parallel.zero == 3) {  // Note [ZeRO-3 units]: the experts' gathers' own group
    if (ctx_.device_group) {
      expert_gather_ = ctx_.device_group(*expert_dp_comm_, "expert_dp gathers (device)", false);
    } else {
      auto dup = MpiComm::duplicate(expert_dp_comm_->raw(), "expert_dp (ZeRO-3 gathers)");
      dup->set_timeout(g.timeout());
      expert_gather_ = std::move(dup);
    }
    ctx_.expert_gather = expert_gather_.get();
  }
}

Zero3Memory Trainer::zero3_memory() const {
  Zero3Memory z;
  if (!dp_ || !dp_->zero3()) return z;
  const ParallelConfig& p = deck_.parallel;
  z.on = true;
  z.bucket_bytes = DataParallel::bucket_bytes(deck_.comm);
  z.keeps_params = !p.reshard_after_forward || p.zero3_gather == "step";
  z.keeps_grads = deck_.train.accum > 1 && p.zero_reduce == "step";
  return z;
}

void Trainer::place_on_grid() {
  if (!ctx_.grid) {
    solo_ = std::make_unique<SoloComm>();
    pp_comm_ = solo_.get();
    return;
  }
  const GridLayout& g = ctx_.grid->layout();
  const GridCoord c = ctx_.grid->coord();
  dp_size_ = g.dp;
  dp_rank_ = c.dp;
  pp_size_ = g.pp;
  pp_rank_ = c.pp;
  pp_comm_ = &ctx_.grid->pp();
  cp_size_ = g.cp;
  cp_rank_ = c.cp;
}

void Trainer::open_data(const GPTConfig& cfg) {
  // Opened (and validated) before the model is allocated.
  const int T = deck_.model.seq_len;
  train_data_ = TokenDataset::open(deck_.data.train, cfg.vocab, "data.train");
  train_order_ =
      std::make_unique<SampleOrder>(*train_data_, T, deck_.data.shuffle, deck_.train.seed);
  if (deck_.data.valid.empty()) return;
  valid_data_ = TokenDataset::open(deck_.data.valid, cfg.vocab, "data.valid");
  valid_order_ = std::make_unique<SampleOrder>(*valid_data_, T, false, 0);
}

void Trainer::sync_params() {
  if (dp_) dp_->sync_params();
}

const GradReducer* Trainer::reducer() const { return dp_ ? &dp_->reducer() : nullptr; }

Trainer::MemoryBytes Trainer::memory_bytes() const {
  MemoryBytes m;
  const size_t shard = dp_ ? dp_->shard_size() : 0;
  m.params = model_->num_params() * sizeof(float);
  // The shard, and what was gathered at most (Note [ZeRO-3 units]); on a device the unit pool
  // (Note [Weights in unit slots]).
  if (dp_ && dp_->zero3())
    m.params = shard * sizeof(float) + dp_->params_resident_peak() + dp_->pool_bytes();
  m.grads = (model_->num_params() + shard) * sizeof(float);
  if (dp_ && dp_->pools_grads())  // Note [Gradients in unit slots]: the pool, not the buffer
    m.grads = dp_->grad_pool_bytes() + shard * sizeof(float);
  m.grads_resident =
      dp_ && dp_->releases_grads() ? dp_->grad_resident_peak() + shard * sizeof(float) : m.grads;
  m.optimizer = 2 * opt_->size() * sizeof(float);
  m.activations = model_->activation_bytes();
  return m;
}

long Trainer::tokens_per_step() const {
  return long(deck_.train.micro_batch) * deck_.model.seq_len * deck_.train.accum * dp_size_;
}

StepStats Trainer::train_step(int step) {
  const auto t_step = std::chrono::steady_clock::now();
  const TrainConfig& tc = deck_.train;
  StepStats s;
  s.step = step + 1;
  // ZeRO-2 left the gradient buffer zero (and its pages with the kernel) when the last step's
  // buckets were released.
  // A device's pool zeroes its slots itself (Note [Gradients in unit slots]).
  if (dp_ && dp_->pools_grads()) dp_->begin_step();
  else if (!dp_ || !dp_->releases_grads()) model_->zero_grads();
  const GPTStage::StepInputs in{
      step, tc.micro_batch, deck_.model.seq_len, tc.accum, dp_size_, dp_rank_, cp_size_, cp_rank_};
  const double rows_ms = tied_ ? tied_->begin_step(in) : 0.0;
  stage_->begin_step(in, *train_order_);
  const PipelineStats ps = run_pipeline(schedule_, *pp_comm_, pp_size_, pp_rank_, tc.accum, *stage_,
                                        chunks_, ctx_.pp_links);
  s.forward_ms = stage_->forward_ms();
  s.backward_ms = stage_->backward_ms();
  s.pipeline_ms = ps.total_ms;
  s.pipeline_wait_ms = ps.wait_ms;
  s.pipeline_compute_ms = ps.compute_ms;
  if (dp_) {
    if (tied_) tied_->add_rows_to_reduction();
    dp_->finish(s, stage_->earlier_rounds(), rows_ms);  // gradients are now the dp average
  }
  if (tied_) tied_->finish_step();
  // The loss lives on the last stage: sum over pp (others contribute 0), then over dp × cp
  // (each cp rank's is the mean over its T/cp tokens of the sequences).
  double loss = stage_->take_loss_sum();
  if (pp_size_ > 1) pp_comm_->all_reduce(&loss, 1).wait();
  if (dp_size_ * cp_size_ > 1) ctx_.grid->gradients().all_reduce(&loss, 1).wait();
  s.loss = loss / (tc.accum * dp_size_ * cp_size_);

  const auto t0 = std::chrono::steady_clock::now();
  if (update_gate_) {  // Note [Deferred host snapshot]: nothing below may change the buffers yet
    update_gate_();
    s.snapshot_wait_ms = ms_since(t0);
  }
  if (std::find(fault_nan_steps_.begin(), fault_nan_steps_.end(), s.step) != fault_nan_steps_.end())
    poison_gradient();
  s.grad_norm = std::sqrt(norm_->sum_squares());
  s.lr = lr_at(tc, step);
  if (!std::isfinite(s.loss) || !std::isfinite(s.grad_norm)) {
    skip_step(s);  // Note [Non-finite steps]
  } else {
    skips_in_a_row_ = 0;
    // Clipping is applied inside AdamW's pass over the gradients (the same float products as
    // a separate scaling pass, one pass fewer over every gradient).
    const float scale =
        tc.grad_clip > 0.0 && s.grad_norm > tc.grad_clip ? float(tc.grad_clip / s.grad_norm) : 1.0f;
    Backend& be = *ctx_.backend;
    // DeepSeek-V3's choice bias, from the step's loads over dp × cp (src/model/gpt_moe.cpp);
    // before the optimizer, whose ZeRO gathers then carry it (it has no gradient: AdamW leaves
    // it as it is).
    // ZeRO-3 holds the parameters in the shards only (Note [ZeRO-3 units]).
    if (model_->has_moe())
      model_->update_router_biases(dp_size_ * cp_size_ > 1 ? &ctx_.grid->gradients() : nullptr,
                                   ctx_.grid ? &ctx_.grid->tp() : nullptr,
                                   dp_ && dp_->zero3() ? dp_->shard_adder() : ParamAddFn{});
    if (dp_ && dp_->sharded())
      dp_->update_shard(*opt_, be, *model_, tc, float(s.lr), step + 1, scale, s);
    else opt_->update(be, *model_, tc, float(s.lr), step + 1, scale);
    be.synchronize();  // a device step ends when its last op has run, not when it was issued
    if (ctx_.trace) ctx_.trace->span("compute", "optimizer", t0, std::chrono::steady_clock::now());
  }
  s.optimizer_ms = ms_since(t0);
  s.tp_comm_ms = model_->take_tp_comm_ms();
  s.tp_exposed_ms = model_->take_tp_exposed_ms();
  s.cp_comm_ms = model_->take_cp_comm_ms();
  s.cp_exposed_ms = model_->take_cp_exposed_ms();
  if (model_->config().has_moe()) s.moe = moe_step_stats();
  s.ms_per_step = ms_since(t_step);
  s.tokens_per_s = double(tokens_per_step()) / (s.ms_per_step / 1e3);
  s.model_flops_per_s =
      model_->config().train_flops_per_token(deck_.model.seq_len) * s.tokens_per_s;
  s.mfu = mfu_of(s);
  return s;
}

// MFU: the step's FLOPs are spread over all ranks, each with its own (measured) peak. NaN
// (not reported) without a peak, above 1 (the peak was wrong), or for a skipped step.
double Trainer::mfu_of(const StepStats& s) const {
  const int ranks = ctx_.grid ? ctx_.grid->world_size() : 1;
  return s.skipped ? NAN : mfu_or_nan(s.model_flops_per_s, ctx_.peak_flops * ranks);
}

// Note [Non-finite steps]
// A step whose loss or gradient norm is not finite applies nothing. Both were summed over every
// axis that holds a part of them, so every rank takes the same branch without a collective.
// train.nonfinite stop ends the run before the optimizer (the last checkpoint is untouched);
// skip drops the update (AdamW, ZeRO's gather), marks the step and stops after train.max_skips
// in a row. The step still counts for the schedule, as Megatron's skipped steps do.
void Trainer::skip_step(StepStats& s) {
  const TrainConfig& tc = deck_.train;
  if (tc.nonfinite == "stop")
    throw Error(fmt::format("step {}: the loss is {} and the gradient norm {}: training "
                            "diverged (or a batch is broken); nothing of this step was applied "
                            "or saved. Lower train.lr, or set train.nonfinite: skip to drop "
                            "such steps",
                            s.step, s.loss, s.grad_norm),
                ExitCode::kInternal);
  s.skipped = true;
  s.skips_in_a_row = ++skips_in_a_row_;
  if (skips_in_a_row_ > tc.max_skips)
    throw Error(fmt::format("step {}: {} steps in a row had a non-finite loss or gradient norm "
                            "(train.max_skips {}): training diverged; the parameters are those "
                            "of the last good step",
                            s.step, skips_in_a_row_, tc.max_skips),
                ExitCode::kInternal);
}

// TRIDENT_FAULT_NAN_STEPS (1-based steps, comma-separated) makes every rank put one NaN in its
// reduced gradient at those steps, as a diverged step would have it everywhere (tests, chaos).
std::vector<int> Trainer::fault_nan_steps_from_env() {
  std::vector<int> steps;
  const char* text = std::getenv("TRIDENT_FAULT_NAN_STEPS");
  if (!text) return steps;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) steps.push_back(std::stoi(item));
  return steps;
}

void Trainer::poison_gradient() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float* g = model_->grads();
  if (dp_ && dp_->sharded())
    g = dp_->shard_grads() + (dp_->owned().empty() ? 0 : dp_->owned().front().shard);
  ctx_.backend->copy(g, &nan, sizeof(float));
}

double Trainer::validate() {
  if (!valid_order_) return NAN;
  // Validation micro-batches are dealt round-robin over dp ranks (micro-batch j of this rank is
  // i = j·dp + rank, Note [Sample order]); the mean is over all of them. Forward only, through
  // the pipeline runner.
  const int n = deck_.train.val_batches;
  const int mine = dp_rank_ < n ? (n - dp_rank_ + dp_size_ - 1) / dp_size_ : 0;
  double sum[2] = {0.0, double(mine)};  // loss sum, micro-batch count
  if (mine > 0) {
    stage_->begin_step({0, deck_.train.micro_batch, deck_.model.seq_len, mine, dp_size_, dp_rank_,
                        cp_size_, cp_rank_},
                       *valid_order_);
    run_pipeline_forward(*pp_comm_, pp_size_, pp_rank_, mine, *stage_, chunks_, ctx_.pp_links);
    sum[0] = stage_->take_loss_sum();
  }
  // ZeRO-3's gathers pair over dp (Note [ZeRO-3 units]): a rank with fewer validation
  // micro-batches than the most any rank has runs that many more forwards, uncounted (its own
  // samples again), or the others' gathers would wait for it.
  const int most = (n + dp_size_ - 1) / dp_size_;
  if (dp_ && dp_->zero3() && most > mine) {
    stage_->begin_step({0, deck_.train.micro_batch, deck_.model.seq_len, most - mine, dp_size_,
                        dp_rank_, cp_size_, cp_rank_},
                       *valid_order_);
    run_pipeline_forward(*pp_comm_, pp_size_, pp_rank_, most - mine, *stage_, chunks_,
                         ctx_.pp_links);
    (void)stage_->take_loss_sum();
  }
  if (dp_) dp_->release_params();  // ZeRO-3: the units the forward passes left gathered
  if (model_->has_moe()) model_->discard_moe_stats();  // validation's routing is not the step's
  if (pp_size_ > 1) pp_comm_->all_reduce(&sum[0], 1).wait();
  // cp: every rank of a sequence adds the mean over its tokens, and counts the micro-batch.
  if (dp_size_ * cp_size_ > 1) ctx_.grid->gradients().all_reduce(sum, 2).wait();
  return sum[0] / sum[1];
}

}  // namespace trident
