#include "train/tied_embedding.h"

#include <algorithm>
#include <numeric>

#include "train/data_parallel.h"
#include "trident/buckets.h"
#include "trident/check.h"
#include "trident/data.h"
#include "trident/grad_reducer.h"
#include "trident/grid.h"
#include "trident/trace.h"

namespace trident {

std::vector<int> head_gradient_pieces(int rows, int channels, size_t elem_bytes,
                                      size_t bucket_bytes, size_t align_elems) {
  if (rows <= 0 || channels <= 0 || bucket_bytes == 0 || bucket_bytes == kOneBucket) return {};
  const size_t bytes = size_t(rows) * size_t(channels) * elem_bytes;
  const size_t pieces = (bytes + bucket_bytes - 1) / bucket_bytes;
  if (pieces <= 1) return {};
  // Rows per piece: a multiple of the rows that make a multiple of align_elems floats.
  const size_t align = std::max<size_t>(align_elems, 1);
  const size_t row_align = align / std::gcd(align, size_t(channels));
  size_t per = (size_t(rows) + pieces - 1) / pieces;
  per = (per + row_align - 1) / row_align * row_align;
  std::vector<int> bounds{0};
  for (size_t r = per; r < size_t(rows); r += per) bounds.push_back(int(r));
  if (bounds.size() == 1) return {};
  bounds.push_back(rows);
  return bounds;
}

TiedEmbedding::TiedEmbedding(const GPTConfig& cfg, int dp_size, int pp_size, bool device_backend,
                             size_t bucket_bytes, GPTOptions& options)
    : pp_size_(pp_size), has_head_(options.stage.has_head), channels_(cfg.channels) {
  const StageSpec& stage = options.stage;
  TRIDENT_CHECK(stage.has_embedding || stage.has_head, "a tied embedding on a stage without wte");
  // Note [Tied embedding gradient] (trident/model.h): the row sink needs both halves of wte's
  // gradient on this stage (pp = 1) and host code to collect the rows; elsewhere wte is
  // reduced whole after the embedding's backward, so it goes last in the ready order (laid
  // out first, its bucket would be ready last and, buckets starting in order, hold up all).
  uses_sink_ = dp_size > 1 && stage.has_embedding && stage.has_head && !device_backend;
  options.wte_after_head = dp_size == 1 || uses_sink_;
  // Note [Head gradient in pieces]: where the head gradient is final right after the head and
  // is reduced. Aligned to 16·dp floats whatever the ZeRO stage, so zero 0, 1 and 2 run the
  // same GEMMs.
  if (uses_sink_)
    piece_rows_ = head_gradient_pieces(cfg.padded_vocab / options.tp.size, cfg.channels,
                                       sizeof(float), bucket_bytes, size_t(dp_size) * 16);
  options.wte_piece_rows = piece_rows_;
}

int TiedEmbedding::wte_index(const std::vector<ParamInfo>& params) const {
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].name == "wte") return int(i);
  internal_error(__FILE__, __LINE__, "a tied embedding on a stage without wte");
}

void TiedEmbedding::attach(GPT& model, DataParallel* dp, ProcessGrid* grid,
                           Communicator* device_comm, const SampleOrder& order, TraceWriter* trace,
                           long tokens_per_step) {
  model_ = &model;
  dp_ = dp;
  grid_ = grid;
  device_comm_ = pp_size_ > 1 ? device_comm : nullptr;
  if (device_comm_) sum_mark_ = device_comm_->new_mark(false);
  order_ = &order;
  trace_ = trace;
  wte_ = wte_index(model.params_info());
  if (!uses_sink_) return;
  rows_ = std::make_unique<StepRowSet>(model.vocab_begin(), model.vocab_end());
  // A step has at most one row per token it reads, and no more than the slice: reserved
  // once, so the per-step assign never reallocates.
  const size_t slice = size_t(model.vocab_end() - model.vocab_begin());
  const size_t max_rows = std::min(slice, size_t(tokens_per_step));
  row_grads_.reserve(max_rows * size_t(channels_));
}

