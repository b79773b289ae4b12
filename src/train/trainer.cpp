#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "trident/check.h"
#include "trident/grad_reducer.h"
#include "trident/grid.h"
#include "trident/train.h"

namespace trident {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
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
  TensorParallel tp;
  if (ctx_.grid) {
    const GridLayout& g = ctx_.grid->layout();
    if (g.pp != 1)
      input_error("parallel.pp={}: pipeline parallelism is not built yet (its own issue); use "
                  "pp=1", g.pp);
    dp_size_ = g.dp;
    dp_rank_ = ctx_.grid->coord().dp;
    if (g.tp > 1) tp = {&ctx_.grid->tp(), g.tp, ctx_.grid->coord().tp,
                        deck_.parallel.sequence_parallel};
  }
  // Refused before anything is allocated, with the numbers (identically on every rank).
  check_tensor_parallel(cfg, tp.size, tp.sequence_parallel, T);
  // Open (and validate) the data before allocating the model.
  train_data_ = TokenDataset::open(deck_.data.train, cfg.vocab, "data.train");
  train_order_ = std::make_unique<SampleOrder>(*train_data_, T, deck_.data.shuffle,
                                               deck_.train.seed);
  if (!deck_.data.valid.empty()) {
    valid_data_ = TokenDataset::open(deck_.data.valid, cfg.vocab, "data.valid");
    valid_order_ = std::make_unique<SampleOrder>(*valid_data_, T, false, 0);
  }
  GPTOptions options;
  options.tp = tp;
  model_ = std::make_unique<GPT>(cfg, *ctx_.backend, B, T, options);
  if (deck_.model.init_from.empty())
    model_->init_weights(deck_.train.seed);
  else
    load_llmc_weights(*model_, deck_.model.init_from);
  opt_ = std::make_unique<AdamW>(model_->num_params());
  inputs_.resize(size_t(B) * T);
  targets_.resize(size_t(B) * T);

  if (dp_size_ > 1) {
    std::vector<GradParam> params;
    for (const ParamInfo& p : model_->params_info()) params.push_back({p.name, p.offset, p.count});
    GradReducerOptions opt;
    auto mib = [](double mb) {
      const double bytes = mb * 1024.0 * 1024.0;
      return bytes >= double(kOneBucket) ? kOneBucket : size_t(bytes);
    };
    opt.first_bucket_bytes = mib(deck_.comm.first_bucket_mb);
    opt.bucket_bytes = mib(deck_.comm.bucket_mb);
    opt.overlap = deck_.comm.overlap;
    if (ctx_.trace) opt.trace_origin = ctx_.trace->origin();
    MpiComm& dp = ctx_.grid->dp();
    dp.set_timeout(deck_.comm.timeout_s);
    if (deck_.comm.emulate_gbps > 0)
      dp.set_emulated_link(deck_.comm.emulate_gbps, deck_.comm.emulate_latency_us);
    reducer_ = std::make_unique<GradReducer>(dp, model_->grads(), std::move(params), opt);
  }
  if (ctx_.trace)
    model_->set_phase_recorder([this](const std::string& phase, auto b, auto e) {
      record("compute", phase, b, e);
    });
}

void Trainer::record(const std::string& track, const std::string& name,
                     std::chrono::steady_clock::time_point b,
                     std::chrono::steady_clock::time_point e) {
  if (ctx_.trace) ctx_.trace->span(track, name, b, e);
}

void Trainer::collect_step_rows(int step) {
  const int B = deck_.train.micro_batch, T = deck_.model.seq_len;
  const uint64_t global_batch = uint64_t(B) * deck_.train.accum * dp_size_;
  std::vector<uint8_t> seen(size_t(model_->config().vocab), 0);
  std::vector<int32_t> in(T), tg(T);
  for (uint64_t i = 0; i < global_batch; ++i) {
    train_order_->fill(uint64_t(step) * global_batch + i, 1, in.data(), tg.data());
    for (int32_t t : in) seen[size_t(t)] = 1;
  }
  // Only this tp rank's vocabulary slice (Note [Tensor-parallel shards]).
  step_rows_.clear();
  const size_t v1 = std::min(seen.size(), size_t(model_->vocab_end()));
  for (size_t v = size_t(model_->vocab_begin()); v < v1; ++v)
    if (seen[v]) step_rows_.push_back(int32_t(v));
  row_grads_.assign(step_rows_.size() * size_t(model_->config().channels), 0.0f);
}

Trainer::~Trainer() = default;

long Trainer::tokens_per_step() const {
  return long(deck_.train.micro_batch) * deck_.model.seq_len * deck_.train.accum * dp_size_;
}

