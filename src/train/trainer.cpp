// The training step: micro-batches through the pipeline schedule (pp = 1 is a one-stage
// pipeline, the same code), data-parallel gradient averaging overlapped with the last
// micro-batch's backward, the tied embedding's gradient summed over the first and last stage,
// the global gradient norm over tp and pp, clipping and AdamW.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>

#include "core/elapsed.h"
#include "train/embedding_rows.h"
#include "train/gpt_stage.h"
#include "train/zero.h"
#include "trident/check.h"
#include "trident/grad_reducer.h"
#include "trident/grid.h"
#include "trident/peak_check.h"
#include "trident/train.h"

namespace trident {
namespace {

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(item);
  return out;
}

std::vector<int> parse_stage_layers(const std::string& text) {
  std::vector<int> out;
  if (text.empty()) return out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      size_t used = 0;
      out.push_back(std::stoi(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      input_error("parallel.stage_layers: expected comma-separated integers like \"3,1\", got "
                  "\"{}\"", text);
    }
  }
  return out;
}

}  // namespace

GPTConfig model_config_from_deck(const Deck& deck, std::string* note) {
  const ModelConfig& m = deck.model;
  GPTConfig cfg;
  if (!m.init_from.empty()) {
    cfg = read_llmc_config(m.init_from);
    if (note)
      *note = fmt::format(
          "model.init_from {}: its shape replaces the deck's: layers={} d_model={} heads={} "
          "vocab={} (padded {}) max_seq_len={}",
          m.init_from, cfg.layers, cfg.channels, cfg.heads, cfg.vocab, cfg.padded_vocab,
          cfg.max_seq_len);
    // The file's padding may not split evenly over tp: pad again (the loader maps rows).
    if (cfg.padded_vocab % (128 * deck.parallel.tp) != 0)
      cfg.padded_vocab = GPTConfig::pad_vocab(cfg.vocab, deck.parallel.tp);
    if (m.seq_len > cfg.max_seq_len)
      input_error("model.seq_len: {} exceeds model.init_from's max sequence length {}", m.seq_len,
                  cfg.max_seq_len);
    return cfg;
  }
  cfg.layers = m.layers;
  cfg.channels = m.d_model;
  cfg.heads = m.heads;
  cfg.vocab = m.vocab;
  cfg.padded_vocab = GPTConfig::pad_vocab(m.vocab, deck.parallel.tp);
  cfg.max_seq_len = m.seq_len;
  return cfg;
}

