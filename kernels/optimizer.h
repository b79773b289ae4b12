// Optimizer-side ops over the flat buffers on the GPU (CPU twins: Backend::adamw_update,
// sum_squares).
#pragma once

#include <cstddef>

#include "cuda_check.h"

namespace trident::cuda {

// AdamW step t (1-based), decoupled weight decay, fp32 master weights (CPU twin's formula):
// m = β1 m + (1-β1) g; v = β2 v + (1-β2) g²; p -= lr (m̂/(sqrt(v̂)+eps) + wd p), with
// g = grads · grad_scale (global-norm clipping).
// With params_bf16 non-null, also writes the bf16 copy of the updated params there.
void adamw_update_cuda(float* params, float* m, float* v, const float* grads, size_t n, float lr,
                       float beta1, float beta2, float eps, float weight_decay, int t,
                       float grad_scale, bf16* params_bf16, cudaStream_t stream);

// *acc += float((Σ x in double) / n): one block, a fixed order (deterministic); acc is device
// memory.
// CPU twin: Backend::add_mean (the losses' mean, kept on the device until the step ends).
void add_mean_cuda(double* acc, const float* x, size_t n, cudaStream_t stream);

// Doubles of scratch sum_squares_cuda needs.
size_t sum_squares_scratch_doubles();
// *result (device) = Σ x² accumulated in double; deterministic (per-block partials in scratch,
// then one block sums them in a fixed order).
void sum_squares_cuda(double* result, double* scratch, const float* x, size_t n,
                      cudaStream_t stream);

}  // namespace trident::cuda
