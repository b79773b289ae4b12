#include "train/embedding_rows.h"

#include <algorithm>
#include <bit>

#include "trident/check.h"

namespace trident {

StepRowSet::StepRowSet(int32_t vocab_begin, int32_t vocab_end)
    : begin_(vocab_begin), end_(vocab_end) {
  TRIDENT_CHECK(vocab_begin >= 0 && vocab_end >= vocab_begin, "vocabulary slice [{}, {})",
                vocab_begin, vocab_end);
  const size_t n = size_t(vocab_end - vocab_begin);
  bits_.assign((n + 63) / 64, 0);
  rows_.reserve(n);
  index_.assign(n, -1);
}

void StepRowSet::clear() { std::fill(bits_.begin(), bits_.end(), 0); }

void StepRowSet::mark(const int32_t* tokens, size_t n) {
  const uint32_t rows = uint32_t(end_ - begin_);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t r = uint32_t(tokens[i] - begin_);  // below begin_ wraps to a large value
    if (r < rows) bits_[r >> 6] |= uint64_t(1) << (r & 63);
  }
}

OpRecord StepRowSet::unite(Communicator& comm) {
  OpRecord span{"all_reduce", bits_.size() * sizeof(uint64_t), CommClock::now(), {}};
  // int64 on the wire (ElemType has no uint64); OR does not care about the sign bit.
  comm.all_reduce(reinterpret_cast<int64_t*>(bits_.data()), bits_.size(), ReduceOp::kBitOr,
                  "wte row set")
      .wait();
  span.end = CommClock::now();
  list_rows();
  return span;
}

void StepRowSet::list_rows() {
  // Only last step's rows need resetting: O(rows), not O(slice).
  for (int32_t t : rows_) index_[size_t(t - begin_)] = -1;
  rows_.clear();
  for (size_t w = 0; w < bits_.size(); ++w)
    for (uint64_t word = bits_[w]; word != 0; word &= word - 1) {
      const int32_t r = int32_t(w * 64 + size_t(std::countr_zero(word)));
      index_[size_t(r)] = int32_t(rows_.size());
      rows_.push_back(begin_ + r);
    }
}

}  // namespace trident
