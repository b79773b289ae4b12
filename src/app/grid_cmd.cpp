// `trident grid --world N [--dp D] [--dp-replicate R] [--dp-shard S] [--cp C] [--ep E [--zero Z]]
// --tp T --pp P`: who is who in the grid, without MPI.
#include <fmt/format.h>

#include "app/commands.h"
#include "trident/grid.h"

namespace trident {

int run_grid(const GridSizes& sizes, int ep, int zero) {
  const GridLayout layout = complete_layout(sizes);
  fmt::print("{}", format_grid_table(layout, ep, zero));
  return 0;
}

}  // namespace trident
