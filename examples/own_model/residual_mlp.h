// The user's own model — it knows nothing of pipelines or data parallelism: a stack of
// residual MLP blocks regressing a target with the mean squared error,
//
//     x ← x + W2·relu(W1·x + b1) + b2          W1 [hidden, width], W2 [width, hidden]
//
// Tensor parallelism is the model's own business, split the Megatron way: W1 and b1 by rows
// (column-parallel: each tp rank computes hidden/tp of the hidden units), W2 by columns
// (row-parallel: each tp rank's W2 slice gives a partial sum of the output). So a block needs
// one all-reduce on the tp communicator forward (the partial outputs) and one backward (the
// partial input gradients); b2 is whole on every tp rank and added once, after the sum.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "trident/comm.h"

namespace own_model {

struct MlpShape {
  int width = 32;   // the residual stream
  int hidden = 64;  // the MLP's hidden units (all tp ranks together)
  int blocks = 4;
};

// One block's parameters (or gradients) on one tp rank, in the order backward finishes them —
// which is also their order in the flat buffer, so the data-parallel reducer can take
// contiguous slices of it:
//     w2 [width, hidden/tp]   b2 [width]   w1 [hidden/tp, width]   b1 [hidden/tp]
enum class Part { kW2, kB2, kW1, kB1 };
constexpr Part kParts[] = {Part::kW2, Part::kB2, Part::kW1, Part::kB1};
const char* part_name(Part part);
size_t part_count(Part part, const MlpShape& shape, int tp_size);
size_t block_param_count(const MlpShape& shape, int tp_size);
// Element `local` of this tp rank's shard of `part` is element global_index(...) of the whole
// (unsplit, row-major) tensor.
size_t global_index(Part part, size_t local, const MlpShape& shape, int tp_size, int tp_rank);

struct BlockParams {
  float *w2 = nullptr, *b2 = nullptr, *w1 = nullptr, *b1 = nullptr;
  float* part(Part p) const;
};
// The block whose parameters start at `base` in a flat buffer.
BlockParams block_at(float* base, const MlpShape& shape, int tp_size);

// Parameters are a function of their global index only, so every layout starts from the same
// model and can be compared with the single-rank run.
void init_block(const BlockParams& p, int block, const MlpShape& shape, int tp_size, int tp_rank,
                uint64_t seed);

// Sample `index` of an endless synthetic data set: input x [width] and target y [width].
void make_sample(float* x, float* y, int width, uint64_t index, uint64_t seed);

// Tensor parallelism for one block: the tp communicator, or null on one rank.
struct TensorParallel {
  trident::Communicator* comm = nullptr;
  int size = 1, rank = 0;
};

// out [rows, width] = block(x [rows, width]); pre [rows, hidden/tp] (saved for backward) =
// W1·x + b1 before the relu. All assigned.
void block_forward(float* out, float* pre, const float* x, const BlockParams& p,
                   const MlpShape& shape, int rows, const TensorParallel& tp);

// dx (assigned) = the gradient of the block input; grads accumulate (+=) into g.
void block_backward(float* dx, const BlockParams& g, const float* dout, const float* x,
                    const float* pre, const BlockParams& p, const MlpShape& shape, int rows,
                    const TensorParallel& tp);

// Returns scale · Σ (out − y)² and sets dout = 2·scale·(out − y), over n elements.
double mse_forward_backward(float* dout, const float* out, const float* y, size_t n, float scale);

// The reference: the whole model on one rank, trained on the whole global batch with plain
// SGD; loss of every step (before its update) and the final parameters, block after block.
struct Reference {
  std::vector<double> losses;
  std::vector<float> params;  // block b at b·block_param_count(shape, 1)
};
Reference train_reference(const MlpShape& shape, int global_batch, int steps, float lr,
                          uint64_t seed);

}  // namespace own_model
