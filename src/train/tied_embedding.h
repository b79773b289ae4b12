// The LM head tied to the token embedding (GPT-2: logits = x · wteᵀ). Everything that follows
// from the tie lives here: where wte sits in the gradient ready order, the head's gradient in
// row pieces, the sparse row gradient with its step row set, and the sum of wte's gradient
// over the first and last pipeline stage. The Trainer builds one on a stage that holds wte; a
// model with an untied head has none, and nothing else in train or comm knows about the tie.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "train/embedding_rows.h"
#include "train/gpt_stage.h"
#include "trident/model.h"

namespace trident {

class DataParallel;
class ProcessGrid;
class TraceWriter;

// Note [Head gradient in pieces]
// The head's weight gradient dwte += dlogitsᵀ·x is V·C floats (a third of GPT-2 124M's), one
// GEMM whose rows are independent. Split into row pieces of about a bucket, each piece is the
// same arithmetic on a slice of the output, reported ready and reduced on its own, so the first
// piece is on the wire after 1/K of the GEMM. Boundaries are multiples of align_elems floats
// from wte's start, so ZeRO's padding never falls inside wte; empty when one piece would do.
std::vector<int> head_gradient_pieces(int rows, int channels, size_t elem_bytes,
                                      size_t bucket_bytes, size_t align_elems);

class TiedEmbedding {
 public:
  // Before the model: decides for this stage, which holds wte (the embedding, the head or
  // both), where wte's gradient is final (GPTOptions::wte_after_head) and its head gradient's
  // pieces (GPTOptions::wte_piece_rows), and writes both into `options`.
  TiedEmbedding(const GPTConfig& cfg, int dp_size, int pp_size, bool device_backend,
                size_t bucket_bytes, GPTOptions& options);

  // For DataParallel::lay_out: in the stage's parameter list (ready order), wte's index, the
  // row pieces it is reported in, and whether it needs a bucket of its own
  // (Note [Padded buckets]: with pp > 1 its shard must be the same slice of wte on both stages).
  int wte_index(const std::vector<ParamInfo>& params) const;
  const std::vector<int>& piece_rows() const { return piece_rows_; }
  bool needs_own_bucket() const { return pp_size_ > 1; }

  // After the model and its DataParallel unit (null with dp = 1). `grid` null: one rank.
  // `device_comm`: the embedding group's device communicator, which sums wte's gradient over
  // the stages in device memory (Note [Stage sum in device memory]); null: host MPI on a copy.
  void attach(GPT& model, DataParallel* dp, ProcessGrid* grid, Communicator* device_comm,
              const SampleOrder& order, TraceWriter* trace, long tokens_per_step);

  // Before the step's pipeline: with the row sink, the step's rows united over dp
  // (Note [Step row set]); returns that collective's milliseconds (0 without the sink), which
  // nothing overlaps. Every rank of dp calls it at the same point.
  double begin_step(const GPTStage::StepInputs& in);
  // The row sink for a micro-batch's backward, its row map filled from `inputs` (the
  // micro-batch's tokens); null without the sink (Note [Tied embedding gradient]).
  const EmbeddingRowSink* sink(const std::vector<int32_t>& inputs);
  // Before DataParallel::finish: the sparse rows join the step's reduction as an extra buffer.
  void add_rows_to_reduction();
  // After the reduction: the averaged rows into wte's gradient (this rank's shard with ZeRO),
  // then wte's gradient summed over the first and last stage (pp > 1).
  void finish_step();
  // Whether this stage's wte gradient counts in the global norm: with pp > 1 the first and the
  // last stage hold the same summed gradient, counted on the last stage only.
  bool counted_in_norm() const { return pp_size_ == 1 || has_head_; }

 private:
  void add_rows_to_gradient();
  void sum_over_stages();

  int pp_size_ = 1;
  bool has_head_ = false;
  bool uses_sink_ = false;  // Note [Tied embedding gradient]
  int channels_ = 0;
  std::vector<int> piece_rows_;
  GPT* model_ = nullptr;
  DataParallel* dp_ = nullptr;
  ProcessGrid* grid_ = nullptr;
  Communicator* device_comm_ = nullptr;
  std::shared_ptr<ComputeMark> sum_mark_;  // device_comm_'s, made once
  Work sum_;                               // the last step's sum over the stages
  const SampleOrder* order_ = nullptr;
  TraceWriter* trace_ = nullptr;
  int wte_ = -1;                           // wte's index in the model's parameters
  std::unique_ptr<StepRowSet> rows_;       // with the sink
  std::vector<float> row_grads_;           // capacity: the most rows a step can have
  std::vector<int32_t> row_of_input_;      // the sink's row map of one micro-batch
  std::vector<int32_t> tokens_, targets_;  // one micro-batch, read for the row set
  EmbeddingRowSink sink_;
};

}  // namespace trident