Trainer::Trainer(const Deck& deck, TrainContext ctx) : deck_(deck), ctx_(ctx) {
  GPTConfig cfg = model_config_from_deck(deck_, nullptr);
  const int B = deck_.train.micro_batch, T = deck_.model.seq_len;
  GPTOptions options;
  if (ctx_.grid) {
    const GridLayout& g = ctx_.grid->layout();
    const GridCoord c = ctx_.grid->coord();
    dp_size_ = g.dp;
    dp_rank_ = c.dp;
    pp_size_ = g.pp;
    pp_rank_ = c.pp;
    pp_comm_ = &ctx_.grid->pp();
    if (g.tp > 1) {
      Communicator* tp = ctx_.tp_device ? ctx_.tp_device : &ctx_.grid->tp();
      options.tp = {tp, g.tp, c.tp, deck_.parallel.sequence_parallel};
    }
  } else {
    solo_ = std::make_unique<SoloComm>();
    pp_comm_ = solo_.get();
  }
  // Refused before anything is allocated, with the numbers (identically on every rank).
  if (ctx_.backend->is_device() && options.tp.size > 1 && !ctx_.tp_device)
    internal_error(__FILE__, __LINE__, "a device backend with tp > 1 needs a device communicator");
  check_tensor_parallel(cfg, options.tp.size, options.tp.sequence_parallel, T);
  schedule_ = parse_pipe_schedule(deck_.parallel.schedule, "parallel.schedule");
  chunks_ = deck_.parallel.virtual_stages;
  check_pipe_schedule(schedule_, pp_size_, deck_.train.accum, chunks_, cfg.layers);
  options.stage = pipeline_stage(cfg.layers, pp_size_, pp_rank_,
                                 parse_stage_layers(deck_.parallel.stage_layers), chunks_);
  options.slots = 0;
  for (int c = 0; c < chunks_; ++c) {
    options.chunk_slots.push_back(
        max_in_flight(schedule_, pp_size_, pp_rank_, deck_.train.accum, chunks_, c));
    options.slots += options.chunk_slots.back();
  }
  options.recompute = parse_recompute(deck_.train.recompute);
  options.precision = parse_precision(deck_.run.precision);
  // The seed every backward of this run gets (GPTStage::dloss_scale), which the bf16 fused
  // classifier applies in forward (Note [bf16 activations]).
  options.dloss_scale = 1.0f / (float(deck_.train.accum) * float(dp_size_));
  // Note [Split backward] (model/gpt_backward.cpp): the last stage of zb-h1 holds p slots but
  // runs each micro-batch's B right after its F, so one set of head buffers serves them all.
  options.shared_head = splits_backward(schedule_);
  if (splits_backward(schedule_) && options.recompute != Recompute::kNone)
    input_error("parallel.schedule: {} keeps each micro-batch's activations until its weight "
                "pass, which train.recompute: {} drops; use train.recompute: none with {}, or "
                "parallel.schedule: 1f1b", deck_.parallel.schedule, deck_.train.recompute,
                deck_.parallel.schedule);

  // Note [ZeRO-1] (train/zero.h). Refused before anything is allocated.
  const int zero = deck_.parallel.zero;
  if (zero == 2 && ctx_.backend->is_device())
    input_error("parallel.zero: 2 needs run.backend cpu: ZeRO-2 gives each reduced bucket's "
                "host pages back (Note [ZeRO-2 on the host]); a device needs a pool of bucket "
                "buffers, which is not built. parallel.zero: 1 works on the device");
  if (zero > 0 && deck_.comm.grad_dtype == "bf16")
    input_error("parallel.zero: {} with comm.grad_dtype bf16: the bf16 path compresses "
                "all-reduces only, not the sharded optimizer's reduce-scatter; use fp32", zero);
  if (deck_.parallel.zero_reduce == "micro_batch" &&
      (zero != 2 || chunks_ > 1 || splits_backward(schedule_)))
    input_error("parallel.zero_reduce: micro_batch needs parallel.zero 2 (got {}), one chunk per "
                "stage (parallel.virtual_stages {}) and a schedule whose backward is one pass "
                "(parallel.schedule {}); use parallel.zero_reduce: step",
                zero, chunks_, deck_.parallel.schedule);
  sharded_ = zero > 0 && dp_size_ > 1;
  release_grads_ = sharded_ && zero == 2;  // Note [ZeRO-2 on the host] (train/zero.h)
  auto mib = [](double mb) {
    const double bytes = mb * 1024.0 * 1024.0;
    return bytes >= double(kOneBucket) ? kOneBucket : size_t(bytes);
  };
  const size_t first_bucket_bytes = mib(deck_.comm.first_bucket_mb);
  const size_t bucket_bytes = mib(deck_.comm.bucket_mb);
  // Note [Head gradient in pieces] (trident/buckets.h): where wte's head gradient is final
  // right after the head (the row sink: pp 1, a host backend) and is reduced, it is computed
  // and reduced in pieces of about a bucket. The pieces align to 16·dp floats whatever the
  // ZeRO stage, so zero 0, 1 and 2 run the same GEMMs.
  const bool whole_embedding = options.stage.has_embedding && options.stage.has_head;
  // Note [Tied embedding gradient]: the row sink needs both halves on this stage (pp = 1); the
  // row collection is host code, so a device backend reduces wte whole, after the embedding's
  // backward, and wte then goes last in the ready list: laid out first, its bucket would be
  // ready last, and since buckets start in order none would start before backward ends.
  use_sink_ = dp_size_ > 1 && whole_embedding && !ctx_.backend->is_device();
  options.wte_after_head = dp_size_ == 1 || use_sink_;
  if (use_sink_)
    options.wte_piece_rows =
        head_gradient_pieces(cfg.padded_vocab / options.tp.size, cfg.channels, sizeof(float),
                             bucket_bytes, size_t(dp_size_) * 16);
  std::vector<char> alone;  // Note [Padded buckets]: wte with pp > 1, and wte's pieces
  BucketLayout layout;      // the reducer rebuilds it from the same sizes and checks
  if (sharded_) {
    const GradUnits units =
        grad_units(gpt_param_layout(cfg, options.tp.size, options.tp.rank, options.stage,
                                    options.wte_after_head),
                   options.wte_piece_rows, cfg.channels);
    for (size_t u = 0; u < units.units.size(); ++u)
      alone.push_back((pp_size_ > 1 && units.units[u].name == "wte") || units.pieces[u]);
    layout = padded_bucket_layout(units.counts(), sizeof(float), first_bucket_bytes, bucket_bytes,
                                  size_t(dp_size_), alone);
    // A parameter starts where its first unit does; wte's pieces must follow each other with
    // no padding between (head_gradient_pieces aligns them so).
    for (size_t i = 0; i + 1 < units.first.size(); ++i) {
      const size_t u0 = size_t(units.first[i]), u1 = size_t(units.first[i + 1]);
      options.param_offsets.push_back(layout.param_offsets[u0]);
      for (size_t u = u0 + 1; u < u1; ++u)
        TRIDENT_CHECK(layout.param_offsets[u] == layout.param_offsets[u - 1] + units.units[u - 1].count,
                      "padding inside the pieces of {}", units.units[u].name);
    }
    options.param_total = layout.total;
  }

  // Open (and validate) the data before allocating the model.
  train_data_ = TokenDataset::open(deck_.data.train, cfg.vocab, "data.train");
  train_order_ = std::make_unique<SampleOrder>(*train_data_, T, deck_.data.shuffle,
                                               deck_.train.seed);
  if (!deck_.data.valid.empty()) {
    valid_data_ = TokenDataset::open(deck_.data.valid, cfg.vocab, "data.valid");
    valid_order_ = std::make_unique<SampleOrder>(*valid_data_, T, false, 0);
  }
  check_memory_plan(cfg, B, T, options);  // Note [Memory plan]
  model_ = std::make_unique<GPT>(cfg, *ctx_.backend, B, T, options);
  for (const ParamInfo& p : model_->params_info())  // resolved once: the step uses it by pointer
    if (p.name == "wte") wte_ = &p;
  if (deck_.model.init_from.empty())
    model_->init_weights(deck_.train.seed);
  else
    load_llmc_weights(*model_, deck_.model.init_from);
  if (sharded_) shard_grads_ = BackendBuffer<float>(*ctx_.backend, model_->num_params() / dp_size_);
  if (const char* steps = std::getenv("TRIDENT_FAULT_NAN_STEPS"))  // Note [Non-finite steps]
    for (const std::string& item : split_commas(steps)) fault_nan_steps_.push_back(std::stoi(item));
  opt_ = std::make_unique<AdamW>(*ctx_.backend,
                                 sharded_ ? shard_grads_.size() : model_->num_params());
  inputs_.resize(size_t(B) * T);
  targets_.resize(size_t(B) * T);

  if (dp_size_ > 1) {
    // The reducer's parameters: the model's, wte in its pieces (Note [Head gradient in pieces]).
    const GradUnits units =
        grad_units(model_->params_info(), options.wte_piece_rows, cfg.channels);
    unit_first_ = units.first;
    std::vector<GradParam> params;
    for (size_t u = 0; u < units.units.size(); ++u) {
      const ParamInfo& p = units.units[u];
      std::string name = p.name;
      if (units.pieces[u])
        name = fmt::format("{}[rows {}..{}]", p.name, (p.offset - wte_->offset) / size_t(cfg.channels),
                           (p.offset - wte_->offset + p.count) / size_t(cfg.channels));
      params.push_back({std::move(name), p.offset, p.count});
    }
    GradReducerOptions opt;
    opt.first_bucket_bytes = first_bucket_bytes;
    opt.bucket_bytes = bucket_bytes;
    opt.overlap = deck_.comm.overlap;
    if (ctx_.trace) opt.trace_origin = ctx_.trace->origin();
    MpiComm& dp = ctx_.grid->dp();  // its timeout is the grid's (make_grid)
    if (deck_.comm.emulate_gbps > 0)
      dp.set_emulated_link(deck_.comm.emulate_gbps, deck_.comm.emulate_latency_us);
    if (ctx_.backend->is_device() && !ctx_.dp_device)
      internal_error(__FILE__, __LINE__, "a device backend with dp > 1 needs a device communicator");
    Communicator* reduce_comm = ctx_.dp_device ? ctx_.dp_device : &dp;
    if (!ctx_.backend->is_device() && deck_.comm.grad_dtype == "bf16") {
      // Note [bf16 gradient compression] (comm.h): on a communicator of their own, so the
      // loss, norms and row sets on dp stay exact. MPI_Comm_dup is collective over dp: every
      // rank of the group builds its Trainer at the same point.
      grad_comm_ = MpiComm::duplicate(dp.raw(), "dp (bf16 gradients)");
      grad_comm_->set_timeout(dp.timeout());
      if (deck_.comm.emulate_gbps > 0)
        grad_comm_->set_emulated_link(deck_.comm.emulate_gbps, deck_.comm.emulate_latency_us);
      grad_comm_->set_bf16_sums(true);
      reduce_comm = grad_comm_.get();
    }
    if (sharded_ && !ctx_.backend->is_device()) {
      // Note [ZeRO-1]: the thread keeps a communicator of its own across steps (its gathers
      // run during the next forward); MPI_Comm_dup is collective over dp, as above. A device
      // backend's reducer communicator (dp_device) is its own already: the compute thread's
      // dp calls (loss, norm) are host MPI on grid.dp().
      grad_comm_ = MpiComm::duplicate(dp.raw(), "dp (ZeRO)");
      grad_comm_->set_timeout(dp.timeout());
      if (deck_.comm.emulate_gbps > 0)
        grad_comm_->set_emulated_link(deck_.comm.emulate_gbps, deck_.comm.emulate_latency_us);
      reduce_comm = grad_comm_.get();
    }
    if (sharded_) {
      opt.shard_grads = shard_grads_.data();
      opt.release_reduced = release_grads_;
      // Note [Bounded gradient memory] (train/zero.h): one bucket on the wire while the next
      // is written.
      opt.max_held_bytes = release_grads_ ? bucket_bytes : 0;
      opt.alone = alone;
      opt.gather_order = forward_gather_order(units.units, layout.buckets);
    }
    reducer_ = std::make_unique<GradReducer>(*reduce_comm, model_->grads(), std::move(params), opt);
    if (sharded_) {
      owned_ = owned_pieces(model_->params_info(), *reducer_, dp_rank_);
      owned_runs_ = merge_pieces(owned_);
      // Note [Gathers before use]: forward waits for the buckets it is about to read.
      model_->set_param_use([this](const std::vector<int>& indices) {
        for (int i : indices)
          for (int u = unit_first_[size_t(i)]; u < unit_first_[size_t(i) + 1]; ++u)
            reducer_->wait_gathered(reducer_->bucket_of_param(size_t(u)));
      });
    }
  }
  const bool use_sink = use_sink_;  // decided above, with the ready order
  stage_ = std::make_unique<GPTStage>(*model_, *train_order_, reducer_.get(),
                                      use_sink ? &sink_ : nullptr, unit_first_);
  stage_->reduce_every_micro_batch(release_grads_ && deck_.parallel.zero_reduce == "micro_batch");
  if (use_sink) {
    step_rows_ = std::make_unique<StepRowSet>(model_->vocab_begin(), model_->vocab_end());
    // A step has at most one row per token it reads, and no more than the slice: reserved
    // once, so the per-step assign never reallocates.
    const size_t slice = size_t(model_->vocab_end() - model_->vocab_begin());
    const size_t max_rows = std::min(slice, size_t(tokens_per_step()));
    row_grads_.reserve(max_rows * size_t(cfg.channels));
    stage_->row_of_input().resize(size_t(B) * T);
    stage_->before_backward = [this](int micro) {
      const std::vector<int32_t>& in = stage_->inputs(micro);
      std::vector<int32_t>& rows = stage_->row_of_input();
      for (size_t i = 0; i < in.size(); ++i) rows[i] = step_rows_->index_of(in[i]);
      sink_ = {rows.data(), row_grads_.data()};
    };
  }
  if (ctx_.trace)
    model_->set_phase_recorder([this](const std::string& phase, auto b, auto e) {
      record("compute", phase, b, e);
    });
  build_norm_lists();
}

