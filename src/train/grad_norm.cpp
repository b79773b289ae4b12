#include "train/grad_norm.h"

#include "train/data_parallel.h"
#include "train/tied_embedding.h"
#include "trident/grid.h"

namespace trident {

// Sharded tensors: each tp rank has a disjoint part, so their squares are summed over tp.
// Replicated tensors are identical on every tp rank and counted once. Over pp every stage has
// its own parameters, except the tied wte (TiedEmbedding::counted_in_norm). With ZeRO, this
// rank's pieces of them, summed over dp. One rank holding the whole model needs no list.
GradNorm::GradNorm(GPT& model, DataParallel* dp, const TiedEmbedding* tied, ProcessGrid* grid,
                   Communicator& pp, Communicator* ep)
    : model_(model), dp_(dp && dp->sharded() ? dp : nullptr), grid_(grid), pp_(pp),
      // With ZeRO the pieces are disjoint over dp × cp, the experts' too: no ep sum of its own.
      ep_(ep && ep->size() > 1 && !dp_ ? ep : nullptr) {
  const std::vector<ParamInfo>& infos = model_.params_info();
  auto add = [&](const float* p, size_t n, const ParamInfo& info) {
    if (tied && info.name == "wte" && !tied->counted_in_norm()) return;
    ptrs_.push_back(p);
    counts_.push_back(n);
    replicated_.push_back(info.expert && ep_ ? 2 : info.shard == Shard::kReplicated ? 1 : 0);
  };
  if (dp_) {
    for (const OwnedPiece& piece : dp_->owned())
      add(dp_->shard_grads() + piece.shard, piece.count, infos[piece.param]);
  } else if (model_.tensor_parallel().size > 1 || pp_.size() > 1 || ep_) {
    for (const ParamInfo& p : infos) add(model_.grads() + p.offset, p.count, p);
  }
  sums_.resize(ptrs_.size());
}

std::array<double, 3> GradNorm::parts() {
  model_.backend().sum_squares_each(ptrs_.data(), counts_.data(), ptrs_.size(), sums_.data());
  std::array<double, 3> parts = {0.0, 0.0, 0.0};
  for (size_t i = 0; i < sums_.size(); ++i) parts[size_t(replicated_[i])] += sums_[i];
  return parts;
}

double GradNorm::sum_squares() {
  const bool tp = model_.tensor_parallel().size > 1;
  // One rank holding the whole model: one pass over the flat buffer (on a GPU one reduction
  // and one wait instead of one per tensor).
  if (!dp_ && !tp && pp_.size() == 1 && !ep_)
    return model_.backend().sum_squares(model_.grads(), model_.num_params());
  std::array<double, 3> p = parts();
  // Experts split over ep: each ep rank holds its own (the same over their replicas).
  if (ep_) ep_->all_reduce(&p[2], 1).wait();
  // The shards are distinct over dp_shard × cp (all of dp × cp without replicas); replicas
  // hold the same (Note [HSDP] in train/data_parallel.h), so they are not summed again.
  if (dp_) grid_->gradient_shards().all_reduce(p.data(), 2).wait();
  if (tp) grid_->tp().all_reduce(&p[0], 1).wait();
  double total = p[0] + p[1] + p[2];
  if (pp_.size() > 1) pp_.all_reduce(&total, 1).wait();
  return total;
}

}  // namespace trident
