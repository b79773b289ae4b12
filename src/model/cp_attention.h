// Causal attention with the sequence split over the cp ranks (context parallelism): this rank's
// queries against every rank's keys and values, by blocks (Note [Attention blocks] in
// trident/backend.h), the K/V travelling around a ring or gathered at once.
//
// Note [Context parallelism]
// Each sequence of T tokens is cut into 2·cp chunks of c = T/(2·cp); rank r holds chunks r and
// 2·cp − 1 − r, so that under the causal mask every rank has the same work (an early chunk sees
// few keys, its partner many). The batch reader selects them (SampleOrder::fill), positions
// are the global ones (cp_positions), and everything but attention is per token. A query chunk
// i sees key chunk j whole when j < i, causally when j = i, not at all when j > i. Parameters
// are replicated over cp: their gradients reduce over dp × cp (the existing buckets), and the
// loss is the mean over all ranks' tokens (dloss_scale 1 / (accum · dp · cp)).
//
// Note [Ring attention]
// ring, forward: step s (0 … cp−1) computes on the K/V of rank r − s, and posts the receive of
// step s+1's block (from r − 1) and the send of this one (to r + 1) before it starts, so only
// what a transfer outlasts its compute by is exposed; partial outputs merge by log-sum-exp.
// Backward runs the ring the other way: each step adds this rank's dK/dV for the visiting block
// to the partial sum arriving from r + 1 and passes it on to r − 1; after cp steps each sum has
// visited every rank and goes home. Only kv heads travel (GQA). allgather (Llama 3's choice):
// K/V gathered before attention (again in backward), dK/dV reduce-scattered after; exposed.
#pragma once

#include <chrono>
#include <vector>

#include "trident/backend.h"
#include "trident/comm.h"
#include "trident/model.h"

namespace trident {

class CpAttention {
 public:
  // Sized for micro-batches up to B × T (T: this rank's rows, two chunks of T/2); NH, KVH are
  // this rank's (tp) heads of size hs.
  CpAttention(Backend& be, const ContextParallel& cp, int B, int T, int NH, int KVH, int hs);

  // out [B,T,NH·hs] and lse [B,NH,T] (the block's `att`) from qkv [B,T,(NH+2·KVH)·hs].
  void forward(float* out, float* lse, const float* qkv, int B, int T);
  // dqkv (assign) from dout; `delta` is scratch of B·NH·T floats.
  void backward(float* dqkv, float* delta, const float* dout, const float* qkv, const float* out,
                const float* lse, int B, int T);

  size_t buffer_bytes() const;
  double take_comm_ms();
  double take_exposed_ms();

  // Tests: the order of the ring's events, when recording (Note [Ring attention]).
  enum class Event { kRecvPosted, kComputeBegin, kComputeEnd };
  struct EventRecord {
    Event event;
    int step;
  };
  void record_events(bool on) { record_ = on; }
  const std::vector<EventRecord>& events() const { return events_; }
  // Tests only: post each step's transfers after its compute (breaks the overlap on purpose).
  void post_after_compute(bool on) { post_late_ = on; }

 private:
  AttentionBlockArgs args(int B, int T) const;
  // Queries of this rank's chunks against the two chunks of rank `src` held in kv (packed rows
  // of 2·KVH·hs floats: k | v), forward or backward (dkv: the visiting block's gradient).
  void forward_pair(AttentionBlockArgs a, const float* kv, int src, int T);
  void backward_pair(AttentionBlockArgs a, const float* kv, float* dkv, int src, int T);
  void pack_kv(float* kv, const float* qkv, int B, int T) const;
  void add_dkv(float* dqkv, const float* dkv, int B, int T) const;
  void wait(Work& w, bool exposed);
  void note(Event e, int step) {
    if (record_) events_.push_back({e, step});
  }
  void ring_forward(AttentionBlockArgs a, int B, int T);
  void ring_backward(AttentionBlockArgs a, int B, int T);
  void gather_forward(AttentionBlockArgs a, int B, int T);
  void gather_backward(AttentionBlockArgs a, int B, int T);

  Backend& be_;
  ContextParallel cp_;
  int NH_, KVH_, hs_;
  size_t kv_row_;  // 2·KVH·hs
  // ring: two K/V blocks (one computed on, one arriving), two dK/dV partial sums and the one
  // arriving; allgather: every rank's K/V and their gradients.
  BackendBuffer<float> kv_[2], dkv_[2], dkv_in_, gathered_, dgathered_;
  double comm_ms_ = 0, exposed_ms_ = 0;
  bool record_ = false, post_late_ = false;
  std::vector<EventRecord> events_;
};

}  // namespace trident
