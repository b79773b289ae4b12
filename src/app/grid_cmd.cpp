// `trident grid --world N [--dp D] --tp T --pp P`: who is who in the grid, without MPI.
#include <fmt/format.h>

#include "app/commands.h"
#include "trident/grid.h"

namespace trident {

int run_grid(int world, int dp, int tp, int pp) {
  const GridLayout layout = make_layout(world, dp, tp, pp);
  fmt::print("{}", format_grid_table(layout));
  return 0;
}

}  // namespace trident
