// The tied embedding's rows of one step (Note [Tied embedding gradient] in trident/model.h):
// which rows of this rank's vocabulary slice the step's input tokens touch, on any dp rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "trident/comm.h"

namespace trident {

// Note [Step row set]
// The embedding's sparse gradient is one compact buffer (row k: the set's k-th row) all-reduced
// over dp, so every dp rank must hold the same set in the same order: the union of every dp
// rank's input tokens, ascending. Each rank marks only its own tokens in a bitmap over its
// vocabulary slice (one bit a row) and one all-reduce with bitwise OR unites the bitmaps: no
// rank's work or message grows with dp, and the rows come out ascending, as a scan of the
// whole global batch would give them, so the sums and their order are the same.
//
// With tp > 1 each tp rank keeps its own slice and unites over its own dp communicator: the tp
// ranks of one dp rank read the same samples, so a token's row is marked exactly where its
// slice lives.
class StepRowSet {
 public:
  // Rows [vocab_begin, vocab_end): this tp rank's slice (Note [Tensor-parallel shards]).
  // Everything is sized here; no call below allocates.
  StepRowSet(int32_t vocab_begin, int32_t vocab_end);

  // Starts a step: no row marked.
  void clear();
  // Marks the rows of `tokens`; tokens outside the slice belong to another tp rank: ignored.
  void mark(const int32_t* tokens, size_t n);
  // The union over `comm` (an all-reduce with bitwise OR; every rank of comm calls it at the
  // same point, Note [Same buckets, same order]), then the row list and index. Blocks; returns
  // the all-reduce's span (for comm_ms and the trace).
  OpRecord unite(Communicator& comm);
  // After unite: the set's token ids, ascending.
  const std::vector<int32_t>& rows() const { return rows_; }
  // After unite: the position of `token` in rows(), or -1 (not in the set, or outside the slice).
  int32_t index_of(int32_t token) const {
    const uint32_t r = uint32_t(token - begin_);
    return r < uint32_t(end_ - begin_) ? index_[r] : -1;
  }
  size_t num_words() const { return bits_.size(); }

 private:
  void list_rows();

  int32_t begin_, end_;
  std::vector<uint64_t> bits_;  // bit r: row begin_ + r
  std::vector<int32_t> rows_;   // capacity: the whole slice
  std::vector<int32_t> index_;  // per row of the slice: its position in rows_, or -1
};

}  // namespace trident
