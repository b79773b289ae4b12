// Communicator's default all-reduce with a ReduceOp: the average of host buffers as the sum
// followed by a division on the host, for communicators that cannot average themselves.
#include "trident/check.h"
#include "trident/comm.h"

namespace trident {

namespace {

// Wraps the sum's Work and divides the buffer by n on the thread that sees it complete (the
// thread that polls, i.e. the communicator's user), once.
template <typename T>
class HostAverageWork final : public Work::Impl {
 public:
  HostAverageWork(Work sum, T* data, size_t count, int n)
      : sum_(std::move(sum)), data_(data), count_(count), n_(n) {}

  bool test() override {
    if (divided_) return true;
    if (!sum_.test()) return false;
    divide();
    return true;
  }

  void wait() override {
    if (divided_) return;
    sum_.wait();
    divide();
  }

  const OpRecord& record() const override { return sum_.record(); }
  CommClock::time_point idle_until() const override {
    return divided_ ? CommClock::time_point::min() : sum_.idle_until();
  }

 private:
  void divide() {
    // The same expression the GradReducer used, so results stay bitwise identical.
    const T n = static_cast<T>(n_);
    for (size_t k = 0; k < count_; ++k) data_[k] /= n;
    divided_ = true;
  }

  Work sum_;
  T* data_;
  size_t count_;
  int n_;
  bool divided_ = false;
};

}  // namespace

Work Communicator::start_all_reduce_op(void* data, size_t count, ElemType type, ReduceOp op,
                                       std::string_view) {
  // Refused before anything starts, so no operation is left in flight.
  if (op == ReduceOp::kAvg && type != ElemType::kFloat32 && type != ElemType::kFloat64)
    internal_error(__FILE__, __LINE__,
                   fmt::format("all_reduce average of {} on communicator '{}': only float32 and "
                               "float64 can be averaged on the host",
                               elem_type_name(type), name()));
  // A communicator that can OR overrides this; on one rank the OR is the data itself.
  if (op == ReduceOp::kBitOr && size() > 1)
    internal_error(__FILE__, __LINE__,
                   fmt::format("all_reduce bitwise OR on communicator '{}': not supported",
                               name()));
  if (op == ReduceOp::kBitOr && type != ElemType::kInt32 && type != ElemType::kInt64 &&
      type != ElemType::kUint8)
    internal_error(__FILE__, __LINE__,
                   fmt::format("all_reduce bitwise OR of {} on communicator '{}': integers only",
                               elem_type_name(type), name()));
  Work sum = start_all_reduce(data, count, type);
  // One rank: the sum is the average and the OR (and an empty Work has no record to forward).
  if (op != ReduceOp::kAvg || size() == 1) return sum;
  if (type == ElemType::kFloat64)
    return Work(std::make_unique<HostAverageWork<double>>(
        std::move(sum), static_cast<double*>(data), count, size()));
  return Work(std::make_unique<HostAverageWork<float>>(std::move(sum), static_cast<float*>(data),
                                                       count, size()));
}

}  // namespace trident
