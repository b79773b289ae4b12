// The global gradient norm: Σ g² over every parameter of the model, whichever ranks hold it.
#pragma once

#include <array>
#include <vector>

#include "trident/model.h"

namespace trident {

class Communicator;
class DataParallel;
class ProcessGrid;
class TiedEmbedding;

class GradNorm {
 public:
  // The tensors to sum, listed once. `dp` (null with dp = 1): with ZeRO this rank's shard
  // pieces; `tied` (or null): whether this stage's wte counts; `pp`: the pipeline's
  // communicator (a one-rank one without a grid); `ep` (or null): with experts split over ep
  // ranks, their squares are summed over it (Note [Expert parallelism] in src/model/moe.h).
  GradNorm(GPT& model, DataParallel* dp, const TiedEmbedding* tied, ProcessGrid* grid,
           Communicator& pp, Communicator* ep = nullptr);
  // Σ g² of the whole model's (reduced) gradients, the same number on every rank.
  double sum_squares();

 private:
  // Σ g² of the listed tensors: {sharded over tp, replicated, experts split over ep}, added in
  // the list's order.
  std::array<double, 3> parts();

  GPT& model_;
  DataParallel* dp_;
  ProcessGrid* grid_;
  Communicator& pp_;
  Communicator* ep_;
  // Pointers, counts, whether replicated over tp, and the per-tensor sums
  // (Backend::sum_squares_each: one wait on a device).
  std::vector<const float*> ptrs_;
  std::vector<size_t> counts_;
  std::vector<char> replicated_;  // 0 sharded over tp, 1 replicated, 2 an ep-split expert
  std::vector<double> sums_;
};

}  // namespace trident