// The gradient norm's tensors, listed once (Backend::sum_squares_each: one wait on a device).
// Sharded tensors: each tp rank has a disjoint part, so their squares are summed over tp.
// Replicated tensors are identical on every tp rank and counted once. Over pp every stage has
// its own parameters, except the tied wte, held by the first and the last stage with the same
// (summed) gradient: counted on the last stage only. With ZeRO, this rank's pieces of them.
// One rank holding the whole model needs no list (one pass over the flat buffer).
void Trainer::build_norm_lists() {
  const bool skip_wte = pp_size_ > 1 && !model_->stage().has_head;
  auto add = [&](const float* p, size_t n, const ParamInfo& info) {
    if (skip_wte && &info == wte_) return;
    norm_.ptrs.push_back(p);
    norm_.counts.push_back(n);
    norm_.replicated.push_back(info.shard == Shard::kReplicated);
  };
  if (sharded_) {
    for (const OwnedPiece& piece : owned_)
      add(shard_grads_.data() + piece.shard, piece.count, model_->params_info()[piece.param]);
  } else if (model_->tensor_parallel().size > 1 || pp_size_ > 1) {
    for (const ParamInfo& p : model_->params_info()) add(model_->grads() + p.offset, p.count, p);
  }
  norm_.sums.resize(norm_.ptrs.size());
}

