// One rank's data-parallel unit: the communicator its gradients are reduced on, ZeRO's bucket
// layout and shard buffers, the GradReducer, and the hook by which forward waits for ZeRO's
// parameter gathers. The Trainer builds one when dp > 1, in two steps around the model:
// lay_out() before it (the padded layout decides where the parameters sit), attach() after.
//
// Note [HSDP]
// With parallel.dp_replicate > 1 (dp = dp_replicate × dp_shard), ZeRO shards over dp_shard only
// (within a node, by the grid's rank order): a bucket is reduce-scattered in the shard group,
// then its shard is all-reduced over dp_replicate as soon as that completes, in record order,
// on the reducer's thread, so it overlaps backward like the rest. Gathers, AdamW's state and
// the norm's partial sums stay in the shard group; replica 0 of each shard writes it to a
// checkpoint; comm.emulate_gbps is the replicas' link. Without ZeRO nothing changes. With
// zero_reduce micro_batch only the step's last round sums the shards over the replicas (the
// earlier rounds' sums are in the shard by then): the replicas' traffic stays once a step.
//
// Note [HSDP with bf16 gradients]
// With comm.grad_dtype bf16 both hops sum in bf16 (Note [bf16 gradient compression]), as FSDP2's
// reduce_dtype does: the replicas' hop crosses the slow link, where half the bytes matter most.
// Each hop rounds its inputs and partial sums and widens its sum back; the first hop's output
// is a bf16 value (zero_reduce micro_batch's carry went into it), so the second rounds only its
// partial sums. Every replica gets the same bits: the replicas' sum is one all-reduce, whose
// bf16 adds commute and whose result MPI's and NCCL's algorithms hand every rank alike, as the
// fp32 hop relies on.
#pragma once

#include <memory>
#include <vector>

#include "train/grad_pool.h"
#include "train/zero.h"
#include "train/zero3.h"
#include "train/zero3_pool.h"
#include "trident/deck.h"
#include "trident/grad_reducer.h"
#include "trident/model.h"
#include "trident/train.h"

namespace trident {

class DataParallel {
 public:
  // The deck's ZeRO keys against the run (input_error naming them), checked whatever dp is.
  static void check_deck(const Deck& deck, bool device, int chunks, bool split_backward);
  // comm.first_bucket_mb and comm.bucket_mb in bytes (kOneBucket above SIZE_MAX).
  static size_t first_bucket_bytes(const CommConfig& comm);
  static size_t bucket_bytes(const CommConfig& comm);

  DataParallel(const Deck& deck, const TrainContext& ctx);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Before the model. `params`: the model's parameters in ready order (gpt_param_layout), one
  // of which (split_param, or -1) the model reports in row pieces (GPTOptions::wte_piece_rows,
  // `row_elems` elements a row); `alone_param` (or -1) needs a bucket of its own
  // (Note [Padded buckets]). With ZeRO, writes the padded offsets into options.
  void lay_out(const std::vector<ParamInfo>& params, int split_param,
               const std::vector<int>& piece_rows, int row_elems, int alone_param,
               GPTOptions& options);
  // After the model: builds the reducer over its gradients, ZeRO's shard buffer and pieces, and
  // the gather hook. With ZeRO-3 the model's full parameter buffer is released: its values
  // must come into the shards by init_params, take_params or shard_writer after.
  void attach(GPT& model);
  // ZeRO-3: the model's initialisation (GPT::init_weights' values), a unit at a time into the
  // shards, so the whole model is never held; take_params (the host): the model's full buffer
  // holds the weights (loaded whole), which go into the shards and its pages are released.
  void init_params(GPT& model, uint64_t seed);
  void take_params();

  int size() const { return size_; }
  int rank() const { return rank_; }
  // The ranks ZeRO shards over (dp, or dp_shard with replicas: Note [HSDP]) and this rank's
  // place among them; and whether this rank writes its pieces (replica 0 of each shard).
  int shard_ranks() const { return shard_ranks_; }
  int shard_rank() const { return shard_rank_; }
  bool writes_shard() const { return writes_shard_; }
  bool sharded() const { return sharded_; }
  bool zero3() const { return zero3_; }  // Note [ZeRO-3 units]
  // ZeRO-3: this rank's shard of the parameters (at the owned pieces' shard offsets), and the
  // units' gathers.
  // Whoever asks may write it: the bf16 copy the units gather counts as stale from here on
  // (Note [bf16 unit gathers] in train/zero3_pool.h).
  float* shard_params() {
    shard16_stale_ = true;
    return shard_params_.data();
  }
  UnitGathers& unit_gathers() { return *unit_gathers_; }
  // ZeRO-3: the units still gathered after a forward-only pass (validation) go back.
  void release_params();
  // ZeRO-3: the most bytes of the full parameter buffer found resident so far.
  size_t params_resident_peak() const { return params_resident_peak_; }
  bool releases_grads() const { return release_grads_; }  // ZeRO-2 (Note [ZeRO-2 on the host])
  // Whether every micro-batch's backward is a reducing round (Note [ZeRO-2 and accumulation]).
  bool reduces_every_micro_batch() const;
  GradReducer& reducer() { return *reducer_; }
  // The reducer's index of the model's parameter `param`'s piece `piece`, and the range of a
  // parameter's units [first, last).
  int unit(int param, int piece) const { return unit_first_[size_t(param)] + piece; }
  // ZeRO-3 on a device: the unit pool's bytes (0 on the host).
  size_t pool_bytes() const;
  // Note [Gradients in unit slots] (train/grad_pool.h): whether backward writes into a pool
  // (GPTOptions::pooled_grads), its bytes (0 without), and its start of a step (instead of
  // GPT::zero_grads), or of each later micro-batch's round with zero_reduce micro_batch (after
  // the last round's finish(); Note [Shard sums on a device]).
  bool pools_grads() const { return pooled_grads_; }
  size_t grad_pool_bytes() const;
  void begin_step();
  // ZeRO-3 on a device: where model.init_from's reader puts each parameter, straight into this
  // rank's shards (Note [No full weights on a device] in train/zero3_pool.h).
  ParamWriteFn shard_writer();
  // ZeRO-3: adds to the parts of a parameter this rank's shards hold (the sigmoid router's bias
  // step, GPT::update_router_biases, between the gathers of two steps).
  ParamAddFn shard_adder();
  int units_end(int param) const { return unit_first_[size_t(param) + 1]; }
  // With ZeRO: this rank's shard of the bucket holding `unit`: its gradient sums and the part
  // [flat_begin, flat_begin + count) of the flat buffer they belong to.
  struct ShardSlice {
    float* grads = nullptr;
    size_t flat_begin = 0, count = 0;
  };
  ShardSlice shard_of(int unit);
  // With ZeRO: the shard gradient buffer and this rank's pieces of each parameter.
  float* shard_grads() { return shard_grads_.data(); }
  size_t shard_size() const { return shard_grads_.size(); }
  const std::vector<OwnedPiece>& owned() const { return owned_; }

