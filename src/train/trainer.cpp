#include <chrono>
#include <cmath>

#include "trident/check.h"
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
    if (m.seq_len > cfg.max_seq_len)
      input_error("model.seq_len: {} exceeds model.init_from's max sequence length {}", m.seq_len,
                  cfg.max_seq_len);
    return cfg;
  }
  cfg.layers = m.layers;
  cfg.channels = m.d_model;
  cfg.heads = m.heads;
  cfg.vocab = m.vocab;
  cfg.padded_vocab = GPTConfig::pad_vocab(m.vocab);
  cfg.max_seq_len = m.seq_len;
  return cfg;
}

Trainer::Trainer(const Deck& deck, TrainContext ctx) : deck_(deck), ctx_(ctx) {
  GPTConfig cfg = model_config_from_deck(deck_, nullptr);
  const int B = deck_.train.micro_batch, T = deck_.model.seq_len;
  // Open (and validate) the data before allocating the model.
  train_data_ = TokenDataset::open(deck_.data.train, cfg.vocab, "data.train");
  train_order_ = std::make_unique<SampleOrder>(*train_data_, T, deck_.data.shuffle,
                                               deck_.train.seed);
  if (!deck_.data.valid.empty()) {
    valid_data_ = TokenDataset::open(deck_.data.valid, cfg.vocab, "data.valid");
    valid_order_ = std::make_unique<SampleOrder>(*valid_data_, T, false, 0);
  }
  model_ = std::make_unique<GPT>(cfg, *ctx_.backend, B, T);
  if (deck_.model.init_from.empty())
    model_->init_weights(deck_.train.seed);
  else
    load_llmc_weights(*model_, deck_.model.init_from);
  opt_ = std::make_unique<AdamW>(model_->num_params());
  inputs_.resize(size_t(B) * T);
  targets_.resize(size_t(B) * T);
}

Trainer::~Trainer() = default;

long Trainer::tokens_per_step() const {
  return long(deck_.train.micro_batch) * deck_.model.seq_len * deck_.train.accum;
}

StepStats Trainer::train_step(int step) {
  const auto t_step = std::chrono::steady_clock::now();
  Backend& be = *ctx_.backend;
  const TrainConfig& tc = deck_.train;
  const int B = tc.micro_batch, T = deck_.model.seq_len, accum = tc.accum;
  StepStats s;
  s.step = step + 1;

  model_->zero_grads();
  double loss_sum = 0.0;
  const uint64_t global_batch = uint64_t(B) * accum;
  for (int micro = 0; micro < accum; ++micro) {
    // Note [Sample order]: global position of this micro-batch's first sample. The step's
    // samples are [step·GB, (step+1)·GB) whoever reads them.
    const uint64_t g0 = uint64_t(step) * global_batch + uint64_t(micro) * B;
    train_order_->fill(g0, B, inputs_.data(), targets_.data());
    auto t0 = std::chrono::steady_clock::now();
    loss_sum += model_->forward(inputs_.data(), targets_.data(), B, T);
    s.forward_ms += ms_since(t0);
    t0 = std::chrono::steady_clock::now();
    model_->backward(1.0f / float(accum));
    s.backward_ms += ms_since(t0);
  }
  s.loss = loss_sum / accum;

  auto t0 = std::chrono::steady_clock::now();
  const size_t n = model_->num_params();
  s.grad_norm = std::sqrt(be.sum_squares(model_->grads(), n));
  if (!std::isfinite(s.loss) || !std::isfinite(s.grad_norm))
    internal_error(__FILE__, __LINE__,
                   fmt::format("step {}: loss {} / grad norm {} is not finite", s.step, s.loss,
                               s.grad_norm));
  if (tc.grad_clip > 0.0 && s.grad_norm > tc.grad_clip)
    be.scale(model_->grads(), float(tc.grad_clip / s.grad_norm), n);
  s.lr = lr_at(tc, step);
  opt_->update(be, *model_, tc, float(s.lr), step + 1);
  s.optimizer_ms = ms_since(t0);

  s.ms_per_step = ms_since(t_step);
  const double tokens = double(tokens_per_step());
  s.tokens_per_s = tokens / (s.ms_per_step / 1e3);
  if (ctx_.peak_flops > 0)
    s.mfu = model_->config().train_flops_per_token(T) * s.tokens_per_s / ctx_.peak_flops;
  return s;
}

double Trainer::validate() {
  if (!valid_order_) return NAN;
  const int B = deck_.train.micro_batch, T = deck_.model.seq_len;
  double sum = 0.0;
  for (int i = 0; i < deck_.train.val_batches; ++i) {
    valid_order_->fill(uint64_t(i) * B, B, inputs_.data(), targets_.data());
    sum += model_->forward(inputs_.data(), targets_.data(), B, T);
  }
  return sum / deck_.train.val_batches;
}

}  // namespace trident
