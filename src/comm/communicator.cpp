// Communicator's default all-reduce with a ReduceOp: the sum, or a bitwise OR on one rank.
#include "trident/check.h"
#include "trident/comm.h"

namespace trident {

Work Communicator::start_all_reduce_op(void* data, size_t count, ElemType type, ReduceOp op,
                                       std::string_view) {
  // Refused before anything starts, so no operation is left in flight. A communicator that
  // can OR overrides this; on one rank the OR is the data itself.
  if (op == ReduceOp::kBitOr && size() > 1)
    internal_error(
        __FILE__, __LINE__,
        fmt::format("all_reduce bitwise OR on communicator '{}': not supported", name()));
  if (op == ReduceOp::kBitOr && type != ElemType::kInt32 && type != ElemType::kInt64 &&
      type != ElemType::kUint8)
    internal_error(__FILE__, __LINE__,
                   fmt::format("all_reduce bitwise OR of {} on communicator '{}': integers only",
                               elem_type_name(type), name()));
  return start_all_reduce(data, count, type);
}

}  // namespace trident
