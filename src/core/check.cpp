#include "trident/check.h"

#include <mpi.h>

namespace trident {

// The rank goes into the message so a failure in a many-rank log can be traced to its source.
void internal_error(const char* file, int line, const std::string& what) {
  int initialized = 0, finalized = 0, rank = -1;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string where = rank >= 0 ? fmt::format("{}:{} (rank {})", file, line, rank)
                                : fmt::format("{}:{}", file, line);
  throw Error(where + ": " + what, ExitCode::kInternal);
}

}  // namespace trident
