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

#include <array>
#include <chrono>
#include <vector>

#include "model/ring_events.h"
#include "model/ring_order.h"
#include "trident/backend.h"
#include "trident/comm.h"
#include "trident/model.h"

namespace trident {

// The ring's events are recorded for tests (RingEvents, Note [Ring attention]).
class CpAttention : public RingEvents {
 public:
  // Sized for micro-batches up to B × T (T: this rank's rows, two chunks of T/2); NH, KVH are
  // this rank's (tp) heads of size hs. The ring's transfers go in groups on a communicator
  // with marks, and on any other when `grouped` (tests): Note [Ring on a device].
  CpAttention(Backend& be, const ContextParallel& cp, int B, int T, int NH, int KVH, int hs,
              bool grouped = false);

  // out [B,T,NH·hs] and lse [B,NH,T] (the block's `att`) from qkv [B,T,(NH+2·KVH)·hs].
  void forward(float* out, float* lse, const float* qkv, int B, int T);
  // dqkv (assign) from dout; `delta` is scratch of B·NH·T floats.
  void backward(float* dqkv, float* delta, const float* dout, const float* qkv, const float* out,
                const float* lse, int B, int T);

  size_t buffer_bytes() const;
  double take_comm_ms();
  double take_exposed_ms();

 private:
  AttentionBlockArgs args(int B, int T) const;
  // Keys and values of one rank's two chunks, and where their gradients go, with their strides.
  struct KvView {
    const float *k, *v;
    float *dk, *dv;
    size_t rstride, bstride;
  };
  KvView packed(const float* kv, float* dkv, int T) const;  // rows of 2·KVH·hs: k | v
  // This rank's query chunks against the two chunks of rank `src`, forward or backward.
  void forward_pair(AttentionBlockArgs a, const KvView& kv, int src, int T);
  // Backward: only the key rows [lo, hi) of the two chunks' 2·c (Note [dK/dV in parts]); hi < 0:
  // all.
  void backward_pair(AttentionBlockArgs a, const KvView& kv, int src, int T, int lo = 0,
                     int hi = -1);
  void pack_kv(float* kv, const float* qkv, int B, int T) const;
  static constexpr int kDkvParts = 4;  // Note [dK/dV in parts]
  // dqkv's k | v columns to packed rows (to_packed) or back.
  void unpack_dkv(float* dkv, float* dqkv, int B, int T, bool to_packed) const;
  // Waits (all of it exposed); a received block's transfer time goes to cp_comm_ms.
  void wait(Work& w, bool received);
  void ring_forward(AttentionBlockArgs a, int B, int T);
  void ring_backward(AttentionBlockArgs a, int B, int T);
  void gather_forward(AttentionBlockArgs a, int B, int T);
  void gather_backward(AttentionBlockArgs a, int B, int T);
  // Note [Ring on a device] (cp_ring_grouped.cpp): one exchange per step, ordered by marks.
  void grouped_ring_forward(AttentionBlockArgs a, int B, int T);
  void grouped_ring_backward(AttentionBlockArgs a, int B, int T);
  // The compute enqueued next needs `w`: on a device the compute stream waits for the
  // communication stream and `w` is kept for the next call (RingOrder::defer); on the host,
  // wait(w, received).
  void needed(Work w, bool received);

  Backend& be_;
  ContextParallel cp_;
  int NH_, KVH_, hs_;
  size_t kv_row_;  // 2·KVH·hs
  // ring: two K/V blocks (one computed on, one arriving), two dK/dV partial sums and the one
  // arriving; allgather: every rank's K/V and their gradients.
  // Grouped ring: kv_ are two slots of 2·block, k|v rows then their partial dK/dV; dkv_[0] the
  // step's own dK/dV, dkv_in_ this rank's sums coming home.
  BackendBuffer<float> kv_[2], dkv_[2], dkv_in_, gathered_, dgathered_;
  RingOrder order_;  // the grouped exchanges and their marks (Note [Ring on a device])
  bool grouped_ = false;
  double comm_ms_ = 0, exposed_ms_ = 0;
};

}  // namespace trident
