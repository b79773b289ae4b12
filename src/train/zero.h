// ZeRO stages 1 and 2 (parallel.zero): AdamW's state, and with 2 the gradients' memory, sharded
// over the data-parallel ranks.
//
// Note [ZeRO-1]
// Each dp rank owns one contiguous, equal slice of every gradient bucket (the buckets are padded
// so the slices are exact: Note [Padded buckets] in trident/buckets.h) and holds AdamW's m and v
// for that slice only, 1/dp of the model. The update is elementwise, so with the same reduced
// gradients it gives the replicated update's bits; the reduce-scatter and the sharded norm sum
// in another order, so zero 1 equals zero 0 to rounding (bitwise at dp 2: two numbers either way).
//
// One step:
//   1. backward as always; the communication thread reduce-scatters each bucket as soon as it
//      is ready (the same ready events, strict bucket order and timeout as the all-reduce),
//      into this rank's shard gradient buffer (shard_grads: Σ count_b / dp floats);
//   2. the global gradient norm from the shards: each rank's partial sums of squares, one
//      all-reduce over dp, then over tp and pp as before;
//   3. AdamW on the shard only (m, v hold the shard: 1/dp of the model);
//   4. the communication thread all-gathers every bucket's parameters in place, in the order
//      the next forward first reads them (Note [Gathers before use]).
// The full gradient buffer stays (ZeRO-2 below gives its memory back), and the thread works on
// a duplicate of the dp communicator of its own: its all-gathers run during the next step's
// forward, when the compute thread also uses dp (the row set, the loss).
//
// Note [ZeRO-2 on the host]
// ZeRO-2 is ZeRO-1 plus: once a bucket's reduce-scatter has completed its sum lives in this
// rank's shard, so the reducer's thread zeroes the full buffer's slice of that bucket and gives
// its pages back to the kernel (release_host_floats). A released page reads as zero and holds no
// memory until backward writes it again: gradient memory is held only from backward's write to
// the end of the reduce-scatter, and the next step skips zero_grads. Host memory only (a device
// allocation cannot give pages back like this): Note [Gradients in unit slots] for a device.
//
// Pages go back with madvise MADV_DONTNEED, and a memset for the partial pages at the ends.
// The model writes its gradients straight into the flat buffer (pointers resolved once), so
// the buffer keeps its address range; only its memory comes and goes. Before each release the
// thread counts the buffer's resident pages (mincore), and bench reports the peak
// (grad_resident_mib, with the shard). A device writes into a pool (train/grad_pool.h).
// With train.accum > 1, Note [ZeRO-2 and accumulation] below.
//
// Note [ZeRO-2 and accumulation]
// parallel.zero_reduce: step (the default, Megatron's way) accumulates the micro-batches'
// gradients in the full buffer and reduce-scatters them on the last one: resident for the whole
// step, saved between steps. micro_batch (DeepSpeed's way) makes every micro-batch's backward a
// reducing round that releases its buckets, later rounds adding to the shard: at most the
// bound's buckets resident (Note [Bounded gradient memory]), for accum times the bytes sent.
// It needs one chunk per stage and a one-pass backward (no zb-h1).
//
// With micro_batch the thread adds the shard's sum so far into this rank's own block of the
// bucket before its reduce-scatter (GradReducer::begin_step's accumulate_shards; on a device the
// compute stream does, Note [Shard sums on a device] in grad_pool.h). The buffer is
// zero again after each round, so the next micro-batch writes into released pages; GPTStage
// finishes a round at the start of the next backward, so a round's tail overlaps the next
// micro-batch's forward, and no backward writes a bucket its previous round still reads. Each
// micro-batch's gradients are then final when its backward ends, so the model is told so
// (last_micro_batch: the tp partial sums of the LayerNorms are reduced every micro-batch).
// The cost in time and bytes: docs/perf.md.
//
// Note [Bounded gradient memory]
// Releasing each bucket after its reduce-scatter bounds nothing by itself: backward writes
// gradients faster than a slow link sends them, and complete buckets waiting their turn are all
// resident. So with ZeRO-2 and overlap, grad_ready blocks the compute thread once the complete,
// unreleased buckets exceed one bucket (comm.bucket_mb): the full buffer holds about two buckets
// plus the one being written, whatever the link's speed. It cannot deadlock: a held bucket is
// complete, and with one chunk per stage so are the buckets before it.
//
// The cost is backward waiting where the link is slower than compute: ReduceStats::
// held_wait_ms (bench: held_wait_ms), inside backward_ms. DeepSpeed's ZeRO-2 bounds its
// gradient buffers the same way (two reduce buckets of reduce_bucket_size, waited for before
// reuse). Without overlap nothing is released before finish(), so there is no bound.
//
// Note [Gathers before use]
// The parameter all-gathers start right after the optimizer, all at once, in forward order (the
// bucket holding the embedding first, then the blocks from first to last, the head last): MPI
// pairs them by start order, the same on every rank. The model calls a hook before it first
// reads each group of parameters (GPT::set_param_use) that waits for the buckets holding that
// group and nothing else, so the first block runs while later buckets are still on the wire.
//
// The compute thread's wait there is the all-gather's exposed time
// (StepStats::gather_exposed_ms); with comm.overlap false the round is waited for at once after
// the optimizer, the same calls on the same slices.
#pragma once

