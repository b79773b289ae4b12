// ZeRO-3 (parallel.zero: 3): the parameters too are sharded over the data-parallel ranks, and a
// unit's full parameters exist only while it runs.
//
// Note [ZeRO-3 units]
// A unit (a block; wte, the embedding and a tied head; wpe; the head: final norm and untied LM
// head) is gathered and released as one. Buckets break at unit boundaries, so a unit is whole
// buckets, and each rank owns the same slice of every bucket for the parameters (shard_params,
// what AdamW updates) as for the gradients, m and v: 16 bytes per parameter / dp. The full
// buffers keep their addresses (the model's pointers are resolved once) and hold memory only
// where a unit is gathered or a gradient written: host pages come on write and go back on
// release (Note [ZeRO-2 on the host]), so no allocator runs in a step.
//
// The host keeps these pages (its resident peak is measured on them); a device gathers into a
// pool of unit slots sized once instead: Note [Weights in unit slots] in train/zero3_pool.h.
//
// The life of a unit in one step, driven by the model's ParamUseFn (called before the embedding,
// each block and the head in forward; before the head and each block in backward):
//   forward   at group k: release what neither group k nor k + 1 nor a later group of the pass
//             needs (reshard_after_forward true; a tied wte stays from the embedding to the
//             head, as FSDP keeps its root); ask for group k's units if not held (only the
//             first group of a pass); ask for group k + 1's (the prefetch); wait for group k's.
//   backward  the same over the reversed blocks; with reshard_after_forward false only the
//             previous group's units are released, so the forward's gathers serve backward.
//   end       finish() releases everything (the optimizer then changes the shards).
// A pass ends where the next begins, so the last forward group (the head on the last stage)
// is still held when its backward starts, as FSDP keeps its root. One group ahead, not more:
// on this machine's shared memory a block's gather takes less than its forward, so one hides
// it; each unit ahead costs one more unit of memory. parallel.zero3_gather: step keeps every
// unit from its first use to the end of the step (ZeRO-2's parameter memory, gathers once per
// step: under pp and accumulation the alternative to re-gathering every micro-batch).
//
// The gathers run on the reducer's thread over a communicator of their own (a duplicate of dp),
// so their order is the compute thread's program order on every rank, independent of when the
// reduce-scatters start. The gradients are ZeRO-2's: reduce-scattered per bucket as backward
// finishes them, their pages released after.
//
// Note [ZeRO-3 and W]
// A split backward (zb-h1, Note [Split backward] in model/gpt_backward.cpp) announces its groups
// in B only: B computes dX = dY·W, reading the gathered units as a whole backward does; W computes
// dW = dYᵀ·X from what its slot kept and reads no weight (GPT::backward_weight passes none; a tied
// head's dW is B's, the embedding's reads token ids). So W gathers nothing and holds no slot: the
// gathers, their count and zero3_gather's two modes are 1F1B's, W's being no pass. Its gradients
// are written whole (a device keeps them whole under a split: Note [When gradients are pooled])
// and reduce-scattered as W reports them, as ZeRO-2 does.
//
// Note [ZeRO-3 with experts]
// A mixture's experts split over ep are buckets of their own, sharded over their replicas
// (expert-dp, Note [Expert parallelism]) as ZeRO-1/2 shard them; ZeRO-3 gathers them there too,
// on a duplicate of that group of their own (TrainContext::expert_gather), so a unit holding a
// block's attention and its experts gathers over two groups, each in program order. The sigmoid
// router's choice bias, which AdamW leaves alone, takes its step in the shards
// (DataParallel::shard_adder), the only copy between steps. With ep 1 the experts are dense
// buckets. With HSDP: Note [Experts with HSDP].
//
// Note [Experts with HSDP]
// With ZeRO and dp_replicate > 1 the experts are laid out as torchtitan's: sharded within a
// replica, replicated across replicas. ep is taken within the shard group dp_shard × cp (it must
// divide it); an expert's gradient is reduce-scattered over its replica's dp_shard·cp/ep ranks
// holding the same experts (TrainContext::expert_dp; gathers on its duplicate), then the shard is
// all-reduced over the replicas: the dense buckets' second hop, same communicator, record order
// (replica peers share dp_shard and cp coordinates, so hold the same shard). Replica 0 writes
// the shards to checkpoints; the norm sums over the shard group, the router's loads over dp × cp.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "trident/model.h"

