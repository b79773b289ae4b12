#include "train/gpt_stage.h"

#include <chrono>

#include "trident/check.h"
#include "trident/data.h"

namespace trident {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

GPTStage::GPTStage(GPT& model, const SampleOrder& order, GradReducer* reducer,
                   EmbeddingRowSink* sink)
    : model_(model), order_(order), reducer_(reducer), sink_(sink), slots_(model.num_slots()) {}

void GPTStage::begin_step(const StepInputs& in) {
  in_ = in;
  loss_sum_ = forward_ms_ = backward_ms_ = 0;
  const size_t N = size_t(in.micro_batch) * in.seq_len;
  const size_t boundary = boundary_floats();
  inputs_.assign(in.accum, std::vector<int32_t>(N));
  targets_.assign(in.accum, std::vector<int32_t>(N));
  if (!model_.stage().has_head) doutput_.assign(slots_, std::vector<float>(boundary));
  if (!model_.stage().has_embedding) dinput_.assign(in.accum, std::vector<float>(boundary));
  // Note [Stage transfers on a device]: the received gradients (doutput_) and the sent ones
  // (dinput_) are host buffers already, which the model copies from and to; the activations
  // need host copies of their own.
  if (model_.backend().is_device()) {
    if (!model_.stage().has_embedding) input_host_.assign(slots_, std::vector<float>(boundary));
    if (!model_.stage().has_head) output_host_.assign(slots_, std::vector<float>(boundary));
  }
}

uint64_t GPTStage::first_sample(const StepInputs& in, int micro) {
  const uint64_t global_batch = uint64_t(in.micro_batch) * in.accum * in.dp_size;
  return uint64_t(in.step) * global_batch +
         (uint64_t(micro) * in.dp_size + in.dp_rank) * uint64_t(in.micro_batch);
}

size_t GPTStage::boundary_floats() const {
  return model_.boundary_rows(in_.micro_batch, in_.seq_len) * size_t(model_.config().channels);
}

StageTensor GPTStage::boundary(const char* name, float* data) const {
  const int rows_per_seq = int(model_.boundary_rows(in_.micro_batch, in_.seq_len) /
                               size_t(in_.micro_batch));
  return {name, {in_.micro_batch, rows_per_seq, model_.config().channels}, data};
}

std::vector<StageTensor> GPTStage::forward_inputs(int micro) {
  if (!input_host_.empty()) return {boundary("hidden", input_host_[slot(micro)].data())};
  return {boundary("hidden", model_.stage_input(slot(micro)))};
}

void GPTStage::forward(int micro) {
  const auto t0 = std::chrono::steady_clock::now();
  const int B = in_.micro_batch, T = in_.seq_len;
  const uint64_t g0 = first_sample(in_, micro);  // Note [Sample order] (gpt_stage.h)
  if (!input_host_.empty())  // the received activations, into the device's stage input
    model_.backend().copy(model_.stage_input(slot(micro)), input_host_[slot(micro)].data(),
                          boundary_floats() * sizeof(float));
  const bool needs_tokens = model_.stage().has_embedding || model_.stage().has_head;
  if (needs_tokens) order_.fill(g0, B, inputs_[micro].data(), targets_[micro].data());
  loss_sum_ += model_.forward(slot(micro), inputs_[micro].data(),
                              model_.stage().has_head ? targets_[micro].data() : nullptr, B, T);
  forward_ms_ += ms_since(t0);
}

std::vector<StageTensor> GPTStage::forward_outputs(int micro) {
  if (!output_host_.empty()) {
    // A copy to host memory has completed when copy() returns (Note [Backend memory]).
    float* host = output_host_[slot(micro)].data();
    model_.backend().copy(host, model_.stage_output(slot(micro)), boundary_floats() * sizeof(float));
    return {boundary("hidden", host)};
  }
  return {boundary("hidden", const_cast<float*>(model_.stage_output(slot(micro))))};
}

std::vector<StageTensor> GPTStage::backward_inputs(int micro) {
  return {boundary("dhidden", doutput_[slot(micro)].data())};
}

void GPTStage::backward(int micro) {
  const auto t0 = std::chrono::steady_clock::now();
  const bool last = micro == in_.accum - 1;
  GradReadyFn on_ready;
  if (reducer_) {
    // Gradient accumulation: only the last micro-batch's backward reduces (and overlaps).
    reducer_->begin_step(last);
    on_ready = [this](int i) { reducer_->grad_ready(i); };
  }
  const EmbeddingRowSink* sink = nullptr;
  if (sink_) {
    if (before_backward) before_backward(micro);
    sink = sink_;
  }
  model_.backward(slot(micro), 1.0f / float(in_.accum),
                  model_.stage().has_head ? nullptr : doutput_[slot(micro)].data(),
                  model_.stage().has_embedding ? nullptr : dinput_[micro].data(), on_ready, sink);
  backward_ms_ += ms_since(t0);
}

std::vector<StageTensor> GPTStage::backward_outputs(int micro) {
  return {boundary("dhidden", dinput_[micro].data())};
}

}  // namespace trident