#include <cstddef>
#include <vector>

#include "trident/buckets.h"
#include "trident/model.h"

namespace trident {

class GradReducer;

// One parameter's part of this rank's shard: elements [flat, flat + count) of the flat
// buffers, stored at `shard` in the shard buffers (shard gradients, m, v).
struct OwnedPiece {
  size_t param = 0;  // index in ready order (params_info)
  size_t flat = 0, count = 0, shard = 0;
  bool decay = false;
};

// The gradient reducer's parameters ("units"): the model's, in ready order, except that a
// parameter the model reports in row pieces (the LM head's weight,
// Note [Head gradient in pieces] in train/tied_embedding.h) is one unit per piece, each a copy
// of its ParamInfo with the piece's offset, count and a name "wte[rows a..b]". The model
// reports (parameter i, piece k) ready; the reducer's index for it is first[i] + k.
struct GradUnits {
  std::vector<ParamInfo> units;
  std::vector<int> first;    // per parameter, and the total at the end (size params + 1)
  std::vector<char> pieces;  // per unit: one of several pieces of a parameter
  std::vector<size_t> counts() const;
};
// split_param: the index of the parameter in pieces (-1: none); piece_rows: its row bounds
// (GPTOptions::wte_piece_rows; fewer than 3: one piece); row_elems: elements per row.
GradUnits grad_units(const std::vector<ParamInfo>& params, int split_param,
                     const std::vector<int>& piece_rows, int row_elems);

// Every parameter's part of this rank's shard of every bucket (GradReducer::shard_rank), in
// buffer order (parameters with no element in it are left out; padding belongs to no
// parameter). OwnedPiece::param is an index into `params` (the model's), whatever units the
// buckets were made of.
std::vector<OwnedPiece> owned_pieces(const std::vector<ParamInfo>& params,
                                     const GradReducer& reducer);
// Neighbouring pieces with the same decay merged (contiguous in both buffers): AdamW's calls.
std::vector<OwnedPiece> merge_pieces(const std::vector<OwnedPiece>& pieces);

// Buckets in the order forward first reads their parameters: the embedding (wte, wpe) first,
// then block by block, then the final LayerNorm and the head (Note [Gathers before use]).
// `params`: the reducer's units (GradUnits::units), which the buckets index.
std::vector<size_t> forward_gather_order(const std::vector<ParamInfo>& params,
                                         const std::vector<Bucket>& buckets);

}  // namespace trident
