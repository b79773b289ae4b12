// ZeRO stages 1 and 2 (parallel.zero): AdamW's state, and with 2 the gradients' memory, sharded
// over the data-parallel ranks.
//
// Note [ZeRO-1]
// Without ZeRO every dp rank holds AdamW's m and v for the whole model and updates all of it.
// With it, each dp rank owns one contiguous, equal slice of every gradient bucket (Note [Padded
// buckets] in trident/buckets.h: the flat parameter and gradient buffers get zero padding at
// the end of each bucket so the slices are exact), and one step is:
//   1. backward as always; the communication thread reduce-scatters each bucket as soon as it
//      is ready (the same ready events, strict bucket order and timeout as the all-reduce),
//      into this rank's shard gradient buffer (shard_grads: Σ count_b / dp floats);
//   2. the global gradient norm from the shards: each rank's partial sums of squares, one
//      all-reduce over dp, then over tp and pp as before;
//   3. AdamW on the shard only (m, v hold the shard: 1/dp of the model);
//   4. the communication thread all-gathers every bucket's parameters in place, in the order
//      the next forward first reads them (Note [Gathers before use]).
// The update is elementwise, so with the same reduced gradients it gives the same bits as the
// replicated update; the sums may differ in order (a reduce-scatter is not an all-reduce) and
// the norm is summed in another grouping, so zero 1 equals zero 0 to rounding, and bitwise
// where the sums agree (dp 2 sums two numbers either way).
// The full gradient buffer stays (ZeRO-2 below gives its memory back), and the thread works on
// a duplicate of the dp communicator of its own: its all-gathers run during the next step's
// forward, when the compute thread also uses dp (the row set, the loss).
//
// Note [ZeRO-2 on the host]
// ZeRO-2 (parallel.zero: 2) is ZeRO-1 plus: once a bucket's reduce-scatter has completed, the
// full buffer's slice of that bucket is no longer needed (its sum now lives in this rank's
// shard), so the reducer's thread zeroes it and gives its pages back to the kernel
// (release_host_floats: madvise MADV_DONTNEED, memset for the partial pages at the ends). A
// released page reads as zero and holds no memory until backward writes it again, so the
// buffer is all zero after the step and the next step skips zero_grads (the kernel zeroes each
// page as it is first written, instead of one memset pass over the whole buffer). Gradient
// memory is then held only from the moment backward writes a bucket to the end of its
// reduce-scatter, and the shard stays. It is measured, not assumed: before each release the
// thread counts the buffer's resident pages (mincore), and bench reports the peak
// (grad_resident_mib, with the shard).
// The model writes its gradients straight into the flat buffer (pointers resolved once), so
// the buffer keeps its address range; only its memory comes and goes. This is host memory
// only (a device allocation cannot give pages back like this: there it would be a pool of
// bucket buffers), hence the refusal on device backends.
// With train.accum > 1, Note [ZeRO-2 and accumulation] below.
//
// Note [ZeRO-2 and accumulation]
// parallel.zero_reduce: step (the default, Megatron's way): the gradients accumulate in the
// full buffer over the micro-batches and are reduce-scattered on the last one, so they are
// resident from the first micro-batch's backward to the end of the step, and ZeRO-2's saving
// is between steps. micro_batch (DeepSpeed's way): every micro-batch's backward is a reducing
// round; each bucket is reduce-scattered and released as in a step, and the rounds after the
// first add to the shard (the thread adds the shard's sum so far into this rank's own block of
// the bucket before its reduce-scatter, GradReducer::begin_step's accumulate_shards). The
// buffer is zero again after each round, so the next micro-batch writes into released pages;
// GPTStage finishes a round at the start of the next backward, so a round's tail overlaps the
// next micro-batch's forward, and no backward writes a bucket its previous round still reads.
// Each micro-batch's gradients are then final when its backward ends, so the model is told so
// (last_micro_batch: the tp partial sums of the LayerNorms are reduced every micro-batch). It
// holds at most the bound's buckets at any time, but sends accum times the bytes; measured in
// docs/perf.md. It needs one chunk per stage and a one-pass backward (no zb-h1).
//
// Note [Bounded gradient memory]
// Releasing each bucket after its reduce-scatter bounds nothing by itself: backward writes
// gradients as fast as it computes them, and behind a slow link (or a communication thread
// that shares the core) many complete buckets wait their turn, all resident — at dp 4 on 2
// cores, 4 × 7.5 MiB pieces of wte's and a few blocks' buckets (210 MiB of a 472 MiB buffer
// measured at the peak before wte was split). So with ZeRO-2 and overlap, grad_ready blocks
// the compute thread once the complete, unreleased buckets exceed one bucket (comm.bucket_mb):
// at most one bucket is queued or on the wire while backward writes the next; the full buffer
// holds about two buckets plus the one being written at any time, whatever the link's speed.
// The cost is backward waiting where the link is slower than compute: ReduceStats::
// held_wait_ms (bench: held_wait_ms), inside backward_ms. DeepSpeed's ZeRO-2 bounds its
// gradient buffers the same way (two reduce buckets of reduce_bucket_size, waited for before
// reuse). The thread can always go on: a held bucket is complete, and with one chunk per stage
// the buckets before it are too; so the wait cannot deadlock. Without overlap nothing is
// released before finish(), so there is no bound.
//
// Note [Gathers before use]
// The gathers are started right after the optimizer, all at once, in forward order (the bucket
// holding the embedding first, then the blocks from first to last, the head last); MPI pairs
// them by start order, the same on every rank. The model calls a hook before it first reads
// each group of parameters (GPT::set_param_use): the embedding's, a block's, the head's. The
// hook waits for the buckets holding that group and for nothing else, so the first block runs
// while later buckets are still on the wire. The time the compute thread spends waiting there
// is the all-gather's exposed time (StepStats::gather_exposed_ms); with comm.overlap false the
// round is waited for at once after the optimizer, the same calls on the same slices.
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
// parameter the model reports in row pieces (the LM head's weight, Note [Head gradient in
// pieces] in train/tied_embedding.h) is one unit per piece, each a copy of its ParamInfo with
// the piece's offset, count and a name "wte[rows a..b]". The model reports (parameter i,
// piece k) ready; the reducer's index for it is first[i] + k.
struct GradUnits {
  std::vector<ParamInfo> units;
  std::vector<int> first;  // per parameter, and the total at the end (size params + 1)
  std::vector<char> pieces;  // per unit: one of several pieces of a parameter
  std::vector<size_t> counts() const;
};
// split_param: the index of the parameter in pieces (-1: none); piece_rows: its row bounds
// (GPTOptions::wte_piece_rows; fewer than 3: one piece); row_elems: elements per row.
GradUnits grad_units(const std::vector<ParamInfo>& params, int split_param,
                     const std::vector<int>& piece_rows, int row_elems);

// Every parameter's part of this dp rank's shard of every bucket, in buffer order (parameters
// with no element in it are left out; padding belongs to no parameter). OwnedPiece::param is
// an index into `params` (the model's), whatever units the buckets were made of.
std::vector<OwnedPiece> owned_pieces(const std::vector<ParamInfo>& params,
                                     const GradReducer& reducer, int dp_rank);
// Neighbouring pieces with the same decay merged (contiguous in both buffers): AdamW's calls.
std::vector<OwnedPiece> merge_pieces(const std::vector<OwnedPiece>& pieces);

// Buckets in the order forward first reads their parameters: the embedding (wte, wpe) first,
// then block by block, then the final LayerNorm and the head (Note [Gathers before use]).
// `params`: the reducer's units (GradUnits::units), which the buckets index.
std::vector<size_t> forward_gather_order(const std::vector<ParamInfo>& params,
                                         const std::vector<Bucket>& buckets);

}  // namespace trident
