// ZeRO-3 on a device: the gathered units' weights live in a pool of backend memory allocated
// once, when the run is built.
//
// Note [Weights in unit slots]
// On the host a unit is gathered into the full parameter buffer, whose pages come and go
// (Note [ZeRO-3 units] in train/zero3.h, kept there: it measures its resident peak on them). Device
// memory cannot give pages back, and a cudaFree while NCCL runs is the known multi-GPU hang: on
// a device the full buffer goes after setup (GPT::release_full_params), a unit is gathered into
// a slot of a pool allocated once, and the model reads it at the base it is told when the unit
// is asked for (GPT::set_weight_base: the slot less the unit's first offset, so the model's
// offsets stand). The gradients have a pool too: Note [Gradients in unit slots] (grad_pool.h).
// With run.precision bf16, Note [bf16 unit gathers]: a slot holds a GEMM weight as bf16.
//
// Note [bf16 unit gathers]
// bf16 ZeRO-3 gathers what each read needs: a parameter read only through the bf16 copy
// (read_as_bf16: a block's four GEMM weights, an untied LM head) is alone in its bucket and
// gathered from the shards' bf16 copy (AdamW's bf16 pass writes it; a stale one is cast before a
// gather) into the first half of its fp32 place in the slot, at half the bytes; the rest (norms,
// biases, wte and wpe, which the embedding reads) in fp32, a tied head's bf16 cast from wte's slot
// after each gather. So the GEMMs read bf16(master), the rest the masters, as under ZeRO-1: the
// same bits. Masters, gradients, reductions, checkpoints: fp32. The pool keeps the fp32 size (a
// bf16 slot needs offsets of its own); the model never makes its whole bf16 copy.
//
// Note [Unit slots]
// A slot of its own for each of wte, wpe and the head (each held at most once, and together:
// a pass keeps a held unit it reads later, so a forward after a forward finds the head held),
// and three for the blocks, of the largest block's size: the one running, the one gathered one
// group ahead, and the last pass's last block, kept where this pass reads it later (forwards in
// a row on a stage before the head: GPipe, 1F1B's warm-up, validation). Where units stay
// gathered (reshard_after_forward false, zero3_gather step) every unit has its own slot.
// check_memory_plan (src/train/memory_plan.cpp) counts the same on a device, bf16 or not.
//
// Note [No full weights on a device]
// A device never holds the full fp32 parameters, or ZeRO-3 could train nothing larger than one
// device's 4 B per parameter (Llama-3-70B: 280 GB). The model is built without the buffer
// (GPTOptions::no_full_params), or its bf16 copy; DataParallel::init_params initialises each
// unit in its slot and copies the shard out; model.init_from's readers give each tensor they
// read to DataParallel::shard_writer, which copies this rank's parts of it into the shards; a
// checkpoint loads straight into the shards too.
#pragma once

#include <cstddef>
#include <vector>

#include "train/zero3.h"
#include "trident/backend.h"

namespace trident {

class UnitPool {
 public:
  // `floats`: per unit, the elements from its first bucket's offset to its last bucket's end;
  // `first`: that first offset. keep_all: every unit gets a slot of its own.
  UnitPool(Backend& be, GPT& model, const std::vector<Zero3Unit>& units,
           const std::vector<size_t>& first, const std::vector<size_t>& floats, bool keep_all);

  // Gives `unit` a slot, tells the model where its weights are, and returns the base its
  // gather writes at (bucket b at base + b's offset). The unit must not hold one.
  float* take(int unit);
  void give_back(int unit);
  size_t bytes() const { return memory_.size() * sizeof(float); }
  int block_slots() const { return int(block_offset_.size()); }

 private:
  float* base_of(int unit, size_t slot_offset) const;

  GPT& model_;
  BackendBuffer<float> memory_;
  std::vector<size_t> first_;         // per unit: its first bucket's flat offset
  std::vector<int> home_;             // per unit: the model's weight home
  std::vector<long> own_offset_;      // per unit: its own slot's offset in memory_; -1: a block
  std::vector<size_t> block_offset_;  // per block slot: its offset in memory_
  std::vector<int> block_user_;       // per block slot: the unit in it, -1: free
  std::vector<int> slot_of_;          // per unit: its block slot while held, else -1
};

}  // namespace trident