namespace trident {

class GradReducer;
class UnitPool;

// The unit of each parameter (the model's, in ready order): "h<layer>", "wte", "wpe" or "head".
// A unit's parameters must be one run of the list (internal_error naming it otherwise).
std::vector<std::string> zero3_unit_names(const std::vector<ParamInfo>& params);

struct Zero3Unit {
  std::string name;
  size_t first_param = 0, end_param = 0;    // the model's parameters [first, end)
  size_t first_bucket = 0, end_bucket = 0;  // the reducer's buckets [first, end)
};

class UnitGathers {
 public:
  struct Options {
    bool reshard_after_forward = true;
    bool per_step = false;  // parallel.zero3_gather: step
    bool log = false;       // keep a log of requests, waits and releases (tests)
  };
  // `reducer_unit_first`: per model parameter, the reducer's index of its first unit
  // (DataParallel::unit), and the total at the end.
  UnitGathers(GradReducer& reducer, const GPT& model, const std::vector<int>& reducer_unit_first,
              Options options);

  // The model's ParamUseFn.
  void use(ParamPass pass, const std::vector<int>& params);
  // Releases every unit held (the end of a step, or of a validation pass).
  void release_all();
  // Gathers every unit and waits (before reading the full parameters outside a step).
  void gather_all();

  const std::vector<Zero3Unit>& units() const { return units_; }
  // On a device: units are gathered into this pool's slots (Note [Weights in unit slots]).
  void set_pool(UnitPool* pool) { pool_ = pool; }
  // Gathers asked for since the last call, and how many of them were not asked for one group
  // ahead (a pass's first group is asked for when it is used: not counted as late).
  struct Counts {
    int gathers = 0, late = 0;
  };
  Counts take_counts();
  struct LogEntry {
    enum Kind { kRequest, kWait, kRelease } kind;
    int unit;
    ParamPass pass;
    int position;  // the group's place in its pass; -1: release_all or gather_all
  };
  const std::vector<LogEntry>& log() const { return log_; }
  // Starts (true) or stops keeping the log, emptied.
  void set_log(bool on) {
    options_.log = on;
    log_.clear();
    if (on) log_.reserve(16 * units_.size());
  }

 private:
  void request(int unit, bool late, ParamPass pass, int position);
  void wait(int unit);
  void release(int unit, ParamPass pass, int position);

  GradReducer& reducer_;
  UnitPool* pool_ = nullptr;
  Options options_;
  std::vector<Zero3Unit> units_;
  std::vector<int> unit_of_param_;
  // Groups (the model's announcements): their units, and where each stands in its pass.
  std::vector<std::vector<int>> group_units_;
  std::vector<int> group_of_first_param_;    // per parameter: the group it opens, or -1
  std::vector<std::vector<int>> sequences_;  // per (chunk, pass): group ids in order
  struct Place {
    int sequence = -1, position = -1;
  };
  std::vector<Place> place_[2];             // per pass, per group
  std::vector<std::vector<int>> last_use_;  // per sequence, per unit: its last group (-1: none)
  std::vector<char> held_;                  // per unit: asked for (in flight or gathered)
  std::vector<char> keep_;                  // per unit: scratch of use()
  Counts counts_;
  std::vector<LogEntry> log_;
  // TRIDENT_FAULT_STALL_GATHER=<unit>@<n> (tests/cli/test_zero3.sh): this rank sleeps before
  // asking for its n-th gather of that unit, as a rank stuck there would; read once.
  int stall_unit_ = -1, stall_at_ = 0, stall_count_ = 0;
};

}  // namespace trident
