#include <cmath>
#include <numbers>

#include "train/zero.h"
#include "trident/train.h"

namespace trident {

double lr_at(const TrainConfig& t, int step) {
  if (step < t.warmup_steps) return t.lr * double(step + 1) / double(t.warmup_steps);
  if (t.lr_schedule == "constant") return t.lr;
  const int decay_steps = t.steps - t.warmup_steps;
  if (decay_steps <= 1) return t.lr;
  const double progress = double(step - t.warmup_steps) / double(decay_steps - 1);
  const double min_lr = t.lr * t.min_lr_ratio;
  return min_lr + 0.5 * (t.lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

void AdamW::update(Backend& be, GPT& model, const TrainConfig& cfg, float lr, int t,
                   float grad_scale) {
  // One fused pass over p, m, v and g per run of neighbouring tensors with the same decay
  // (decay differs between matrices and biases): the update is elementwise, so the runs give
  // the same bits as one call per tensor, with far fewer calls (kernel launches on a GPU).
  // On the bf16 path the same pass writes the GEMMs' bf16 copy of the weights, so forward
  // casts none (GPT::params16).
  float* const params = model.params();
  bfloat16* const params16 = model.params16();
  auto apply = [&](size_t offset, size_t count, bool decay) {
    const float wd = decay ? float(cfg.weight_decay) : 0.0f;
    if (params16)
      be.adamw_update_bf16(params + offset, params16 + offset, m_.data() + offset,
                           v_.data() + offset, model.grads() + offset, count, lr, float(cfg.beta1),
                           float(cfg.beta2), float(cfg.eps), wd, t, grad_scale);
    else
      be.adamw_update(params + offset, m_.data() + offset, v_.data() + offset,
                      model.grads() + offset, count, lr, float(cfg.beta1), float(cfg.beta2),
                      float(cfg.eps), wd, t, grad_scale);
  };
  size_t run_offset = 0, run_count = 0;
  bool run_decay = false;
  for (const ParamInfo& p : model.params_info()) {
    if (run_count > 0 && p.decay == run_decay && p.offset == run_offset + run_count) {
      run_count += p.count;
      continue;
    }
    if (run_count > 0) apply(run_offset, run_count, run_decay);
    run_offset = p.offset;
    run_count = p.count;
    run_decay = p.decay;
  }
  if (run_count > 0) apply(run_offset, run_count, run_decay);
  // Every parameter is in one of the runs: the whole copy is current. (Padding between
  // parameters is never read by a GEMM.)
  if (params16) model.params16_written();
}

void AdamW::update_shard(Backend& be, float* params, const float* shard_grads,
                         const std::vector<OwnedPiece>& runs, const TrainConfig& cfg, float lr,
                         int t, float grad_scale, bfloat16* params16) {
  for (const OwnedPiece& r : runs) {
    const float wd = r.decay ? float(cfg.weight_decay) : 0.0f;
    if (params16)
      be.adamw_update_bf16(params + r.flat, params16 + r.flat, m_.data() + r.shard,
                           v_.data() + r.shard, shard_grads + r.shard, r.count, lr,
                           float(cfg.beta1), float(cfg.beta2), float(cfg.eps), wd, t, grad_scale);
    else
      be.adamw_update(params + r.flat, m_.data() + r.shard, v_.data() + r.shard,
                      shard_grads + r.shard, r.count, lr, float(cfg.beta1), float(cfg.beta2),
                      float(cfg.eps), wd, t, grad_scale);
  }
}

}  // namespace trident