// Σ g² of the listed tensors: {sharded over tp, replicated}, added in the list's order.
std::array<double, 2> Trainer::norm_parts() {
  ctx_.backend->sum_squares_each(norm_.ptrs.data(), norm_.counts.data(), norm_.ptrs.size(),
                                 norm_.sums.data());
  std::array<double, 2> parts = {0.0, 0.0};
  for (size_t i = 0; i < norm_.sums.size(); ++i) parts[norm_.replicated[i] ? 1 : 0] += norm_.sums[i];
  return parts;
}

// Note [Memory plan] (src/backend/counting_backend.cpp): what this rank will allocate — the
// model built on a counting backend (parameters, gradients, activations and scratch, exactly
// as the real build will), plus AdamW's moments and ZeRO's shard gradients — against what the
// backend has free. Host memory is shared by the ranks on the machine, so there the sum over
// them is compared. The refusal is an input_error of this rank; setup_step (app) makes every
// rank exit 2 with the lowest failing rank's message.
void Trainer::check_memory_plan(const GPTConfig& cfg, int B, int T, const GPTOptions& options) {
  size_t model_bytes = 0;
  {
    auto counter = make_counting_backend(*ctx_.backend, &model_bytes);
    GPT probe(cfg, *counter, B, T, options);
  }
  size_t param_floats = options.param_total;
  if (param_floats == 0)
    for (const ParamInfo& p : gpt_param_layout(cfg, options.tp.size, options.tp.rank, options.stage,
                                               options.wte_after_head))
      param_floats += p.count;
  const size_t shard_floats = sharded_ ? param_floats / size_t(dp_size_) : 0;
  const double params = double(param_floats) * 4, shard = double(shard_floats) * 4;
  const double optimizer = 2.0 * double(sharded_ ? shard_floats : param_floats) * 4;
  const double acts = double(model_bytes) - 2 * params;
  const double need = double(model_bytes) + optimizer + shard;
  // Ranks sharing this machine's memory, from the launcher (Open MPI sets it under mpirun and
  // srun); not a collective: ranks may have failed an earlier, rank-local check (their data),
  // and setup_step agrees on the outcome (a collective here would pair with its all-reduce).
  int local = 1;
  if (const char* n = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE"); n && !ctx_.backend->is_device())
    local = std::max(1, std::atoi(n));
  const double free_bytes = double(ctx_.backend->free_memory_bytes());
  if (free_bytes <= 0 || need * local <= free_bytes) return;
  constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
  const char* largest = acts >= params && acts >= optimizer ? "activations and scratch"
                        : optimizer >= params               ? "optimizer state"
                                                            : "parameters";
  input_error("not enough memory: each rank needs {:.2f} GiB ({} here: parameters {:.2f}, "
              "gradients {:.2f}, optimizer state {:.2f}, activations and scratch {:.2f}; the "
              "largest: {}){}, but only {:.2f} GiB is free ({}); lower model.* or "
              "train.micro_batch, set train.recompute, or shard with parallel.tp/pp/zero",
              need / GiB, ctx_.backend->name(), params / GiB, (params + shard) / GiB,
              optimizer / GiB, acts / GiB, largest,
              local > 1 ? fmt::format(", {:.2f} GiB for the {} ranks on this machine",
                                      need * local / GiB, local)
                        : std::string(),
              free_bytes / GiB,
              ctx_.backend->is_device() ? "device memory" : "MemAvailable in /proc/meminfo");
}

Trainer::~Trainer() {
  // Gathers still in flight must end before the communicator and the buffers go.
  try {
    sync_params();
  } catch (...) {
  }
}

void Trainer::sync_params() {
  if (sharded_) reducer_->wait_all_gathered();
}

Trainer::MemoryBytes Trainer::memory_bytes() const {
  MemoryBytes m;
  m.params = model_->num_params() * sizeof(float);
  m.grads = (model_->num_params() + shard_grads_.size()) * sizeof(float);
  m.grads_resident = release_grads_ ? grad_resident_peak_ + shard_grads_.size() * sizeof(float)
                                    : m.grads;
  m.optimizer = 2 * opt_->size() * sizeof(float);
  m.activations = model_->activation_bytes();
  return m;
}

void Trainer::record(const char* track, const std::string& name,
                     std::chrono::steady_clock::time_point b,
                     std::chrono::steady_clock::time_point e) {
  if (ctx_.trace) ctx_.trace->span(track, name, b, e);
}

long Trainer::tokens_per_step() const {
  return long(deck_.train.micro_batch) * deck_.model.seq_len * deck_.train.accum * dp_size_;
}

OpRecord Trainer::collect_step_rows(int step) {
  const int B = deck_.train.micro_batch, T = deck_.model.seq_len;
  const GPTStage::StepInputs in{step, B, T, deck_.train.accum, dp_size_, dp_rank_};
  // Only this rank's micro-batches (Note [Sample order]), into the validation buffers, free
  // between steps. The stage reads them again in forward: O(local) either way.
  step_rows_->clear();
  for (int m = 0; m < in.accum; ++m) {
    train_order_->fill(GPTStage::first_sample(in, m), B, inputs_.data(), targets_.data());
    step_rows_->mark(inputs_.data(), inputs_.size());
  }
  // The compute thread may use dp here (Note [One thread per communicator]): the reducer's
  // thread is idle — the last step's finish() returned and this step's begin_step(true)
  // comes with the last micro-batch's backward. Every rank with the sink (all or none of dp:
  // same deck, same stage) issues it here, before any bucket (Note [Same buckets, same order]).
  const OpRecord span = step_rows_->unite(ctx_.grid->dp());
  row_grads_.assign(step_rows_->rows().size() * size_t(model_->config().channels), 0.0f);
  return span;
}

void Trainer::add_embedding_rows() {
  // The averaged sparse rows join wte's (averaged) dense gradient: with ZeRO only the parts of
  // the rows inside this rank's shard of wte's bucket.
  Backend& be = *ctx_.backend;
  const size_t C = size_t(model_->config().channels);
  const size_t v0 = size_t(model_->vocab_begin());
  const std::vector<int32_t>& rows = step_rows_->rows();
  if (!sharded_) {
    float* dwte = model_->grads() + wte_->offset;
    for (size_t k = 0; k < rows.size(); ++k) {
      float* row = dwte + (size_t(rows[k]) - v0) * C;
      be.add(row, row, row_grads_.data() + k * C, C);
    }
    return;
  }
  // wte's buckets: one, or one per piece (Note [Head gradient in pieces]); a row lies in one.
  const size_t wte_index = size_t(wte_ - model_->params_info().data());
  for (int u = unit_first_[wte_index]; u < unit_first_[wte_index + 1]; ++u) {
    const size_t b = reducer_->bucket_of_param(size_t(u));
    const size_t n = reducer_->shard_count(b);
    const size_t lo = reducer_->buckets()[b].offset + size_t(dp_rank_) * n, hi = lo + n;
    float* shard = shard_grads_.data() + reducer_->shard_offset(b);
    for (size_t k = 0; k < rows.size(); ++k) {
      const size_t start = wte_->offset + (size_t(rows[k]) - v0) * C;
      const size_t begin = std::max(lo, start), end = std::min(hi, start + C);
      if (begin >= end) continue;
      float* g = shard + (begin - lo);
      be.add(g, g, row_grads_.data() + k * C + (begin - start), end - begin);
    }
  }
}

void Trainer::reduce_tied_embedding() {
  if (pp_size_ == 1 || !ctx_.grid->in_embedding_group()) return;
  if (sharded_) {
    // wte has a bucket of its own on both stages (Note [Padded buckets]), so this rank's shard
    // is the same slice of wte on the first and the last stage.
    // pp > 1: wte is one unit (no pieces), so one bucket.
    const size_t wte_index = size_t(wte_ - model_->params_info().data());
    const size_t b = reducer_->bucket_of_param(size_t(unit_first_[wte_index]));
    HostView<float> g(*ctx_.backend, shard_grads_.data() + reducer_->shard_offset(b),
                      reducer_->shard_count(b), /*load=*/true);
    ctx_.grid->embedding().all_reduce(g.data(), reducer_->shard_count(b)).wait();
    g.commit();
    return;
  }
  const ParamInfo& wte = *wte_;
  // Host MPI on a host view (Note [Stage transfers on a device] in train/gpt_stage.h).
  HostView<float> g(*ctx_.backend, model_->grads() + wte.offset, wte.count, /*load=*/true);
  ctx_.grid->embedding().all_reduce(g.data(), wte.count).wait();
  g.commit();
}

// Note [Non-finite steps]
// A step whose loss or global gradient norm is NaN or infinite has nothing to apply. The norm
// is taken from the reduced gradients and summed over tp and pp (and over dp with ZeRO); the
// loss is summed over pp and dp: so both are the same number on every rank, and every rank
// decides the same without another collective. train.nonfinite: stop (the default) ends the
// run with a message saying so (before the optimizer: nothing of the step is applied, and the
// last checkpoint is untouched); skip drops the update — no AdamW, no ZeRO gather, the moments
// and the parameters stay those of the last good step, so a non-finite state is never saved —
// marks the step in the metrics ("skipped": true) and stops after train.max_skips skips in a
// row. The step still counts for the schedule (the learning rate and AdamW's bias correction
// go on from the step number), as Megatron's skipped steps do. TRIDENT_FAULT_NAN_STEPS (1-based
// step numbers, comma-separated) injects such a step for tests: every rank puts one NaN in its
// reduced gradient.
StepStats Trainer::train_step(int step) {
  const auto t_step = std::chrono::steady_clock::now();
  Backend& be = *ctx_.backend;
  const TrainConfig& tc = deck_.train;
  const int B = tc.micro_batch, T = deck_.model.seq_len, accum = tc.accum;
  StepStats s;
  s.step = step + 1;

  // ZeRO-2 left the gradient buffer zero (and its pages with the kernel) when the last step's
  // buckets were released.
  if (!release_grads_) model_->zero_grads();
  const bool use_sink = use_sink_;
  const OpRecord rows_union = use_sink ? collect_step_rows(step) : OpRecord{};
  stage_->begin_step({step, B, T, accum, dp_size_, dp_rank_});
  const PipelineStats ps =
      run_pipeline(schedule_, *pp_comm_, pp_size_, pp_rank_, accum, *stage_, chunks_);
  s.forward_ms = stage_->forward_ms();
  s.backward_ms = stage_->backward_ms();
  s.pipeline_ms = ps.total_ms;
  s.pipeline_wait_ms = ps.wait_ms;

  if (reducer_) {
    if (use_sink) reducer_->add_extra(row_grads_.data(), row_grads_.size(), "wte rows");
    reducer_->finish();  // gradients are now the dp average
    // The step's rounds: one, or one per micro-batch (Note [ZeRO-2 and accumulation]), joined
    // only then (a copy of every record, which the usual one round does without).
    ReduceStats joined;
    const ReduceStats* rounds = &reducer_->stats();
    if (stage_->earlier_rounds().reduced) {
      joined = stage_->earlier_rounds();
      joined += *rounds;
      rounds = &joined;
    }
    const ReduceStats& rs = *rounds;
    // The row set's union ran before the pipeline with nothing to overlap it: comm and
    // exposed alike (it ended before any bucket started, so the spans simply add).
    const double rows_ms = use_sink ? rows_union.ms() : 0.0;
    s.comm_ms = rs.comm_ms + rows_ms;
    s.exposed_comm_ms = rs.exposed_comm_ms + rows_ms;
    s.comm_cpu_ms = rs.thread_cpu_ms;
    s.comm_polls = rs.progress_polls;
    s.grad_resident_bytes = rs.grad_resident_peak_bytes;
    s.held_wait_ms = rs.held_wait_ms;
    grad_resident_peak_ = std::max(grad_resident_peak_, rs.grad_resident_peak_bytes);
    s.overlap = s.comm_ms > 0 ? std::max(0.0, 1.0 - s.exposed_comm_ms / s.comm_ms) : 0.0;
    if (rs.ahead_bucket >= 0 && !ready_order_warned_) {  // Note [Ready order check]
      ready_order_warned_ = true;
      s.warning = fmt::format(
          "the gradient buckets did not become ready in order (step {}): {} was complete while "
          "{} still waited, and buckets start in order, so it and every later bucket waited "
          "for that one; overlap is lost. The parameters are not laid out in the order "
          "backward finishes them (gpt_param_layout)", s.step,
          reducer_->bucket_name(size_t(rs.ahead_bucket)),
          reducer_->bucket_name(size_t(rs.late_bucket)));
    }
    if (ctx_.trace) {
      if (use_sink)
        ctx_.trace->span("all-reduce", "wte row set", rows_union.start, rows_union.end, "comm");
      for (const BucketRecord& r : rs.records)
        ctx_.trace->span("all-reduce", r.name, r.start_ms, r.end_ms, "comm");
    }
    if (use_sink) add_embedding_rows();
  }
  reduce_tied_embedding();

  // The loss lives on the last stage: sum over pp (others contribute 0), then over dp.
  double loss = stage_->take_loss_sum();
  if (pp_size_ > 1) pp_comm_->all_reduce(&loss, 1).wait();
  if (dp_size_ > 1) ctx_.grid->dp().all_reduce(&loss, 1).wait();
  s.loss = loss / (accum * dp_size_);

  auto t0 = std::chrono::steady_clock::now();
  if (std::find(fault_nan_steps_.begin(), fault_nan_steps_.end(), s.step) != fault_nan_steps_.end())
    poison_gradient();
  s.grad_norm = std::sqrt(sharded_ ? sharded_grad_sum_squares() : global_grad_sum_squares());
  s.lr = lr_at(tc, step);
  // Note [Non-finite steps]: the loss and the norm are the same on every rank (both were summed
  // over every axis that holds a part of them), so every rank takes the same branch.
  if (!std::isfinite(s.loss) || !std::isfinite(s.grad_norm)) {
    if (tc.nonfinite == "stop")
      throw Error(fmt::format("step {}: the loss is {} and the gradient norm {}: training "
                              "diverged (or a batch is broken); nothing of this step was applied "
                              "or saved. Lower train.lr, or set train.nonfinite: skip to drop "
                              "such steps", s.step, s.loss, s.grad_norm),
                  ExitCode::kInternal);
    s.skipped = true;
    s.skips_in_a_row = ++skips_in_a_row_;
    if (skips_in_a_row_ > tc.max_skips)
      throw Error(fmt::format("step {}: {} steps in a row had a non-finite loss or gradient norm "
                              "(train.max_skips {}): training diverged; the parameters are those "
                              "of the last good step", s.step, skips_in_a_row_, tc.max_skips),
                  ExitCode::kInternal);
    s.optimizer_ms = ms_since(t0);
    s.tp_comm_ms = model_->take_tp_comm_ms();
    s.ms_per_step = ms_since(t_step);
    s.tokens_per_s = double(tokens_per_step()) / (s.ms_per_step / 1e3);
    s.mfu = NAN;
    return s;
  }
  skips_in_a_row_ = 0;
  // Clipping is applied inside AdamW's pass over the gradients (the same float products as a
  // separate scaling pass, which would read and write every gradient once more).
  const float grad_scale =
      tc.grad_clip > 0.0 && s.grad_norm > tc.grad_clip ? float(tc.grad_clip / s.grad_norm) : 1.0f;
  if (sharded_) {
    opt_->update_shard(be, model_->params(), shard_grads_.data(), owned_runs_, tc, float(s.lr),
                       step + 1, grad_scale);
    // The round waited for in this step: the last step's, launched after its optimizer and
    // complete now (forward read every bucket); with overlap off, this step's own.
    GatherStats g = reducer_->take_gather_stats();
    reducer_->start_param_gather(model_->params());  // Note [Gathers before use]
    if (!deck_.comm.overlap) {
      reducer_->wait_all_gathered();
      g = reducer_->take_gather_stats();
    }
    s.gather_comm_ms = g.comm_ms;
    s.gather_exposed_ms = g.exposed_ms;
    if (ctx_.trace)
      for (const BucketRecord& r : g.records)
        ctx_.trace->span("all-gather", r.name, r.start_ms, r.end_ms, "comm");
  } else {
    opt_->update(be, *model_, tc, float(s.lr), step + 1, grad_scale);
  }
  be.synchronize();  // a device step ends when its last op has run, not when it was issued
  s.optimizer_ms = ms_since(t0);
  if (ctx_.trace) record("compute", "optimizer", t0, std::chrono::steady_clock::now());

  s.tp_comm_ms = model_->take_tp_comm_ms();
  s.ms_per_step = ms_since(t_step);
  const double tokens = double(tokens_per_step());
  s.tokens_per_s = tokens / (s.ms_per_step / 1e3);
  // MFU: the step's FLOPs are spread over all ranks, each with its own (measured) peak. NaN
  // (not reported) without a peak, or above 1: then the peak was wrong (trident/peak_check.h).
  const int ranks = ctx_.grid ? ctx_.grid->world_size() : 1;
  s.mfu = mfu_or_nan(model_->config().train_flops_per_token(T) * s.tokens_per_s,
                     ctx_.peak_flops * ranks);
  return s;
}

double Trainer::global_grad_sum_squares() {
  // What is counted where: build_norm_lists. One rank holds the whole model: one pass over the
  // flat buffer (on a GPU one reduction and one wait instead of one per tensor).
  if (model_->tensor_parallel().size == 1 && pp_size_ == 1)
    return ctx_.backend->sum_squares(model_->grads(), model_->num_params());
  std::array<double, 2> parts = norm_parts();
  if (model_->tensor_parallel().size > 1) ctx_.grid->tp().all_reduce(&parts[0], 1).wait();
  double total = parts[0] + parts[1];
  if (pp_size_ > 1) pp_comm_->all_reduce(&total, 1).wait();
  return total;
}

// Note [Non-finite steps]: fault injection for tests and tools/chaos: TRIDENT_FAULT_NAN_STEPS
// lists 1-based steps whose gradient every rank poisons with one NaN after the reduction, as a
// diverged step would have it everywhere.
void Trainer::poison_gradient() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float* g = sharded_ ? shard_grads_.data() + (owned_.empty() ? 0 : owned_.front().shard)
                      : model_->grads();
  ctx_.backend->copy(g, &nan, sizeof(float));
}

