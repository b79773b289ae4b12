// Note [Gradients in unit slots] (grad_pool.h): the pool, its slots and when it is used.
#include "train/grad_pool.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>

#include "train/zero3.h"
#include "trident/check.h"
#include "trident/grad_reducer.h"

namespace trident {
namespace {

bool is_block(const std::string& unit) { return unit[0] == 'h' && unit != "head"; }

}  // namespace

bool pools_grads(const Deck& deck, bool device, bool split_backward) {
  return device && deck.parallel.zero >= 2 && deck.comm.overlap && !split_backward &&
         (deck.train.accum == 1 || deck.parallel.zero_reduce == "micro_batch");
}

size_t grad_pool_floats(const std::vector<ParamInfo>& layout) {
  const std::vector<std::string> names = zero3_unit_names(layout);
  std::map<std::string, size_t> unit_floats;
  for (size_t i = 0; i < layout.size(); ++i) unit_floats[names[i]] += layout[i].count;
  size_t own = 0, block = 0, blocks = 0;
  for (const auto& [name, n] : unit_floats) {
    if (!is_block(name)) {
      own += n;
      continue;
    }
    block = std::max(block, n);
    ++blocks;
  }
  return own + std::min<size_t>(blocks, GradPool::kBlockSlots) * block;
}

GradPool::GradPool(Backend& be, GPT& model, GradReducer& reducer,
                   const std::vector<int>& reducer_unit_first)
    : be_(be), model_(model), reducer_(reducer) {
  const std::vector<ParamInfo>& params = model.params_info();
  const std::vector<std::string> names = zero3_unit_names(params);
  const std::vector<Bucket>& buckets = reducer.buckets();
  size_t block = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (i == 0 || names[i] != names[i - 1]) {
      Unit u;
      u.first_bucket = reducer.bucket_of_param(size_t(reducer_unit_first[i]));
      u.home = model.weight_home(i);
      u.own = is_block(names[i]) ? -1 : 0;
      units_.push_back(u);
    }
    unit_of_param_.push_back(int(units_.size()) - 1);
    Unit& u = units_.back();
    u.end_bucket = reducer.bucket_of_param(size_t(reducer_unit_first[i + 1]) - 1) + 1;
  }
  for (size_t k = 0; k < units_.size(); ++k) {
    Unit& u = units_[k];
    TRIDENT_CHECK(k == 0 || u.first_bucket == units_[k - 1].end_bucket,
                  "gradient pool: units {} and {} share a bucket (no unit breaks)", k - 1, k);
    const Bucket& last = buckets[u.end_bucket - 1];
    u.first_offset = buckets[u.first_bucket].offset;
    u.floats = last.offset + last.count - u.first_offset;
    if (u.own < 0) {
      block = std::max(block, u.floats);
      continue;
    }
    u.own = long(own_floats_);
    own_floats_ += u.floats;
  }
  size_t total = own_floats_;
  const auto blocks =
      size_t(std::count_if(units_.begin(), units_.end(), [](const Unit& u) { return u.own < 0; }));
  for (size_t k = 0; k < std::min<size_t>(blocks, kBlockSlots); ++k) {
    block_offset_.push_back(total);
    total += block;
  }
  block_user_.assign(block_offset_.size(), -1);
  taken_.assign(units_.size(), 0);
  memory_ = BackendBuffer<float>(be, total);  // zeroed
}

float* GradPool::base_of(const Unit& u, size_t slot_offset) const {
  // The model and the reducer add flat offsets to this base: it points below the slot by the
  // unit's first offset (an address computed, never read there).
  const auto at = reinterpret_cast<uintptr_t>(memory_.data() + slot_offset);
  return reinterpret_cast<float*>(at - u.first_offset * sizeof(float));
}

void GradPool::begin_step() {
  if (own_floats_ > 0) be_.fill_zero(memory_.data(), own_floats_ * sizeof(float));
  for (size_t k = 0; k < units_.size(); ++k) {
    const Unit& u = units_[k];
    taken_[k] = 0;
    if (u.own < 0) {
      model_.set_grad_base(u.home, nullptr);  // a write before the block's hook faults
      continue;
    }
    float* base = base_of(u, size_t(u.own));
    model_.set_grad_base(u.home, base);
    reducer_.set_grad_base(u.first_bucket, u.end_bucket, base);
  }
}

void GradPool::use(ParamPass pass, const std::vector<int>& params) {
  if (pass != ParamPass::kBackward) return;
  for (int p : params) {
    const int u = unit_of_param_[size_t(p)];
    if (units_[size_t(u)].own < 0 && !taken_[size_t(u)]) take(u);
  }
}

void GradPool::take(int unit) {
  const Unit& u = units_[size_t(unit)];
  const size_t slot = next_slot_;
  next_slot_ = (next_slot_ + 1) % block_offset_.size();
  // The slot's last block was written two blocks ago; its reduce-scatter has started or will
  // without this thread (its buckets and every one before them are complete).
  if (const int last = block_user_[slot]; last >= 0) {
    const Unit& l = units_[size_t(last)];
    reducer_.wait_reduced(l.first_bucket, l.end_bucket);
  }
  block_user_[slot] = unit;
  taken_[size_t(unit)] = 1;
  be_.fill_zero(memory_.data() + block_offset_[slot], u.floats * sizeof(float));
  float* base = base_of(u, block_offset_[slot]);
  model_.set_grad_base(u.home, base);
  reducer_.set_grad_base(u.first_bucket, u.end_bucket, base);
}

}  // namespace trident
