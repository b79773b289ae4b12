// The GPT model as a pipeline stage (trident::PipelineStage): one step's micro-batches through
// this rank's part of the model, fed by a sample order, with the data-parallel reducer driven
// from the last micro-batch's backward and the tied embedding's row sink handed to backward.
#pragma once

#include <vector>

#include "trident/grad_reducer.h"
#include "trident/model.h"
#include "trident/pipeline.h"

namespace trident {

class DataParallel;
class SampleOrder;
class TiedEmbedding;

class GPTStage : public PipelineStage {
 public:
  struct StepInputs {
    int step = 0;
    int micro_batch = 0, seq_len = 0, accum = 1;
    int dp_size = 1, dp_rank = 0;
    // Note [Context parallelism] (model/cp_attention.h): this rank reads chunks cp_rank and
    // 2·cp_size − 1 − cp_rank of each sequence, seq_len / cp_size tokens.
    int cp_size = 1, cp_rank = 0;
    int local_seq_len() const { return seq_len / cp_size; }
  };
  // Note [Sample order]
  // Micro-batch m of dp rank r reads the B samples at global positions step·GB + (m·dp + r)·B
  // onwards (GB = B·accum·dp, the global batch). Stages of one pipeline and the tp ranks of one
  // dp rank read the same samples, and the tied embedding's row set
  // (Note [Step row set] in train/embedding_rows.h) reads the same positions.
  static uint64_t first_sample(const StepInputs& in, int micro);
  // `dp` null: dp = 1; `tied` null: no tied embedding on this stage. Sets the model's progress
  // hook for its lifetime (Note [Progress during compute] in trident/pipeline.h).
  // `device_links`: on a device backend the runner gets StageLinks, so the boundary tensors
  // it is given are device memory (Note [Stage transfers on a device] in trident/pipeline.h);
  // without, they are host copies.
  GPTStage(GPT& model, DataParallel* dp, TiedEmbedding* tied, bool device_links = false);
  ~GPTStage() override;
  GPTStage(const GPTStage&) = delete;
  GPTStage& operator=(const GPTStage&) = delete;

  // Set before run_pipeline (or run_pipeline_forward); the micro-batches are read from `order`;
  // losses collected over the step (last stage only).
  void begin_step(const StepInputs& in, const SampleOrder& order);
  // The step's summed micro-batch losses, read (on a device: waited for) once; then zero.
  double take_loss_sum() { return model_.take_loss_sum(); }
  double forward_ms() const { return forward_ms_; }
  double backward_ms() const { return backward_ms_; }
  // Note [ZeRO-2 and accumulation] (train/zero.h): with DataParallel::reduces_every_micro_batch
  // each micro-batch's backward is a round, finished before the next backward writes the
  // gradients again; the step's rounds before the last (the caller finishes the last) are
  // summed in earlier_rounds().
  const ReduceStats& earlier_rounds() const { return earlier_rounds_; }

  std::vector<StageTensor> forward_inputs(int micro, int chunk) override;
  void forward(int micro, int chunk) override;
  std::vector<StageTensor> forward_outputs(int micro, int chunk) override;
  std::vector<StageTensor> backward_inputs(int micro, int chunk) override;
  void backward(int micro, int chunk) override;
  std::vector<StageTensor> backward_outputs(int micro, int chunk) override;
  // zb-h1 (Note [Split backward] in model/gpt_backward.cpp), in either precision; the model
  // refuses it with recomputation, and so does the Trainer, earlier, with the deck keys named.
  bool can_split_backward() const override { return true; }
  void backward_input(int micro, int chunk) override;
  void backward_weight(int micro, int chunk) override;
  int chunks() const override { return model_.stage().chunks(); }

 private:
  int slot(int micro, int chunk) const { return model_.slot_for(chunk, micro); }
  bool embedding_chunk(int chunk) const { return model_.stage().has_embedding && chunk == 0; }
  bool head_chunk(int chunk) const {
    return model_.stage().has_head && chunk == model_.stage().chunks() - 1;
  }

  StageTensor boundary(const char* name, float* data) const;
  // A slot's received and sent gradient: host vectors, or device buffers with device links.
  float* doutput(int slot);
  float* dinput(int slot);
  // The reducer's hook for this micro-batch's gradient-ready events (empty without dp).
  GradReadyFn begin_reduction(int micro);
  const EmbeddingRowSink* sink_for(int micro);  // the tied embedding's, for this micro-batch
  float dloss_scale() const;
  const float* received_gradient(int micro, int chunk);  // null on the last stage
  float* sent_gradient(int micro, int chunk);            // null on the first stage
  bool reducing_ = false;  // this step's reducing begin_step was called (Note in begin_reduction)
  bool each_micro_batch_ = false;  // Note [ZeRO-2 and accumulation] (train/zero.h)
  ReduceStats earlier_rounds_;     // this step's rounds before the last, summed

  GPT& model_;
  const SampleOrder* order_ = nullptr;  // the step's (begin_step)
  DataParallel* dp_;
  TiedEmbedding* tied_;
  int slots_;
  StepInputs in_;
  // Sized for the shape of the last begin_step (tokens_, boundary_ floats), one per slot.
  size_t tokens_ = 0, boundary_ = 0;
  std::vector<std::vector<int32_t>> inputs_, targets_;  // the micro-batch's tokens
  std::vector<std::vector<float>> doutput_;             // received gradients
  std::vector<std::vector<float>> dinput_;              // sent gradients
  // Note [Stage transfers on a device] (trident/pipeline.h): with device links the gradients
  // are device buffers and the activations the model's own. Without links, on a device
  // backend, the activations travel through host copies (per slot) over host MPI.
  bool device_links_ = false;
  std::vector<BackendBuffer<float>> doutput_dev_, dinput_dev_;
  // Note [Transformers' totals across stages] (model/gpt_moe.cpp): per slot, the totals
  // received and sent forward (one buffer: m + slots's receive starts after m's backward), and
  // backward; host vectors, or device buffers with device links. Empty without the hf form.
  std::vector<std::vector<float>> totals_, dtotals_;
  std::vector<BackendBuffer<float>> totals_dev_, dtotals_dev_;
  bool has_totals() const { return !totals_.empty() || !totals_dev_.empty(); }
  float* totals(int slot, bool back);
  void receive_totals_back(int micro, int chunk);  // before a backward, where a next chunk is
  // `tensors` and, with the hf form, the slot's totals message.
  std::vector<StageTensor> with_totals(std::vector<StageTensor> tensors, int slot, bool back);
  std::vector<std::vector<float>> input_host_, output_host_;
  size_t boundary_floats() const;
  double forward_ms_ = 0, backward_ms_ = 0;
};

}  // namespace trident