  // Ends the step's reduction (gradients are the dp sum of the seeded ones: the average) and
  // fills the step's communication figures; `rows_ms`: a collective before the pipeline that
  // nothing overlapped (the tied embedding's row set), counted as exposed.
  void finish(StepStats& s, const ReduceStats& earlier_rounds, double rows_ms);
  // AdamW on this rank's shard, then the gathers of the updated parameters (ZeRO only).
  void update_shard(AdamW& opt, Backend& be, GPT& model, const TrainConfig& tc, float lr, int t,
                    float grad_scale, StepStats& s);
  // Waits for ZeRO's gathers in flight (before params() is read outside a step).
  void sync_params();
  // ZeRO-2: the most bytes of the full gradient buffer found resident so far.
  size_t grad_resident_peak() const { return grad_resident_peak_; }

 private:
  // ZeRO-3 on a device: this rank's shard of unit u's buckets, read at `base` (+ bucket offsets),
  // copied into shard_params on the backend.
  void copy_shards(const Zero3Unit& u, const float* base);
  template <typename Fn>
  void for_each_shard_part(const ParamInfo& p, Fn&& fn);
  // Note [bf16 unit gathers]: the shards' bf16 copy cast again where stale, before a gather.
  void refresh_shard16();

  const Deck& deck_;
  TrainContext ctx_;
  int size_ = 1, rank_ = 0;
  int replicas_ = 1, shard_ranks_ = 1, shard_rank_ = 0;  // Note [HSDP]
  bool writes_shard_ = true;
  bool sharded_ = false, release_grads_ = false, zero3_ = false, device_ = false;
  bool pooled_grads_ = false;  // Note [When gradients are pooled]
  GPT* model_ = nullptr;       // attach's (ZeRO-3)
  // lay_out's split, kept for attach: the parameter in row pieces (-1: none), its piece rows.
  int split_param_ = -1, row_elems_ = 1;
  std::vector<int> piece_rows_;
  std::vector<char> alone_;           // per unit: a bucket of its own (padded layout)
  std::vector<char> expert_;          // per unit: an ep-split expert tensor (ctx.expert_dp)
  size_t shard_floats_ = 0;           // lay_out's: the shard buffer's elements
  std::vector<char> breaks_;          // ZeRO-3, per unit: starts a bucket (a new ZeRO-3 unit)
  std::vector<size_t> gather_order_;  // ZeRO: buckets in forward order
  std::vector<int> unit_first_;
  // Destroyed in reverse: the reducer's thread stops before its buffers and communicator go.
  std::unique_ptr<MpiComm> grad_comm_;       // the gradients' own duplicate of dp, where needed
  std::unique_ptr<MpiComm> gather_comm_;     // ZeRO-3: the gathers' own duplicate of dp
  std::unique_ptr<MpiComm> replicate_comm_;  // HSDP: the shards' sum over the replicas
  BackendBuffer<float> shard_grads_, shard_params_;
  // Note [bf16 unit gathers]: per unit, gathered in bf16; the shards' bf16 copy, and whether it
  // lags shard_params_.
  std::vector<char> gather_bf16_;
  BackendBuffer<bfloat16> shard_params16_;
  bool shard16_stale_ = true;
  std::unique_ptr<UnitPool> pool_;  // ZeRO-3 on a device (Note [Weights in unit slots])
  std::unique_ptr<GradReducer> reducer_;
  std::unique_ptr<UnitGathers> unit_gathers_;  // ZeRO-3
  std::unique_ptr<GradPool> grad_pool_;        // Note [Gradients in unit slots]
  std::vector<OwnedPiece> shard_runs_;         // ZeRO-3: owned_runs_ with flat = shard offset
  size_t params_resident_peak_ = 0;
  std::vector<OwnedPiece> owned_;       // this rank's piece of each parameter, buffer order
  std::vector<OwnedPiece> owned_runs_;  // the same merged: AdamW's passes
  size_t grad_resident_peak_ = 0;
  bool ready_order_warned_ = false;  // Note [Ready order check]: said once per run
};

}  // namespace trident