StepStats Trainer::train_step(int step) {
  const auto t_step = std::chrono::steady_clock::now();
  Backend& be = *ctx_.backend;
  const TrainConfig& tc = deck_.train;
  const int B = tc.micro_batch, T = deck_.model.seq_len, accum = tc.accum;
  const int C = model_->config().channels;
  StepStats s;
  s.step = step + 1;

  model_->zero_grads();
  if (reducer_) collect_step_rows(step);
  double loss_sum = 0.0;
  const uint64_t global_batch = uint64_t(B) * accum * dp_size_;
  for (int micro = 0; micro < accum; ++micro) {
    // Note [Sample order]: the step's samples are global positions [step·GB, (step+1)·GB);
    // micro-batch m of dp rank r takes B of them at (m·dp + r)·B, so the step's set of samples
    // is the same whatever dp is.
    const uint64_t g0 =
        uint64_t(step) * global_batch + (uint64_t(micro) * dp_size_ + dp_rank_) * B;
    train_order_->fill(g0, B, inputs_.data(), targets_.data());
    auto t0 = std::chrono::steady_clock::now();
    loss_sum += model_->forward(inputs_.data(), targets_.data(), B, T);
    s.forward_ms += ms_since(t0);
    t0 = std::chrono::steady_clock::now();
    if (!reducer_) {
      model_->backward(1.0f / float(accum));
    } else {
      // Only the last micro-batch reduces (gradient accumulation); its backward overlaps.
      const bool last = micro == accum - 1;
      reducer_->begin_step(last);
      row_of_input_.resize(inputs_.size());
      for (size_t i = 0; i < inputs_.size(); ++i) {
        auto it = std::lower_bound(step_rows_.begin(), step_rows_.end(), inputs_[i]);
        row_of_input_[i] =
            it != step_rows_.end() && *it == inputs_[i] ? int32_t(it - step_rows_.begin()) : -1;
      }
      EmbeddingRowSink sink{row_of_input_.data(), row_grads_.data()};
      model_->backward(1.0f / float(accum), [this](int i) { reducer_->grad_ready(i); }, &sink);
      if (last) reducer_->add_extra(row_grads_.data(), row_grads_.size(), "wte rows");
    }
    s.backward_ms += ms_since(t0);
  }

  if (reducer_) {
    reducer_->finish();  // gradients are now the dp average
    const ReduceStats& rs = reducer_->stats();
    s.comm_ms = rs.comm_ms;
    s.exposed_comm_ms = rs.exposed_comm_ms;
    s.overlap = rs.comm_ms > 0 ? std::max(0.0, 1.0 - rs.exposed_comm_ms / rs.comm_ms) : 0.0;
    if (ctx_.trace)
      for (const BucketRecord& r : rs.records)
        ctx_.trace->span("all-reduce", r.name, r.start_ms, r.end_ms, "comm");
    // The averaged sparse rows join wte's (averaged) dense gradient.
    float* dwte = model_->grads() + model_->param("wte").offset;
    const size_t v0 = size_t(model_->vocab_begin());
    for (size_t k = 0; k < step_rows_.size(); ++k) {
      float* row = dwte + (size_t(step_rows_[k]) - v0) * C;
      be.add(row, row, row_grads_.data() + k * C, size_t(C));
    }
    double loss = loss_sum;
    ctx_.grid->dp().all_reduce(&loss, 1).wait();
    s.loss = loss / (accum * dp_size_);
  } else {
    s.loss = loss_sum / accum;
  }

  auto t0 = std::chrono::steady_clock::now();
  const size_t n = model_->num_params();
  s.grad_norm = std::sqrt(global_grad_sum_squares());
  if (!std::isfinite(s.loss) || !std::isfinite(s.grad_norm))
    internal_error(__FILE__, __LINE__,
                   fmt::format("step {}: loss {} / grad norm {} is not finite", s.step, s.loss,
                               s.grad_norm));
  if (tc.grad_clip > 0.0 && s.grad_norm > tc.grad_clip)
    be.scale(model_->grads(), float(tc.grad_clip / s.grad_norm), n);
  s.lr = lr_at(tc, step);
  opt_->update(be, *model_, tc, float(s.lr), step + 1);
  s.optimizer_ms = ms_since(t0);
  record("compute", "optimizer", t0, std::chrono::steady_clock::now());

  s.tp_comm_ms = model_->take_tp_comm_ms();
  s.ms_per_step = ms_since(t_step);
  const double tokens = double(tokens_per_step());
  s.tokens_per_s = tokens / (s.ms_per_step / 1e3);
  // MFU: the step's FLOPs are spread over all ranks, each with its own (measured) peak.
  const int ranks = ctx_.grid ? ctx_.grid->world_size() : 1;
  if (ctx_.peak_flops > 0)
    s.mfu = model_->config().train_flops_per_token(T) * s.tokens_per_s /
            (ctx_.peak_flops * ranks);
  return s;
}

double Trainer::global_grad_sum_squares() {
  // Sharded tensors: each tp rank has a disjoint part, so their squares are summed over tp.
  // Replicated tensors are identical on every tp rank and counted once.
  Backend& be = *ctx_.backend;
  double sharded = 0.0, replicated = 0.0;
  for (const ParamInfo& p : model_->params_info()) {
    const double ss = be.sum_squares(model_->grads() + p.offset, p.count);
    (p.shard == Shard::kReplicated ? replicated : sharded) += ss;
  }
  if (model_->tensor_parallel().size > 1) ctx_.grid->tp().all_reduce(&sharded, 1).wait();
  return sharded + replicated;
}

double Trainer::validate() {
  if (!valid_order_) return NAN;
  const int B = deck_.train.micro_batch, T = deck_.model.seq_len;
  // Validation micro-batches are dealt round-robin over dp ranks; the mean is over all of them.
  double sum[2] = {0.0, 0.0};  // loss sum, micro-batch count
  for (int i = dp_rank_; i < deck_.train.val_batches; i += dp_size_) {
    valid_order_->fill(uint64_t(i) * B, B, inputs_.data(), targets_.data());
    sum[0] += model_->forward(inputs_.data(), targets_.data(), B, T);
    sum[1] += 1.0;
  }
  if (dp_size_ > 1) ctx_.grid->dp().all_reduce(sum, 2).wait();
  return sum[0] / sum[1];
}

}  // namespace trident
