#include <cstring>

#include "trident/check.h"
#include "trident/comm.h"

namespace trident {

Work SoloComm::start_all_reduce(void*, size_t, ElemType) { return {}; }

Work SoloComm::start_reduce_scatter(const void* send, void* recv, size_t recv_count,
                                    ElemType type) {
  if (send != recv) std::memmove(recv, send, recv_count * elem_bytes(type));
  return {};
}

Work SoloComm::start_all_gather(const void* send, void* recv, size_t send_count, ElemType type) {
  if (send != recv) std::memmove(recv, send, send_count * elem_bytes(type));
  return {};
}

Work SoloComm::start_broadcast(void*, size_t, ElemType, int) { return {}; }

Work SoloComm::start_all_to_all_v(const void* send, const size_t* send_counts, void* recv,
                                  const size_t* recv_counts, ElemType type) {
  TRIDENT_CHECK(send_counts[0] == recv_counts[0],
                "all_to_all on a one-rank communicator sends {} elements and receives {}",
                send_counts[0], recv_counts[0]);
  if (send != recv) std::memmove(recv, send, send_counts[0] * elem_bytes(type));
  return {};
}

Work SoloComm::start_send(const void*, size_t, ElemType, int dest, int) {
  internal_error(__FILE__, __LINE__,
                 fmt::format("send to rank {} on a one-rank communicator", dest));
}

Work SoloComm::start_recv(void*, size_t, ElemType, int src, int) {
  internal_error(__FILE__, __LINE__,
                 fmt::format("recv from rank {} on a one-rank communicator", src));
}

}  // namespace trident
