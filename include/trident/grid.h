// The process grid (the "mpu"): every rank's place in a grid of named dimensions.
//
// A layout is an ordered list of named sizes, outermost first, tp fastest:
//
//     pp, dp_replicate, dp_shard, cp, tp
//
//     global = tp_rank + tp·(cp_rank + cp·(dp_shard_rank + dp_shard·(dp_replicate_rank
//                                                               + dp_replicate·pp_rank)))
//
// dp = dp_replicate × dp_shard, and a rank's dp coordinate is
// dp_replicate_rank·dp_shard + dp_shard_rank, so with cp = 1 this is the old
// global = tp_rank + tp·dp_rank + tp·dp·pp_rank for any split of dp (Note [Grid rank order]
// in src/comm/grid.cpp says why the dimensions come in this order). Worked example,
// world 16 = pp 2 × dp_replicate 2 × dp_shard 2 × tp 2 (cp 1):
//
//                  dp_replicate 0                     dp_replicate 1
//     pp 0:  dp_shard 0: [0 1]   dp_shard 1: [2 3]     dp_shard 0: [4 5]   dp_shard 1: [6 7]
//     pp 1:  dp_shard 0: [8 9]   dp_shard 1: [10 11]   dp_shard 0: [12 13] dp_shard 1: [14 15]
//     (each [..] is a TP group; dp = 2·dp_replicate + dp_shard runs 0 1 2 3 along a row)
//
//     tp (all else equal):            [0 1] [2 3] [4 5] ... [14 15]
//     dp_shard (same pp, dp_rep., tp): [0 2] [1 3] [4 6] [5 7] [8 10] [9 11] [12 14] [13 15]
//     dp_replicate (same pp,shard,tp): [0 4] [1 5] [2 6] [3 7] [8 12] [9 13] [10 14] [11 15]
//     dp = dp_replicate × dp_shard:    [0 2 4 6] [1 3 5 7] [8 10 12 14] [9 11 13 15]
//     pp (same dp, cp, tp):            [0 8] [1 9] [2 10] ... [7 15]
//     model-parallel (tp × pp):        [0 1 8 9] [2 3 10 11] [4 5 12 13] [6 7 14 15]
//     embedding (first+last stage):    [0 8] [1 9] ... [7 15]   (= pp here, since pp = 2)
//     cp, dp_cp, dp_shard_cp:          with cp = 1: the rank itself, dp and dp_shard
//
// e.g. rank 13 = tp 1 + 2·(dp_shard 0 + 2·(dp_replicate 1 + 2·pp 1)) → (pp 1, dp_replicate 1,
// dp_shard 0, tp 1), dp 2: the coordinates dp 4 × tp 2 × pp 2 gives it too. With 4 ranks per
// node, node 0 holds [0 1 2 3]: its dp_shard groups [0 2] [1 3] stay inside it, and only the
// dp_replicate groups [0 4] [1 5] ... cross to node 1.
//
// Groups are not stored dimension by dimension: a group is a set of dimensions, and its members
// are the ranks that share every coordinate outside the set (grid_span_members). Adding a
// dimension is a name in GridDim, its size and coordinate fields and a row in grid.cpp's table
// of dimensions; every group, communicator and table column follows from the sets.
//
// The layout arithmetic is pure (no MPI) so that `trident grid` can print it anywhere and the
// unit tests can check it; ProcessGrid builds the communicators from the same functions. The
// model-parallel group (the ranks that hold one replica) is printed, but has no communicator.
#pragma once

#include <mpi.h>

#include <array>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "trident/comm.h"

namespace trident {

// The dimensions, outermost first: the rank order is this order with the last one fastest.
enum class GridDim { kPp, kDpReplicate, kDpShard, kCp, kTp };
inline constexpr int kGridDimCount = 5;
inline constexpr std::array<GridDim, kGridDimCount> kGridDims = {
    GridDim::kPp, GridDim::kDpReplicate, GridDim::kDpShard, GridDim::kCp, GridDim::kTp};
const char* grid_dim_name(GridDim dim);

// A set of dimensions: what a group spans.
class GridDimSet {
 public:
  constexpr GridDimSet() = default;
  constexpr GridDimSet(std::initializer_list<GridDim> dims) {
    for (GridDim d : dims) bits_ |= 1u << static_cast<unsigned>(d);
  }
  constexpr bool contains(GridDim d) const { return (bits_ >> static_cast<unsigned>(d)) & 1u; }
  constexpr bool operator==(const GridDimSet&) const = default;

