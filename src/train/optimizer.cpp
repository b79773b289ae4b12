#include <cmath>
#include <numbers>

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

void AdamW::update(Backend& be, GPT& model, const TrainConfig& cfg, float lr, int t) {
  // One call per parameter tensor: decay differs between tensors, and each call is a single
  // fused pass over p, m, v and g.
  for (const ParamInfo& p : model.params_info()) {
    const size_t o = p.offset;
    be.adamw_update(model.params() + o, m_.data() + o, v_.data() + o, model.grads() + o, p.count,
                    lr, float(cfg.beta1), float(cfg.beta2), float(cfg.eps),
                    p.decay ? float(cfg.weight_decay) : 0.0f, t);
  }
}

}  // namespace trident
