// Note [Weights in unit slots] (zero3_pool.h): the pool and its slots.
#include "train/zero3_pool.h"

#include <algorithm>
#include <cstdint>

#include "trident/check.h"

namespace trident {

UnitPool::UnitPool(Backend& be, GPT& model, const std::vector<Zero3Unit>& units,
                   const std::vector<size_t>& first, const std::vector<size_t>& floats,
                   bool keep_all)
    : model_(model), first_(first) {
  size_t total = 0, block = 0;
  int blocks = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    home_.push_back(model.weight_home(units[u].first_param));
    const bool is_block = units[u].name[0] == 'h' && units[u].name != "head";
    if (is_block && !keep_all) {
      own_offset_.push_back(-1);
      block = std::max(block, floats[u]);
      ++blocks;
      continue;
    }
    own_offset_.push_back(long(total));
    total += floats[u];
  }
  // Three block slots (Note [Unit slots]).
  for (int k = 0; k < std::min(blocks, 3); ++k) {
    block_offset_.push_back(total);
    total += block;
  }
  block_user_.assign(block_offset_.size(), -1);
  slot_of_.assign(units.size(), -1);
  memory_ = BackendBuffer<float>(be, total);
}

float* UnitPool::base_of(int unit, size_t slot_offset) const {
  // The model adds its flat offsets to this base; it points below the slot by the unit's first
  // offset (an address computed, never read there).
  const auto at = reinterpret_cast<uintptr_t>(memory_.data() + slot_offset);
  return reinterpret_cast<float*>(at - first_[size_t(unit)] * sizeof(float));
}

float* UnitPool::take(int unit) {
  const auto u = size_t(unit);
  size_t offset = 0;
  if (own_offset_[u] >= 0) {
    offset = size_t(own_offset_[u]);
  } else {
    TRIDENT_CHECK(slot_of_[u] < 0, "ZeRO-3 pool: unit {} already holds a slot", unit);
    const auto free = std::find(block_user_.begin(), block_user_.end(), -1);
    TRIDENT_CHECK(free != block_user_.end(),
                  "ZeRO-3 pool: no free block slot for unit {} ({} slots, all held): more groups "
                  "held at once than Note [Unit slots] sized for",
                  unit, block_user_.size());
    *free = unit;
    slot_of_[u] = int(free - block_user_.begin());
    offset = block_offset_[size_t(slot_of_[u])];
  }
  float* base = base_of(unit, offset);
  model_.set_weight_base(home_[u], base);
  return base;
}

void UnitPool::give_back(int unit) {
  const auto u = size_t(unit);
  model_.set_weight_base(home_[u], nullptr);  // a read of a released unit faults
  if (own_offset_[u] >= 0) return;
  TRIDENT_CHECK(slot_of_[u] >= 0, "ZeRO-3 pool: unit {} holds no slot", unit);
  block_user_[size_t(slot_of_[u])] = -1;
  slot_of_[u] = -1;
}

}  // namespace trident