 private:
  unsigned bits_ = 0;
};

// A complete, checked layout (complete_layout or make_layout make one). dp is the derived
// dp_replicate × dp_shard, kept because most of the code base only needs "data parallel".
struct GridLayout {
  int world = 1, dp = 1, tp = 1, pp = 1;
  int dp_replicate = 1, dp_shard = 1, cp = 1;
};
int grid_dim_size(const GridLayout& layout, GridDim dim);

// The sizes a user gives (deck keys, `trident grid` flags); 0 means "derive".
struct GridSizes {
  int world = 1;
  int dp = 0;  // dp_replicate × dp_shard; 0: world / (tp·pp·cp)
  int tp = 1, pp = 1, cp = 1;
  int dp_replicate = 1;
  int dp_shard = 0;  // 0: dp / dp_replicate
};

// The one place a layout is completed and checked. A layout that does not fit is refused with
// input_error naming all the numbers (the same text on every rank).
GridLayout complete_layout(const GridSizes& sizes);
// The common case: dp_replicate 1, dp_shard dp, cp 1; dp 0 means world / (tp·pp).
GridLayout make_layout(int world, int dp, int tp, int pp);

// dp = dp_replicate·layout.dp_shard + dp_shard. global_rank_of reads dp (the flattened one)
// when dp_replicate and dp_shard are both 0, as in a coordinate written {dp, tp, pp}, and
// otherwise checks that they agree with it.
struct GridCoord {
  int dp = 0, tp = 0, pp = 0;
  int dp_replicate = 0, dp_shard = 0, cp = 0;
  bool operator==(const GridCoord&) const = default;
};
int grid_dim_coord(const GridCoord& coord, GridDim dim);

GridCoord grid_coord(const GridLayout& layout, int global_rank);
int global_rank_of(const GridLayout& layout, GridCoord coord);

// The ranks that share every coordinate of `global_rank` outside `dims`, in ascending global
// rank order, which is also their rank order inside a communicator split by it.
std::vector<int> grid_span_members(const GridLayout& layout, GridDimSet dims, int global_rank);
// The position of `coord` in its group spanned by `dims`: the coordinates inside `dims` as one
// mixed-radix number, outermost first (dp for {dp_replicate, dp_shard}; the coordinate itself
// for one dimension).
int grid_span_rank(const GridLayout& layout, GridDimSet dims, const GridCoord& coord);

// The named groups. kDpCp is the gradient-reduction group (cp ranks hold the same parameters);
// kDpShardCp is where ZeRO-3 units and later the expert groups fold.
enum class GridGroup {
  kDp,
  kTp,
  kPp,
  kModelParallel,
  kEmbedding,
  kDpReplicate,
  kDpShard,
  kCp,
  kDpCp,
  kDpShardCp,
};
inline constexpr int kGridGroupCount = 10;
inline constexpr std::array<GridGroup, kGridGroupCount> kGridGroups = {
    GridGroup::kDp,        GridGroup::kTp,          GridGroup::kPp,      GridGroup::kModelParallel,
    GridGroup::kEmbedding, GridGroup::kDpReplicate, GridGroup::kDpShard, GridGroup::kCp,
    GridGroup::kDpCp,      GridGroup::kDpShardCp};
const char* grid_group_name(GridGroup group);
GridDimSet grid_group_dims(GridGroup group);
// False for kModelParallel only: printed, but no part needs its communicator.
bool grid_group_has_communicator(GridGroup group);
// grid_span_members over grid_group_dims(group). kEmbedding: the pp group's first and last
// stage (just the rank itself when pp == 1); empty for a rank on a middle stage, which is in
// no embedding group.
std::vector<int> grid_group_members(const GridLayout& layout, GridGroup group, int global_rank);

// Two header lines (sizes, the rank formula), then one row per rank: global rank, its
// coordinates and the members of each of its groups; dimensions and groups that are the same
// as another column for this layout (dp_shard when dp_replicate = 1, cp when cp = 1) are left
// out.
// ep > 1 adds the expert groups (Note [Expert parallelism] in src/model/moe.h): ep consecutive
// members of each dp_cp group, and the expert-data-parallel replicas, ep apart; input_error
// when ep does not divide dp × cp. With ZeRO (`zero` > 0) and dp_replicate > 1 the expert-dp
// group is taken within the replica's dp_shard × cp, which ep must divide, as the trainer
// splits it (Note [Experts with HSDP] in src/train/zero3.h).
std::string format_grid_table(const GridLayout& layout, int ep = 1, int zero = 0);
// True where the experts' shards stay within a replica: ZeRO with dp_replicate > 1.
bool grid_experts_within_replica(const GridLayout& layout, int zero);
// The expert group (`replicas` false) or expert-data-parallel group (true) of `global_rank`,
// for ZeRO stage `zero`.
std::vector<int> grid_expert_members(const GridLayout& layout, int ep, int global_rank,
                                     bool replicas, int zero = 0);

// The communicators of one rank. Built collectively (every rank of `world` must construct
// it with the same layout); owns its communicators and frees them on destruction.
// No globals: pass the grid (or the communicator a part needs) explicitly.
class ProcessGrid {
 public:
  // layout.world must equal the size of `world` (input_error otherwise); the layout is checked
  // again (complete_layout) before any communicator is split.
  explicit ProcessGrid(const GridLayout& layout, MPI_Comm world = MPI_COMM_WORLD);
  ProcessGrid(const ProcessGrid&) = delete;
  ProcessGrid& operator=(const ProcessGrid&) = delete;
  ~ProcessGrid();

