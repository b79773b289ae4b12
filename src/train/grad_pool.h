// ZeRO-2 and ZeRO-3 on a device: the gradients backward writes live in a pool of backend memory
// allocated once, and are reduce-scattered from there into this rank's shard.
//
// Note [Gradients in unit slots]
// On a device the flat gradient buffer is never allocated (GPTOptions::pooled_grads): device
// memory cannot give pages back as the host's does (Note [ZeRO-2 on the host]), and a cudaFree
// while NCCL runs is the known multi-GPU hang. Backward writes each unit's gradients (ZeRO-3's
// units: a block, wte, wpe, the head) at the base GPT::set_grad_base gives its home. wte, wpe and
// the head have slots of their own, zeroed as a step begins; the blocks share two, taken in
// backward's hook before each block: one being written, one on the wire. Layers add (beta 1), so
// a slot is zeroed when taken, once GradReducer::wait_reduced says its last block's reduce-scatter
// completed: backward waits for the link (held_wait_ms), it never allocates.
//
// Note [When gradients are pooled]
// Where each backward writes every gradient once and reduces it as it goes: a device, ZeRO 2
// or 3 (fp32 or bf16), comm.overlap (without it nothing is reduced before finish(): a slot's
// wait would never end), one backward pass (no zb-h1), and train.accum 1 or zero_reduce
// micro_batch (every micro-batch a round). With accum > 1 and zero_reduce step the gradients
// persist across micro-batches, so the flat buffer stays whole (ZeRO-1's gradient memory).
// Buckets break at units for ZeRO-2 as for ZeRO-3, on every backend, so the host's and the
// device's buckets agree.
//
// Note [Shard sums on a device]
// With zero_reduce micro_batch a later round adds the shard's sum so far into this rank's block
// of each bucket before its reduce-scatter, as the host's thread does (zero.h's
// Note [ZeRO-2 and accumulation]): on a device GradReducer::grad_ready enqueues that add on the
// compute stream (GradReducerOptions::add_shard) before the bucket's ready mark, which the
// reduce-scatter is ordered after; the last round's finish() made compute wait for it.
// The same float adds in the same order: the host's bits. Each round then zeroes the own slots
// again (DataParallel::begin_step): gradient memory stays the pool's whatever train.accum.
#pragma once

#include <cstddef>
#include <vector>

#include "trident/backend.h"
#include "trident/deck.h"
#include "trident/model.h"

namespace trident {

class GradReducer;

// Note [When gradients are pooled], from the deck (dp × cp > 1 is the caller's).
bool pools_grads(const Deck& deck, bool device, bool split_backward);

// The pool's floats for a stage's (unpadded) parameter layout: its own slots and two blocks.
size_t grad_pool_floats(const std::vector<ParamInfo>& layout);

class GradPool {
 public:
  static constexpr int kBlockSlots = 2;
  // `reducer_unit_first`: per model parameter, the reducer's index of its first unit
  // (DataParallel::unit), and the total at the end. Sets the reducer's and the model's bases.
  GradPool(Backend& be, GPT& model, GradReducer& reducer,
           const std::vector<int>& reducer_unit_first);

  // Before a step's first backward (every reduce-scatter of the last step has completed): the
  // own slots are zeroed and given to their buckets again; the blocks hold no slot.
  void begin_step();
  // The model's ParamUseFn in backward: the group's block takes a slot (at most once a step).
  void use(ParamPass pass, const std::vector<int>& params);
  size_t bytes() const { return memory_.size() * sizeof(float); }

 private:
  struct Unit {
    size_t first_bucket = 0, end_bucket = 0;
    size_t first_offset = 0, floats = 0;  // from its first bucket's offset to its last's end
    int home = 0;
    long own = -1;  // its own slot's offset in memory_; -1: a block
  };
  float* base_of(const Unit& u, size_t slot_offset) const;
  void take(int unit);

  Backend& be_;
  GPT& model_;
  GradReducer& reducer_;
  BackendBuffer<float> memory_;
  std::vector<Unit> units_;
  std::vector<int> unit_of_param_;
  size_t own_floats_ = 0;             // the own slots, from memory_'s start
  std::vector<size_t> block_offset_;  // per block slot: its offset in memory_
  std::vector<int> block_user_;       // per block slot: its last unit, -1: none
  std::vector<char> taken_;           // per unit: holds a slot this step
  size_t next_slot_ = 0;
};

}  // namespace trident
