#include "train/gpt_stage.h"

#include <algorithm>
#include <chrono>

#include "core/elapsed.h"
#include "train/data_parallel.h"
#include "train/tied_embedding.h"
#include "trident/check.h"
#include "trident/data.h"

namespace trident {
namespace {

template <typename T>
void per_slot(std::vector<std::vector<T>>& buffers, int slots, bool needed, size_t n) {
  buffers.assign(needed ? size_t(slots) : 0, std::vector<T>(n));
}

void per_slot(std::vector<BackendBuffer<float>>& buffers, Backend& be, int slots, bool needed,
              size_t n) {
  buffers.clear();
  for (int i = 0; needed && i < slots; ++i) buffers.emplace_back(be, n);
}

}  // namespace

GPTStage::GPTStage(GPT& model, DataParallel* dp, TiedEmbedding* tied, bool device_links)
    : model_(model), dp_(dp), tied_(tied), slots_(model.num_slots()),
      device_links_(device_links && model.backend().is_device()) {
  each_micro_batch_ = dp_ && dp_->reduces_every_micro_batch();
  // Note [Progress during compute] (trident/pipeline.h): the model calls this between its
  // layers; it tests the transfers of the pipeline run in progress (none outside one). One
  // stage per model: set here for the stage's lifetime, cleared when it goes.
  model_.set_progress([this] { progress_transfers(); });
  const size_t n = model_.moe_totals_floats();
  const bool several =
      model_.stage().chunks() > 1 || !model_.stage().has_embedding || !model_.stage().has_head;
  per_slot(totals_, slots_, n > 0 && several && !device_links_, n);
  per_slot(dtotals_, slots_, n > 0 && several && !device_links_, n);
  per_slot(totals_dev_, model_.backend(), slots_, n > 0 && several && device_links_, n);
  per_slot(dtotals_dev_, model_.backend(), slots_, n > 0 && several && device_links_, n);
}

GPTStage::~GPTStage() { model_.set_progress({}); }

void GPTStage::begin_step(const StepInputs& in, const SampleOrder& order) {
  in_ = in;
  order_ = &order;
  forward_ms_ = backward_ms_ = 0;  // the model's loss sum was taken (zeroed) by the last step
  reducing_ = false;
  earlier_rounds_ = ReduceStats{};
  // The buffers depend on the micro-batch shape only: allocated when it first appears or
  // changes, never per step. All are per slot, like the model's activations: micro-batch m
  // uses them from its forward to its backward, and m + slots's forward comes after that.
  const size_t tokens = size_t(in.micro_batch) * in.local_seq_len();
  const size_t boundary = boundary_floats();
  if (tokens == tokens_ && boundary == boundary_) return;
  tokens_ = tokens;
  boundary_ = boundary;
  const StageSpec& st = model_.stage();
  const bool needs_tokens = st.has_embedding || st.has_head;  // a middle stage reads none
  // With several chunks every kind of boundary occurs on every stage (the first stage's
  // later chunks receive, the last stage's earlier ones send).
  const bool receives = !st.has_embedding || st.chunks() > 1;
  const bool sends = !st.has_head || st.chunks() > 1;
  per_slot(inputs_, slots_, needs_tokens, tokens);
  per_slot(targets_, slots_, needs_tokens, tokens);
  // One sent gradient per slot suffices: micro-batch m's forward starts only once the send of
  // m − slots's gradient has completed (Note [Slot reuse] in train/pipeline_runner.cpp).
  Backend& be = model_.backend();
  per_slot(doutput_, slots_, sends && !device_links_, boundary);
  per_slot(dinput_, slots_, receives && !device_links_, boundary);
  per_slot(doutput_dev_, be, slots_, sends && device_links_, boundary);
  per_slot(dinput_dev_, be, slots_, receives && device_links_, boundary);
  // Note [Stage transfers on a device] (trident/pipeline.h): without links the received
  // gradients (doutput_) and the sent ones (dinput_) are host buffers already, which the model
  // copies from and to; the activations need host copies of their own.
  const bool staged = be.is_device() && !device_links_;
  per_slot(input_host_, slots_, staged && receives, boundary);
  per_slot(output_host_, slots_, staged && sends, boundary);
}

uint64_t GPTStage::first_sample(const StepInputs& in, int micro) {
  const uint64_t global_batch = uint64_t(in.micro_batch) * in.accum * in.dp_size;
  return uint64_t(in.step) * global_batch +
         (uint64_t(micro) * in.dp_size + in.dp_rank) * uint64_t(in.micro_batch);
}

size_t GPTStage::boundary_floats() const {
  const size_t rows = model_.boundary_rows(in_.micro_batch, in_.local_seq_len());
  return rows * size_t(model_.config().channels);
}

float* GPTStage::doutput(int slot) {
  return device_links_ ? doutput_dev_[size_t(slot)].data() : doutput_[size_t(slot)].data();
}

float* GPTStage::dinput(int slot) {
  return device_links_ ? dinput_dev_[size_t(slot)].data() : dinput_[size_t(slot)].data();
}

float* GPTStage::totals(int slot, bool back) {
  if (device_links_) return (back ? dtotals_dev_ : totals_dev_)[size_t(slot)].data();
  return (back ? dtotals_ : totals_)[size_t(slot)].data();
}

std::vector<StageTensor> GPTStage::with_totals(std::vector<StageTensor> tensors, int slot,
                                               bool back) {
  if (!has_totals()) return tensors;
  const int64_t doubles = int64_t(model_.moe_totals_floats() / 2);
  tensors.push_back({"moe_totals", {doubles, 2}, totals(slot, back)});
  return tensors;
}

StageTensor GPTStage::boundary(const char* name, float* data) const {
  const int rows_per_seq =
      int(model_.boundary_rows(in_.micro_batch, in_.local_seq_len()) / size_t(in_.micro_batch));
  return {name, {in_.micro_batch, rows_per_seq, model_.config().channels}, data};
}

std::vector<StageTensor> GPTStage::forward_inputs(int micro, int chunk) {
  const int s = slot(micro, chunk);
  float* hidden = input_host_.empty() ? model_.stage_input(s) : input_host_[size_t(s)].data();
  return with_totals({boundary("hidden", hidden)}, s, false);
}

void GPTStage::forward(int micro, int chunk) {
  const auto t0 = std::chrono::steady_clock::now();
  const int B = in_.micro_batch, T = in_.local_seq_len();
  const uint64_t g0 = first_sample(in_, micro);  // Note [Sample order] (gpt_stage.h)
  if (!input_host_.empty())  // the received activations, into the device's stage input
    model_.backend().copy(model_.stage_input(slot(micro, chunk)),
                          input_host_[slot(micro, chunk)].data(),
                          boundary_floats() * sizeof(float));
  const bool embeds = embedding_chunk(chunk), heads = head_chunk(chunk);
  const bool needs_tokens = embeds || heads;
  int32_t* inputs = needs_tokens ? inputs_[slot(micro, chunk)].data() : nullptr;
  int32_t* targets = needs_tokens ? targets_[slot(micro, chunk)].data() : nullptr;
  if (needs_tokens) order_->fill(g0, B, inputs, targets, in_.cp_size, in_.cp_rank);
  if (!embeds && has_totals())
    model_.receive_moe_totals(slot(micro, chunk), totals(slot(micro, chunk), false));
  model_.forward_accumulate(slot(micro, chunk), inputs, heads ? targets : nullptr, B, T);
  forward_ms_ += ms_since(t0);
}

std::vector<StageTensor> GPTStage::forward_outputs(int micro, int chunk) {
  const int s = slot(micro, chunk);
  if (has_totals()) model_.send_moe_totals(s, totals(s, false));
  if (!output_host_.empty()) {
    // A copy to host memory has completed when copy() returns (Note [Backend memory]).
    float* host = output_host_[size_t(s)].data();
    model_.backend().copy(host, model_.stage_output(s), boundary_floats() * sizeof(float));
    return with_totals({boundary("hidden", host)}, s, false);
  }
  return with_totals({boundary("hidden", const_cast<float*>(model_.stage_output(s)))}, s, false);
}

std::vector<StageTensor> GPTStage::backward_inputs(int micro, int chunk) {
  return with_totals({boundary("dhidden", doutput(slot(micro, chunk)))}, slot(micro, chunk), true);
}

GradReadyFn GPTStage::begin_reduction(int micro) {
  if (!dp_) return {};
  GradReducer* reducer = &dp_->reducer();
  const auto ready = [this, reducer](int i, int piece) {
    reducer->grad_ready(dp_->unit(i, piece));
  };
  if (each_micro_batch_) {
    // Note [ZeRO-2 and accumulation]: the previous micro-batch's round ends here, before this
    // backward writes the buckets it released (its tail overlapped this micro-batch's forward).
    if (reducing_) {
      reducer->finish();
      earlier_rounds_ += reducer->stats();
      dp_->begin_step();  // Note [Shard sums on a device]: a device's pool, zeroed again
    }
    reducer->begin_step(true, /*accumulate_shards=*/micro > 0,
                        /*last_round=*/micro == in_.accum - 1);
    reducing_ = true;
    return ready;
  }
  const bool last = micro == in_.accum - 1;
  // Gradient accumulation: only the last micro-batch's backward reduces (and overlaps). With
  // several chunks each chunk's last backward reports its own parameters, and the step
  // reduces from the first of them on (the reducer waits for each bucket's parameters).
  if (!reducing_) {
    reducer->begin_step(last);
    reducing_ = last;
  }
  if (!last) return {};
  return ready;
}

const EmbeddingRowSink* GPTStage::sink_for(int micro) {
  return tied_ ? tied_->sink(inputs_[slot(micro, 0)]) : nullptr;
}

float GPTStage::dloss_scale() const {
  // Note [Average in the loss seed]
  // The step's loss is the mean over its accum · dp micro-batches, so backward's seed carries
  // 1 / (accum · dp) and the data-parallel reduction only sums (the GradReducer never divides).
  // That saves a division pass over every gradient on the communication thread, which shares
  // the compute cores. With cp each rank's loss is the mean over its T/cp tokens of the
  // sequences, a cp-th of theirs: 1 / cp more (Note [Context parallelism]).
  return 1.0f / (float(in_.accum) * float(in_.dp_size) * float(in_.cp_size));
}

void GPTStage::backward(int micro, int chunk) {
  const auto t0 = std::chrono::steady_clock::now();
  // Reduced after every micro-batch, each one's gradients are final when it ends (the tp
  // partial sums of the LayerNorms included).
  const bool last = micro == in_.accum - 1 || each_micro_batch_;
  const GradReadyFn on_ready = begin_reduction(micro);
  const EmbeddingRowSink* sink = sink_for(micro);
  receive_totals_back(micro, chunk);
  model_.backward(slot(micro, chunk), dloss_scale(), received_gradient(micro, chunk),
                  sent_gradient(micro, chunk), on_ready, sink, last);
  backward_ms_ += ms_since(t0);
}

void GPTStage::backward_input(int micro, int chunk) {
  const auto t0 = std::chrono::steady_clock::now();
  receive_totals_back(micro, chunk);
  model_.backward_input(slot(micro, chunk), dloss_scale(), received_gradient(micro, chunk),
                        sent_gradient(micro, chunk), micro == in_.accum - 1);
  backward_ms_ += ms_since(t0);
}

void GPTStage::backward_weight(int micro, int chunk) {
  const auto t0 = std::chrono::steady_clock::now();
  const GradReadyFn on_ready = begin_reduction(micro);
  model_.backward_weight(slot(micro, chunk), on_ready, sink_for(micro));
  backward_ms_ += ms_since(t0);
}

const float* GPTStage::received_gradient(int micro, int chunk) {
  return head_chunk(chunk) ? nullptr : doutput(slot(micro, chunk));
}

float* GPTStage::sent_gradient(int micro, int chunk) {
  return embedding_chunk(chunk) ? nullptr : dinput(slot(micro, chunk));
}

void GPTStage::receive_totals_back(int micro, int chunk) {
  const int s = slot(micro, chunk);
  if (has_totals() && !head_chunk(chunk)) model_.receive_moe_totals(s, totals(s, true));
}

std::vector<StageTensor> GPTStage::backward_outputs(int micro, int chunk) {
  const int s = slot(micro, chunk);
  if (has_totals()) model_.send_moe_totals(s, totals(s, true));
  return with_totals({boundary("dhidden", dinput(s))}, s, true);
}

}  // namespace trident
