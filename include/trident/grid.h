// The process grid (the "mpu"): every rank's place in a data × tensor × pipeline grid.
//
// world = dp × tp × pp, and the rank order is
//
//     global = tp_rank + tp·dp_rank + tp·dp·pp_rank        (tp fastest, then dp, then pp)
//
// so the ranks of one TP group are neighbours (inside a node) and pipeline traffic crosses
// nodes. Worked example, world 16 = dp 4 × tp 2 × pp 2:
//
//     pp stage 0:  dp 0: [0 1]   dp 1: [2 3]   dp 2: [4 5]   dp 3: [6 7]       (each [..] is a
//     pp stage 1:  dp 0: [8 9]   dp 1: [10 11] dp 2: [12 13] dp 3: [14 15]      TP group)
//
//     DP groups (same tp, pp):      [0 2 4 6] [1 3 5 7] [8 10 12 14] [9 11 13 15]
//     PP groups (same dp, tp):      [0 8] [1 9] [2 10] [3 11] [4 12] [5 13] [6 14] [7 15]
//     model-parallel (same dp):     [0 1 8 9] [2 3 10 11] [4 5 12 13] [6 7 14 15]
//     embedding (first+last stage): [0 8] [1 9] ... [7 15]  (same as PP here since pp = 2)
//
// e.g. rank 13 = tp 1 + 2·dp 2 + 8·pp 1 → (dp 2, tp 1, pp 1).
//
// The layout arithmetic is pure (no MPI) so that `trident grid` can print it anywhere and the
// unit tests can check it; ProcessGrid builds the communicators from the same functions. The
// model-parallel group (the ranks that hold one replica) is printed, but has no communicator.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "trident/comm.h"

namespace trident {

struct GridLayout {
  int world = 1, dp = 1, tp = 1, pp = 1;
};

// Checks and completes a layout: dp = 0 means "derive dp = world / (tp·pp)". A layout that
// does not fit is refused with input_error, naming the numbers (the same text on every rank).
GridLayout make_layout(int world, int dp, int tp, int pp);

struct GridCoord {
  int dp = 0, tp = 0, pp = 0;
  bool operator==(const GridCoord&) const = default;
};

GridCoord grid_coord(const GridLayout& layout, int global_rank);
int global_rank_of(const GridLayout& layout, GridCoord coord);

// The groups a rank belongs to. Members are global ranks in ascending order, which is also
// their rank order inside the communicator (so dp().rank() == coord.dp, and so on).
enum class GridGroup { kDp, kTp, kPp, kModelParallel, kEmbedding };
const char* grid_group_name(GridGroup group);
// kEmbedding: the first and last pipeline stage with the rank's dp and tp coordinates (just
// the rank itself when pp == 1); empty for a rank on a middle stage, which is in no
// embedding group.
std::vector<int> grid_group_members(const GridLayout& layout, GridGroup group, int global_rank);

// One row per rank: global rank, (dp, tp, pp) and the members of each of its groups.
std::string format_grid_table(const GridLayout& layout);

// The communicators of one rank. Built collectively (every rank of `world` must construct
// it with the same layout); owns its communicators and frees them on destruction.
// No globals: pass the grid (or the communicator a part needs) explicitly.
class ProcessGrid {
 public:
  // layout.world must equal the size of `world` (input_error otherwise).
  explicit ProcessGrid(const GridLayout& layout, MPI_Comm world = MPI_COMM_WORLD);
  ProcessGrid(const ProcessGrid&) = delete;
  ProcessGrid& operator=(const ProcessGrid&) = delete;
  ~ProcessGrid();

  const GridLayout& layout() const { return layout_; }
  GridCoord coord() const { return coord_; }
  int world_rank() const { return world_rank_; }
  int world_size() const { return layout_.world; }

  MpiComm& world() { return *world_; }
  MpiComm& dp() { return *dp_; }
  MpiComm& tp() { return *tp_; }
  MpiComm& pp() { return *pp_; }
  // Only ranks on the first or last stage have one (TRIDENT_CHECK otherwise).
  bool in_embedding_group() const { return embedding_ != nullptr; }
  MpiComm& embedding();
  const MpiComm& dp() const { return *dp_; }
  const MpiComm& tp() const { return *tp_; }
  const MpiComm& pp() const { return *pp_; }

  bool is_first_stage() const { return coord_.pp == 0; }
  bool is_last_stage() const { return coord_.pp == layout_.pp - 1; }

  // Applies to every communicator of the grid (see MpiComm::set_timeout).
  void set_timeout(double seconds);

 private:
  GridLayout layout_;
  GridCoord coord_;
  int world_rank_ = 0;
  std::unique_ptr<MpiComm> world_, dp_, tp_, pp_, embedding_;
};

}  // namespace trident