double Trainer::sharded_grad_sum_squares() {
  // As global_grad_sum_squares, from this rank's pieces; the partial sums are added over dp.
  std::array<double, 2> parts = norm_parts();
  ctx_.grid->dp().all_reduce(parts.data(), 2).wait();
  if (model_->tensor_parallel().size > 1) ctx_.grid->tp().all_reduce(&parts[0], 1).wait();
  double total = parts[0] + parts[1];
  if (pp_size_ > 1) pp_comm_->all_reduce(&total, 1).wait();
  return total;
}

double Trainer::validation_forward(int micro, int B, int T) {
  // Forward only, stage by stage (no schedule needed): receive, forward, send — once per
  // chunk with interleaved stages, around the ring (Note [Interleaved 1F1B]).
  valid_order_->fill(uint64_t(micro) * B, B, inputs_.data(), targets_.data());
  const StageSpec& st = model_->stage();
  const size_t boundary = model_->boundary_rows(B, T) * size_t(model_->config().channels);
  // Any tag of the runner's range would do: validation runs between steps, when every pipeline
  // message has been received, so nothing is left to match it by mistake. 0, within the 32767
  // every MPI guarantees. The chunks' messages follow each other in order.
  constexpr int kTag = 0;
  Backend& be = *ctx_.backend;
  const int chunks = st.chunks();
  const int prev = (pp_rank_ + pp_size_ - 1) % pp_size_, next = (pp_rank_ + 1) % pp_size_;
  double loss = 0.0;
  for (int c = 0; c < chunks; ++c) {
    const int slot = model_->slot_for(c, 0);
    const bool first = st.has_embedding && c == 0, last = st.has_head && c == chunks - 1;
    if (!first) {  // host MPI: through a host view on a device backend
      HostView<float> in(be, model_->stage_input(slot), boundary, /*load=*/false);
      pp_comm_->recv(in.data(), boundary, prev, kTag).wait();
      in.commit();
    }
    loss = model_->forward(slot, inputs_.data(), last ? targets_.data() : nullptr, B, T);
    if (!last) {
      HostView<const float> out(be, model_->stage_output(slot), boundary, /*load=*/true);
      pp_comm_->send(out.data(), boundary, next, kTag).wait();
    }
  }
  return st.has_head ? loss : 0.0;
}

double Trainer::validate() {
  if (!valid_order_) return NAN;
  const int B = deck_.train.micro_batch, T = deck_.model.seq_len;
  // Validation micro-batches are dealt round-robin over dp ranks; the mean is over all of them.
  double sum[2] = {0.0, 0.0};  // loss sum, micro-batch count
  for (int i = dp_rank_; i < deck_.train.val_batches; i += dp_size_) {
    sum[0] += validation_forward(i, B, T);
    sum[1] += 1.0;
  }
  if (pp_size_ > 1) pp_comm_->all_reduce(&sum[0], 1).wait();
  if (dp_size_ > 1) ctx_.grid->dp().all_reduce(sum, 2).wait();
  return sum[0] / sum[1];
}

}  // namespace trident
