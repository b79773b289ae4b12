// Tensor-parallel collectives cut into chunks that travel while the GEMMs compute on the chunks
// already there (parallel.tp_overlap), as Megatron-LM's --tp-comm-overlap and torchtitan's
// async TP do.
//
// Note [Tensor-parallel overlap]
// With sequence parallelism an all-gather before a column-parallel GEMM (qkv, fc; backward: the
// output gradient before fcproj's and attproj's input-gradient GEMMs) is a ring of tp steps of
// one rank's chunk each, cut in tp_overlap_chunks pieces: a piece's GEMM runs while the next
// arrives. A reduce-scatter after a row-parallel GEMM is a ring the other way, a piece's partial
// sum computed while the previous travels. Without it, a row-parallel all-reduce goes in pieces.
// Backward's column-parallel input-gradient sums travel under the weight-gradient GEMM ("bulk").
// Row pieces keep a GEMM's bits (OpenBLAS, 12+ rows); tp 2's sums are one addition, as before.
//
// Note [Chunks on the host]
// Open MPI moves a chunk's bytes only inside MPI calls: the wait after a chunk's GEMM moves them,
// so the overlap is real only where the wire takes time (another node, or an emulated link on
// tp), whose time runs from the post. Hence parallel.tp_overlap auto, the default, is on only
// there (tp_overlap_on in train/model_options.cpp); true forces it. The embedding's, the head's
// and the LayerNorm weights' sums stay whole. A device runs the rings in grouped exchanges
// (Note [Tensor-parallel ring on a device] in tp_ring_grouped.cpp).
//
// Note [Tensor-parallel overlap in bf16]
// The same rings carry the bf16 tp block (Note [bf16 with tp]): a gather ring moves bf16 rows
// through stage16 and rounds its GEMMs to bf16 as the unchunked path does; a reduce-scatter ring
// moves fp32 partial sums, rounded once after the sum. Only a piece's compute differs (PieceFn).
// auto: fp32's rule (Note [Chunks on the host]), so off on a device, where every bf16 run is;
// true runs the rings. Bits change with the pieces only: a GEMM of fewer rows (a CPU BLAS may
// sum otherwise), GPT-2's fc bias gradient summed piece by piece, the sums' order at tp > 2;
// one piece without SP is bitwise (the bounds: tests/mpi/test_tp_overlap_bf16.cpp).
#pragma once

#include <memory>
#include <type_traits>
#include <vector>

#include "model/ring_events.h"
#include "model/ring_order.h"
#include "trident/backend.h"
#include "trident/comm.h"
#include "trident/model.h"

namespace trident {

// A callable referred to, not owned (nothing allocated): a ring's compute on one piece.
template <class Sig>
class PieceFn;
template <class R, class... A>
class PieceFn<R(A...)> {
 public:
  template <class F>
  requires(!std::is_same_v<std::remove_cvref_t<F>, PieceFn>)
      PieceFn(F& f)  // NOLINT(google-explicit-constructor): a lambda passes as it is
      : obj_(&f), call_([](void* o, A... a) -> R { return (*static_cast<F*>(o))(a...); }) {}
  R operator()(A... a) const { return call_(obj_, a...); }

 private:
  void* obj_;
  R (*call_)(void*, A...);
};

// Waits for `w` on the compute thread (Note [Waiting for a tp collective] in gpt_tp.cpp) and
// counts the wait as exposed. Comm time: the wait's, where the bytes move in it
// (Note [Chunks on the host]); on an emulated link the wire's time, but only for a `transfer`
// (a ring step's send shares its wire time with the step's receive).
void wait_tp(Backend& be, Work& w, TpTimes& times, bool transfer = true);

// The rings' events are recorded for tests (RingEvents, Note [Tensor-parallel overlap]).
class TpOverlap : public RingEvents {
 public:
  // Micro-batches up to maxN rows (B·T); `widest` the widest GEMM output or input a chunk has
  // (qkv, fc, fcproj's and attproj's inputs); `stage` [maxN, C] and `partial` [maxN, C] the
  // model's sequence-parallel scratch (Note [Sequence-parallel rows]), used within a call: the
  // ring's received chunks and the partial sums it sends. With tp.ring the rings go in grouped
  // exchanges on it (Note [Tensor-parallel ring on a device]).
  TpOverlap(Backend& be, const TensorParallel& tp, int maxN, size_t widest, float* stage,
            float* partial, TpTimes& times);

