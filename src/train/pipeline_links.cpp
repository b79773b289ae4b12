// split_stage_links: the two-rank groups of Note [Stage transfers on a device].
#include "trident/check.h"
#include "trident/pipeline.h"

namespace trident {

std::vector<StageLinkGroup> split_stage_links(MPI_Comm pp) {
  int stages = 1, stage = 0;
  TRIDENT_MPI(MPI_Comm_size(pp, &stages));
  TRIDENT_MPI(MPI_Comm_rank(pp, &stage));
  std::vector<StageLinkGroup> links;
  if (stages == 1) return links;
  // Link s (forward) is stage s → s+1, link stages + s (backward) stage s → s−1, mod stages.
  // Every rank splits pp once per link, in link order; the sender gets rank 0 (key 0).
  for (int link = 0; link < 2 * stages; ++link) {
    const int dir = link < stages ? 0 : 1;
    const int from = link % stages;
    const int to = (from + (dir == 0 ? 1 : stages - 1)) % stages;
    const bool sending = stage == from, receiving = stage == to;
    MPI_Comm group = MPI_COMM_NULL;
    TRIDENT_MPI(
        MPI_Comm_split(pp, sending || receiving ? link : MPI_UNDEFINED, sending ? 0 : 1, &group));
    if (sending || receiving) links.push_back({group, dir, sending});
  }
  return links;
}

}  // namespace trident