double TiedEmbedding::begin_step(const GPTStage::StepInputs& in) {
  if (!uses_sink_) return 0.0;
  // Only this rank's micro-batches (Note [Sample order] in train/gpt_stage.h): O(local) work.
  const size_t tokens = size_t(in.micro_batch) * size_t(in.seq_len);
  tokens_.resize(tokens);
  targets_.resize(tokens);
  row_of_input_.resize(tokens);
  rows_->clear();
  for (int m = 0; m < in.accum; ++m) {
    order_->fill(GPTStage::first_sample(in, m), in.micro_batch, tokens_.data(), targets_.data());
    rows_->mark(tokens_.data(), tokens);
  }
  // Note [One thread per communicator] (trident/comm.h): the compute thread may use dp
  // here, the reducer's thread being idle between the last step's finish() and this step's
  // last backward. Every rank of dp has the sink or none does (same deck, same stage).
  const OpRecord span = rows_->unite(grid_->dp());
  row_grads_.assign(rows_->rows().size() * size_t(channels_), 0.0f);
  if (trace_) trace_->span("all-reduce", "wte row set", span.start, span.end, "comm");
  return span.ms();
}

const EmbeddingRowSink* TiedEmbedding::sink(const std::vector<int32_t>& inputs) {
  if (!uses_sink_) return nullptr;
  for (size_t i = 0; i < inputs.size(); ++i) row_of_input_[i] = rows_->index_of(inputs[i]);
  sink_ = {row_of_input_.data(), row_grads_.data()};
  return &sink_;
}

void TiedEmbedding::add_rows_to_reduction() {
  if (uses_sink_) dp_->reducer().add_extra(row_grads_.data(), row_grads_.size(), "wte rows");
}

void TiedEmbedding::finish_step() {
  if (uses_sink_) add_rows_to_gradient();
  sum_over_stages();
}

void TiedEmbedding::add_rows_to_gradient() {
  // The averaged sparse rows join wte's (averaged) dense gradient: with ZeRO only the parts of
  // the rows inside this rank's shard of wte's buckets.
  Backend& be = model_->backend();
  const size_t C = size_t(channels_);
  const size_t v0 = size_t(model_->vocab_begin());
  const size_t wte_offset = model_->params_info()[size_t(wte_)].offset;
  const std::vector<int32_t>& rows = rows_->rows();
  if (!dp_->sharded()) {
    float* dwte = model_->grads() + wte_offset;
    for (size_t k = 0; k < rows.size(); ++k) {
      float* row = dwte + (size_t(rows[k]) - v0) * C;
      be.add(row, row, row_grads_.data() + k * C, C);
    }
    return;
  }
  // wte's buckets: one, or one per piece (Note [Head gradient in pieces]); a row lies in one.
  for (int u = dp_->unit(wte_, 0); u < dp_->units_end(wte_); ++u) {
    const DataParallel::ShardSlice shard = dp_->shard_of(u);
    const size_t lo = shard.flat_begin, hi = lo + shard.count;
    for (size_t k = 0; k < rows.size(); ++k) {
      const size_t start = wte_offset + (size_t(rows[k]) - v0) * C;
      const size_t begin = std::max(lo, start), end = std::min(hi, start + C);
      if (begin >= end) continue;
      float* g = shard.grads + (begin - lo);
      be.add(g, g, row_grads_.data() + k * C + (begin - start), end - begin);
    }
  }
}

void TiedEmbedding::sum_over_stages() {
  if (pp_size_ == 1) return;
  float* grads = nullptr;
  size_t count = 0;
  if (dp_ && dp_->sharded()) {
    // wte has a bucket of its own on both stages (needs_own_bucket), so this rank's shard is
    // the same slice of wte on the first and the last stage.
    const DataParallel::ShardSlice shard = dp_->shard_of(dp_->unit(wte_, 0));
    grads = shard.grads;
    count = shard.count;
  } else {
    const ParamInfo& wte = model_->params_info()[size_t(wte_)];
    grads = model_->grads() + wte.offset;
    count = wte.count;
  }
  if (device_comm_) {
    // Note [Stage sum in device memory]
    // On a device wte's gradient is summed where it is, by one all-reduce ordered after the
    // compute stream's point now (the gradient final) and before its next kernels (the norm,
    // AdamW): the host neither copies nor waits. The last step's sum completed long ago on the
    // device; waiting for it here only reports its failure or timeout.
    sum_.wait();
    if (sum_mark_) {
      device_comm_->record_mark(*sum_mark_);
      device_comm_->order_after(sum_mark_.get());
    }
    sum_ = device_comm_->all_reduce(grads, count, ReduceOp::kSum, "wte over stages");
    device_comm_->compute_waits_for_comm();
    return;
  }
  // Host MPI on a host view: a copy of wte's gradient there and back (without a device
  // communicator for the embedding group).
  HostView<float> g(model_->backend(), grads, count, /*load=*/true);
  grid_->embedding().all_reduce(g.data(), count).wait();
  g.commit();
}

}  // namespace trident