  // A GEMM on rows: forward (out = inp · wᵀ + bias, out width OC, input width C) or an input
  // gradient (out = inp · w, w [C, OC]: out width OC, inp width C).
  struct Gemm {
    const float* w;
    const float* bias;  // forward only; may be null
    int OC;
    bool input_gradient;
  };
  // Sequence parallelism: out [N, OC] = the GEMM of all ranks' rows of local [Nr, C], which are
  // also gathered into in_full [N, C] (Note [Sequence-parallel rows]); the ring of tp chunks.
  void gather_matmul(float* out, float* in_full, const float* local, const Gemm& g, int B, int T,
                     int C);
  // Sequence parallelism: out [Nr, C] = this rank's rows of the tp sum of inp [N, K] · wᵀ
  // (+ bias, added by tp rank 0 only: pass it there); the ring of tp chunks.
  void matmul_reduce_scatter(float* out, const float* inp, const float* w, const float* bias, int B,
                             int T, int K, int C);
  // Without sequence parallelism: out [N, C] = the tp sum of inp [N, K] · wᵀ (+ bias as above),
  // in chunks() pieces of N / chunks() rows.
  void matmul_all_reduce(float* out, const float* inp, const float* w, const float* bias, int N,
                         int K, int C);
  // bf16 (Note [Tensor-parallel overlap in bf16]). A gather ring's GEMM on bf16 rows: forward
  // (out = bf16(inp · wᵀ + bias); with `gelu`, out = bf16(gelu(y)) and aux = bf16(y)) or an input
  // gradient (out = bf16(inp · w); with `gelu`, through the GELU of aux's pre-activation, and
  // dbias += its column sums piece by piece).
  struct Gemm16 {
    const bfloat16* w;
    const float* bias = nullptr;  // forward; may be null
    float* dbias = nullptr;       // an input gradient through the GELU; may be null
    int OC = 0;
    bool input_gradient = false;
    bfloat16* pre_out = nullptr;       // forward with the GELU: the pre-activation [N, OC]
    const bfloat16* pre_in = nullptr;  // input gradient through the GELU: forward's pre_out
  };
  // As gather_matmul, the chunks and in_full in bf16 (through stage16).
  void gather_matmul_bf16(bfloat16* out, bfloat16* in_full, const bfloat16* local, const Gemm16& g,
                          int B, int T, int C);
  // As matmul_reduce_scatter and matmul_all_reduce on bf16 inp and w: fp32 partial sums.
  void matmul_reduce_scatter_bf16(float* out, const bfloat16* inp, const bfloat16* w,
                                  const float* bias, int B, int T, int K, int C);
  void matmul_all_reduce_bf16(float* out, const bfloat16* inp, const bfloat16* w, const float* bias,
                              int N, int K, int C);
  // The bf16 gather ring's staging [tp][Nr, C] (the model's stage16); set before its first use.
  void set_stage16(bfloat16* stage16) { stage16_ = stage16; }
  int chunks() const { return tp_.chunks; }
  size_t buffer_bytes() const { return rows_.size() * sizeof(float); }  // its own (rows_)
  bool grouped() const { return order_ != nullptr; }  // Note [Tensor-parallel ring on a device]

 private:
  // Rows [r0, r0 + count) of sequence chunk `chunk` ([B, Tl] order) from packed rows into the
  // full [B, T] tensor of `row` bytes a row (to_full), or from the full tensor into packed rows.
  void move_rows(void* dst, const void* src, bool to_full, int chunk, int r0, int count, int T,
                 size_t row) const;
  // The rings on elements E (Note [Tensor-parallel overlap in bf16]). A gather ring's piece:
  // rows [r0, r0 + count) of rank src's chunk, at `in`; a reduce-scatter ring's: dst = the
  // partial sums of rows [r0, r0 + count) of chunk c; an all-reduce piece: rows [r0, r0 + count)
  // of out.
  template <class E>
  using GatherPiece = PieceFn<void(const E* in, int src, int r0, int count)>;
  using PartialPiece = PieceFn<void(float* dst, int c, int r0, int count)>;
  using RowsPiece = PieceFn<void(int r0, int count)>;
  template <class E>
  void gather_ring(const E* local, E* stage, int B, int T, int C, GatherPiece<E> piece);
  template <class E>
  void grouped_gather_ring(const E* local, E* stage, int B, int T, int C, GatherPiece<E> piece);
  void reduce_scatter_ring(float* out, int B, int T, int C, PartialPiece piece);
  void grouped_reduce_scatter_ring(float* out, int B, int T, int C, PartialPiece piece);
  void all_reduce_pieces(float* out, int N, int C, RowsPiece piece);
  // Rows [r0, r0 + count) of rank src's chunk, at `in`: into in_full (if not null), and through
  // the GEMM into their rows of out [B, T, g.OC].
  void gather_gemm(float* out, float* in_full, const float* in, const Gemm& g, int src, int r0,
                   int count, int B, int T, int C);
  // dst = the partial sums of rows [r0, r0 + count) of chunk c of inp [B, T, K].
  void partial_gemm(float* dst, const float* inp, const float* w, const float* bias, int c, int r0,
                    int count, int B, int T, int K, int C);
  // The compute enqueued next needs `w`: deferred on a device (RingOrder::defer), else waited.
  void needed(Work& w);

  Backend& be_;
  TensorParallel tp_;
  float* stage_;    // [tp][Nr, C]: gathered chunks; a reduce-scatter's received sums in [2]
  float* partial_;  // [2][Nr, C]: a reduce-scatter's partial sums being sent
  bfloat16* stage16_ = nullptr;       // bf16: [tp][Nr, C] gathered chunks
  BackendBuffer<float> rows_;         // one chunk's GEMM input or output [Nr, widest]; in bf16
                                      // two: [2][Nr, widest] halves
  std::vector<Work> sends_, recvs_;   // one per ring piece, reused (no allocation per step)
  std::unique_ptr<RingOrder> order_;  // with tp.ring: the grouped exchanges
  TpTimes& times_;
};

}  // namespace trident