  const GridLayout& layout() const { return layout_; }
  GridCoord coord() const { return coord_; }
  int world_rank() const { return world_rank_; }
  int world_size() const { return layout_.world; }

  MpiComm& world() { return *world_; }
  // A named group's communicator; TRIDENT_CHECK if it has none (kModelParallel, or kEmbedding
  // on a middle stage).
  MpiComm& group(GridGroup g);
  bool has_group(GridGroup g) const;

  MpiComm& dp() { return group(GridGroup::kDp); }
  MpiComm& tp() { return group(GridGroup::kTp); }
  MpiComm& pp() { return group(GridGroup::kPp); }
  MpiComm& dp_replicate() { return group(GridGroup::kDpReplicate); }
  MpiComm& dp_shard() { return group(GridGroup::kDpShard); }
  MpiComm& cp() { return group(GridGroup::kCp); }
  MpiComm& dp_cp() { return group(GridGroup::kDpCp); }
  MpiComm& dp_shard_cp() { return group(GridGroup::kDpShardCp); }
  // Where gradients reduce and shard: over dp × cp (cp ranks hold the same parameters), which
  // with cp = 1 are dp's and dp_shard's own communicators, names and all.
  MpiComm& gradients() { return layout_.cp == 1 ? dp() : dp_cp(); }
  MpiComm& gradient_shards() { return layout_.cp == 1 ? dp_shard() : dp_shard_cp(); }
  // Only ranks on the first or last stage have one (TRIDENT_CHECK otherwise).
  bool in_embedding_group() const { return has_group(GridGroup::kEmbedding); }
  MpiComm& embedding() { return group(GridGroup::kEmbedding); }
  const MpiComm& dp() const { return *groups_[int(GridGroup::kDp)]; }
  const MpiComm& tp() const { return *groups_[int(GridGroup::kTp)]; }
  const MpiComm& pp() const { return *groups_[int(GridGroup::kPp)]; }

  bool is_first_stage() const { return coord_.pp == 0; }
  bool is_last_stage() const { return coord_.pp == layout_.pp - 1; }

  // Applies to every communicator of the grid (see MpiComm::set_timeout).
  void set_timeout(double seconds);

 private:
  GridLayout layout_;
  GridCoord coord_;
  int world_rank_ = 0;
  std::unique_ptr<MpiComm> world_;
  std::array<std::unique_ptr<MpiComm>, kGridGroupCount> groups_;  // indexed by GridGroup
};

}  // namespace trident
