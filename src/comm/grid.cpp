// The process grid: layout arithmetic over named dimensions (pure) and the communicators built
// from it.
#include "trident/grid.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "trident/check.h"

namespace trident {

// Note [Grid rank order]
// Outermost first: pp, dp_replicate, dp_shard, cp, tp. Neighbouring ranks share a node, so the
// most talkative group is innermost: tp (collectives in every layer) on a node's fast links; cp
// next (attention's exchanges every layer; between dp and tp as Megatron and torchtitan place
// it); dp_shard inside dp_replicate, so HSDP's shard group (ZeRO-3's per-unit gathers) stays in a
// node and only the replica all-reduce, once per step, crosses nodes; pp outermost (one
// activation per micro-batch, point to point). With cp = 1 and dp_replicate = 1 this is the
// old order tp, dp, pp: every rank number, coordinate and group stays what it was.

namespace {

// Adding a dimension: a GridDim, its fields and a row here (in kGridDims order).
struct DimFields {
  GridDim dim;
  const char* name;
  int GridLayout::*size;
  int GridCoord::*coord;
};
constexpr DimFields kDimFields[kGridDimCount] = {
    {GridDim::kPp, "pp", &GridLayout::pp, &GridCoord::pp},
    {GridDim::kDpReplicate, "dp_replicate", &GridLayout::dp_replicate, &GridCoord::dp_replicate},
    {GridDim::kDpShard, "dp_shard", &GridLayout::dp_shard, &GridCoord::dp_shard},
    {GridDim::kCp, "cp", &GridLayout::cp, &GridCoord::cp},
    {GridDim::kTp, "tp", &GridLayout::tp, &GridCoord::tp},
};

constexpr bool dims_in_order() {
  for (int i = 0; i < kGridDimCount; ++i)
    if (kGridDims[i] != GridDim(i) || kDimFields[i].dim != GridDim(i)) return false;
  return true;
}
static_assert(dims_in_order(), "GridDim values are the positions in kGridDims and kDimFields");

struct GroupSpec {
  GridGroup group;
  const char* name;
  GridDimSet dims;
  bool communicator;
};
using D = GridDim;
constexpr GroupSpec kGroupSpecs[kGridGroupCount] = {
    {GridGroup::kDp, "dp", {D::kDpReplicate, D::kDpShard}, true},
    {GridGroup::kTp, "tp", {D::kTp}, true},
    {GridGroup::kPp, "pp", {D::kPp}, true},
    {GridGroup::kModelParallel, "model-parallel", {D::kTp, D::kPp}, false},
    {GridGroup::kEmbedding, "embedding", {D::kPp}, true},  // first and last stage only
    {GridGroup::kDpReplicate, "dp_replicate", {D::kDpReplicate}, true},
    {GridGroup::kDpShard, "dp_shard", {D::kDpShard}, true},
    {GridGroup::kCp, "cp", {D::kCp}, true},
    {GridGroup::kDpCp, "dp_cp", {D::kDpReplicate, D::kDpShard, D::kCp}, true},
    {GridGroup::kDpShardCp, "dp_shard_cp", {D::kDpShard, D::kCp}, true},
};

constexpr bool groups_in_order() {
  for (int i = 0; i < kGridGroupCount; ++i)
    if (kGridGroups[i] != GridGroup(i) || kGroupSpecs[i].group != GridGroup(i)) return false;
  return true;
}
static_assert(groups_in_order(), "GridGroup values are the positions in kGridGroups");

// A rank's coordinates, one per dimension in kGridDims order.
using Coords = std::array<int, kGridDimCount>;

Coords sizes_of(const GridLayout& layout) {
  Coords s{};
  for (int i = 0; i < kGridDimCount; ++i) s[i] = layout.*kDimFields[i].size;
  return s;
}

int rank_of(const Coords& sizes, const Coords& c) {
  int r = 0;
  for (int i = 0; i < kGridDimCount; ++i) r = r * sizes[i] + c[i];
  return r;
}

Coords coords_of(const GridLayout& layout, GridCoord c) {
  if (c.dp_replicate == 0 && c.dp_shard == 0) {  // written {dp, tp, pp}: split the flat dp
    c.dp_replicate = c.dp / layout.dp_shard;
    c.dp_shard = c.dp % layout.dp_shard;
  }
  TRIDENT_CHECK(c.dp == c.dp_replicate * layout.dp_shard + c.dp_shard,
                "coordinate dp {} is not dp_replicate {} · dp_shard size {} + dp_shard {}", c.dp,
                c.dp_replicate, layout.dp_shard, c.dp_shard);
  const Coords sizes = sizes_of(layout);
  Coords out{};
  for (int i = 0; i < kGridDimCount; ++i) {
    out[i] = c.*kDimFields[i].coord;
    TRIDENT_CHECK(out[i] >= 0 && out[i] < sizes[i], "coordinate {} {} outside its size {}",
                  kDimFields[i].name, out[i], sizes[i]);
  }
  return out;
}

GridCoord coord_from(const GridLayout& layout, const Coords& c) {
  GridCoord out;
  for (int i = 0; i < kGridDimCount; ++i) out.*kDimFields[i].coord = c[i];
  out.dp = out.dp_replicate * layout.dp_shard + out.dp_shard;
  return out;
}

}  // namespace

const char* grid_dim_name(GridDim dim) { return kDimFields[int(dim)].name; }
int grid_dim_size(const GridLayout& layout, GridDim dim) {
  return layout.*kDimFields[int(dim)].size;
}
int grid_dim_coord(const GridCoord& coord, GridDim dim) {
  return coord.*kDimFields[int(dim)].coord;
}

GridLayout complete_layout(const GridSizes& s) {
  if (s.world < 1) input_error("grid: world size must be at least 1, got {}", s.world);
  if (s.tp < 1) input_error("grid: tp must be at least 1, got {}", s.tp);
  if (s.pp < 1) input_error("grid: pp must be at least 1, got {}", s.pp);
  if (s.cp < 1) input_error("grid: cp must be at least 1, got {}", s.cp);
  if (s.dp < 0) input_error("grid: dp must be at least 1 (or 0 to derive it), got {}", s.dp);
  if (s.dp_replicate < 1)
    input_error("grid: dp_replicate must be at least 1, got {}", s.dp_replicate);
  if (s.dp_shard < 0)
    input_error("grid: dp_shard must be at least 1 (or 0 to derive it), got {}", s.dp_shard);
  const long long model = static_cast<long long>(s.tp) * s.pp * s.cp;
  const std::string cp_text = s.cp == 1 ? "" : fmt::format(" × cp {}", s.cp);
  long long dp = s.dp;
  if (dp == 0 && s.dp_shard > 0) {
    dp = static_cast<long long>(s.dp_replicate) * s.dp_shard;
  } else if (dp == 0) {
    if (s.world % model != 0)
      input_error("grid: world {} is not divisible by tp {} × pp {}{}", s.world, s.tp, s.pp,
                  cp_text);
    dp = s.world / model;
  }
  long long dp_shard = s.dp_shard;
  if (dp_shard == 0) {
    if (dp % s.dp_replicate != 0)
      input_error("grid: dp {} is not divisible by dp_replicate {} (world {}, tp {}, pp {}, cp {})",
                  dp, s.dp_replicate, s.world, s.tp, s.pp, s.cp);
    dp_shard = dp / s.dp_replicate;
  } else if (s.dp_replicate * dp_shard != dp) {
    input_error("grid: dp_replicate {} × dp_shard {} = {} but dp is {}", s.dp_replicate, dp_shard,
                s.dp_replicate * dp_shard, dp);
  }
  if (dp * model != s.world)
    input_error("grid: dp {} × tp {} × pp {}{} = {} but world is {} (dp = dp_replicate {} × "
                "dp_shard {})",
                dp, s.tp, s.pp, cp_text, dp * model, s.world, s.dp_replicate, dp_shard);
  GridLayout l;
  l.world = s.world;
  l.dp = static_cast<int>(dp);
  l.tp = s.tp;
  l.pp = s.pp;
  l.dp_replicate = s.dp_replicate;
  l.dp_shard = static_cast<int>(dp_shard);
  l.cp = s.cp;
  return l;
}

GridLayout make_layout(int world, int dp, int tp, int pp) {
  GridSizes s;
  s.world = world;
  s.dp = dp;
  s.tp = tp;
  s.pp = pp;
  return complete_layout(s);
}

GridCoord grid_coord(const GridLayout& layout, int global_rank) {
  TRIDENT_CHECK(global_rank >= 0 && global_rank < layout.world, "rank {} outside world {}",
                global_rank, layout.world);
  const Coords sizes = sizes_of(layout);
  Coords c{};
  int rest = global_rank;
  for (int i = kGridDimCount - 1; i >= 0; --i) {  // tp, the last dimension, varies fastest
    c[i] = rest % sizes[i];
    rest /= sizes[i];
  }
  return coord_from(layout, c);
}

int global_rank_of(const GridLayout& layout, GridCoord coord) {
  return rank_of(sizes_of(layout), coords_of(layout, coord));
}

std::vector<int> grid_span_members(const GridLayout& layout, GridDimSet dims, int global_rank) {
  const Coords sizes = sizes_of(layout);
  Coords c = coords_of(layout, grid_coord(layout, global_rank));
  for (int i = 0; i < kGridDimCount; ++i)
    if (dims.contains(GridDim(i))) c[i] = 0;
  // Count through the spanned coordinates, the last dimension fastest: the coordinates outside
  // `dims` are fixed, so the global ranks come out ascending.
  std::vector<int> members;
  for (;;) {
    members.push_back(rank_of(sizes, c));
    int i = kGridDimCount - 1;
    for (; i >= 0; --i) {
      if (!dims.contains(GridDim(i))) continue;
      if (++c[i] < sizes[i]) break;
      c[i] = 0;
    }
    if (i < 0) return members;
  }
}

int grid_span_rank(const GridLayout& layout, GridDimSet dims, const GridCoord& coord) {
  const Coords sizes = sizes_of(layout), c = coords_of(layout, coord);
  int r = 0;
  for (int i = 0; i < kGridDimCount; ++i)
    if (dims.contains(GridDim(i))) r = r * sizes[i] + c[i];
  return r;
}

const char* grid_group_name(GridGroup group) { return kGroupSpecs[int(group)].name; }
GridDimSet grid_group_dims(GridGroup group) { return kGroupSpecs[int(group)].dims; }
bool grid_group_has_communicator(GridGroup group) { return kGroupSpecs[int(group)].communicator; }

std::vector<int> grid_group_members(const GridLayout& layout, GridGroup group, int global_rank) {
  std::vector<int> members = grid_span_members(layout, grid_group_dims(group), global_rank);
  if (group != GridGroup::kEmbedding) return members;
  // The tied embedding lives on the first and last stage: the pp group's ends, and nothing for
  // a middle stage.
  const int stage = grid_coord(layout, global_rank).pp;
  if (stage != 0 && stage != layout.pp - 1) return {};
  if (members.size() > 2) members = {members.front(), members.back()};
  return members;
}

namespace {

std::string format_members(const std::vector<int>& members) {
  if (members.empty()) return "-";
  return fmt::format("[{}]", fmt::join(members, " "));
}

struct Column {
  std::string header;
  std::vector<std::string> cells;  // one per rank
};

// Today's dp × tp × pp columns are always printed; another dimension or group only when it says
// something new for this layout: not the same cell on every rank (coordinate 0, the rank alone),
// and not a copy of an earlier column (dp_shard is dp when dp_replicate = 1, dp_cp is dp when
// cp = 1).
bool adds_a_column(const std::vector<Column>& shown, const std::vector<std::string>& cells,
                   const std::vector<std::string>& trivial) {
  if (cells == trivial) return false;
  return std::none_of(shown.begin(), shown.end(),
                      [&](const Column& c) { return c.cells == cells; });
}

std::string rank_formula(const GridLayout& layout) {
  // tp_rank + tp·(cp_rank + cp·(... + dp_replicate·pp_rank)), built from the outside in.
  std::string f = fmt::format("{}_rank", kDimFields[0].name);
  for (int i = 1; i < kGridDimCount; ++i)
    f = fmt::format("{}_rank + {}·{}", kDimFields[i].name, layout.*kDimFields[i].size,
                    i == 1 ? f : "(" + f + ")");
  return f;
}

}  // namespace

bool grid_experts_within_replica(const GridLayout& layout, int zero) {
  return zero > 0 && layout.dp_replicate > 1;
}

std::vector<int> grid_expert_members(const GridLayout& layout, int ep, int global_rank,
                                     bool replicas, int zero) {
  // Note [Experts with HSDP]: the replicas of an expert shard are taken within the shard group.
  const GridGroup over = replicas && grid_experts_within_replica(layout, zero)
                             ? GridGroup::kDpShardCp
                             : GridGroup::kDpCp;
  const std::vector<int> group = grid_group_members(layout, over, global_rank);
  const int i = int(std::find(group.begin(), group.end(), global_rank) - group.begin());
  std::vector<int> out;
  for (int j = 0; j < int(group.size()); ++j)
    if (replicas ? j % ep == i % ep : j / ep == i / ep) out.push_back(group[size_t(j)]);
  return out;
}

std::string format_grid_table(const GridLayout& layout, int ep, int zero) {
  if (ep < 1 || (layout.dp * layout.cp) % ep != 0)
    input_error("--ep {} must divide dp × cp = {} (expert groups fold over dp × cp)", ep,
                layout.dp * layout.cp);
  const bool within = grid_experts_within_replica(layout, zero);
  if (within && (layout.dp_shard * layout.cp) % ep != 0)
    input_error("--ep {} with --zero {} and --dp-replicate {} must divide dp_shard × cp = {} "
                "(the experts are sharded within a replica)",
                ep, zero, layout.dp_replicate, layout.dp_shard * layout.cp);
  // Columns first, so that each can be left out when it repeats another and be as wide as its
  // widest cell. Coordinates are right-aligned, member lists left-aligned.
  std::vector<GridCoord> coords;
  std::vector<std::string> zeros, alone;
  for (int r = 0; r < layout.world; ++r) {
    coords.push_back(grid_coord(layout, r));
    zeros.push_back("0");
    alone.push_back(fmt::format("[{}]", r));
  }
  auto coordinate = [&](const std::string& name, auto value) {
    Column col{name, {}};
    for (const GridCoord& c : coords) col.cells.push_back(std::to_string(value(c)));
    return col;
  };
  std::vector<Column> numbers = {
      coordinate("rank", [&](const GridCoord& c) { return global_rank_of(layout, c); }),
      coordinate("dp", [](const GridCoord& c) { return c.dp; }),
      coordinate("tp", [](const GridCoord& c) { return c.tp; }),
      coordinate("pp", [](const GridCoord& c) { return c.pp; })};
  for (GridDim d : kGridDims) {
    Column col =
        coordinate(grid_dim_name(d), [d](const GridCoord& c) { return grid_dim_coord(c, d); });
    if (adds_a_column(numbers, col.cells, zeros)) numbers.push_back(std::move(col));
  }
  std::vector<Column> groups;
  for (GridGroup g : kGridGroups) {
    Column col{fmt::format("{} group", grid_group_name(g)), {}};
    for (int r = 0; r < layout.world; ++r)
      col.cells.push_back(format_members(grid_group_members(layout, g, r)));
    const bool todays = int(g) <= int(GridGroup::kEmbedding);  // dp tp pp model-parallel embedding
    if (todays || adds_a_column(groups, col.cells, alone)) groups.push_back(std::move(col));
  }
  for (const bool replicas : {false, true}) {
    if (ep == 1) break;
    Column col{replicas ? "expert_dp group" : "ep group", {}};
    for (int r = 0; r < layout.world; ++r)
      col.cells.push_back(format_members(grid_expert_members(layout, ep, r, replicas, zero)));
    groups.push_back(std::move(col));
  }

  std::string out = fmt::format(
      "world {} = pp {} × dp_replicate {} × dp_shard {} × cp {} × tp {}   (dp {} = dp_replicate "
      "× dp_shard)\n",
      layout.world, layout.pp, layout.dp_replicate, layout.dp_shard, layout.cp, layout.tp,
      layout.dp);
  out += fmt::format("global rank = {};  dp_rank = {}·dp_replicate_rank + dp_shard_rank\n",
                     rank_formula(layout), layout.dp_shard);
  if (ep > 1 && !within)
    out += fmt::format("ep {}: consecutive ranks of each dp_cp group hold experts/ep each; "
                       "expert_dp {} = dp × cp / ep replicas, ep apart\n",
                       ep, layout.dp * layout.cp / ep);
  if (ep > 1 && within)
    out += fmt::format("ep {}: consecutive ranks of each dp_cp group hold experts/ep each; "
                       "expert_dp {} = dp_shard × cp / ep ranks of a replica, ep apart, shard "
                       "them (ZeRO {}); the shards are all-reduced over the {} replicas\n",
                       ep, layout.dp_shard * layout.cp / ep, zero, layout.dp_replicate);
  std::vector<const Column*> all;
  for (const Column& c : numbers) all.push_back(&c);
  for (const Column& c : groups) all.push_back(&c);
  std::vector<size_t> width;
  for (const Column* c : all) {
    size_t w = c->header.size();
    for (const auto& cell : c->cells) w = std::max(w, cell.size());
    width.push_back(w);
  }
  for (int row = -1; row < layout.world; ++row) {  // -1: the header
    std::string line;
    for (size_t i = 0; i < all.size(); ++i) {
      const std::string& cell = row < 0 ? all[i]->header : all[i]->cells[row];
      line += i < numbers.size() ? fmt::format("{:>{}}", cell, width[i])
                                 : fmt::format("{:<{}}", cell, width[i]);
      if (i + 1 < all.size()) line += "  ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

// ---------------------------------------------------------------------------------------------

namespace {

// Every rank calls this for every group, in the same order (MPI_Comm_split is collective over
// `world`). The colour is the group's smallest global rank, the key the global rank, so the
// rank inside the new communicator is the position in grid_group_members.
std::unique_ptr<MpiComm> split(MPI_Comm world, const std::vector<int>& members, int global_rank,
                               const std::string& name) {
  const int color = members.empty() ? MPI_UNDEFINED : members.front();
  MPI_Comm comm = MPI_COMM_NULL;
  TRIDENT_MPI(MPI_Comm_split(world, color, global_rank, &comm));
  if (comm == MPI_COMM_NULL) return nullptr;
  return std::make_unique<MpiComm>(comm, name);
}

}  // namespace

ProcessGrid::ProcessGrid(const GridLayout& layout, MPI_Comm world) {
  int world_size = 0;
  TRIDENT_MPI(MPI_Comm_size(world, &world_size));
  TRIDENT_MPI(MPI_Comm_rank(world, &world_rank_));
  if (layout.world != world_size)
    input_error("grid: the layout is for world {} (dp {} × tp {} × pp {} × cp {}) but {} ranks "
                "are running",
                layout.world, layout.dp, layout.tp, layout.pp, layout.cp, world_size);
  GridSizes sizes;
  sizes.world = layout.world;
  sizes.dp = layout.dp;
  sizes.tp = layout.tp;
  sizes.pp = layout.pp;
  sizes.cp = layout.cp;
  sizes.dp_replicate = layout.dp_replicate;
  sizes.dp_shard = layout.dp_shard;
  layout_ = complete_layout(sizes);
  coord_ = grid_coord(layout_, world_rank_);

  world_ = MpiComm::duplicate(world, "world");
  for (GridGroup g : kGridGroups) {  // the same order on every rank
    if (!grid_group_has_communicator(g)) continue;
    const std::vector<int> members = grid_group_members(layout_, g, world_rank_);
    auto& comm = groups_[int(g)];
    comm = split(world, members, world_rank_, grid_group_name(g));
    if (!comm) continue;
    // The rank inside a group is the rank's coordinate in it (dp().rank() == coord().dp, ...):
    // parts index shards and stages by it.
    const int expected =
        g == GridGroup::kEmbedding
            ? int(std::find(members.begin(), members.end(), world_rank_) - members.begin())
            : grid_span_rank(layout_, grid_group_dims(g), coord_);
    TRIDENT_CHECK(comm->rank() == expected && comm->size() == int(members.size()),
                  "communicator {}: rank {} of {}, but the grid says rank {} of {}",
                  grid_group_name(g), comm->rank(), comm->size(), expected, members.size());
  }
}

ProcessGrid::~ProcessGrid() = default;

bool ProcessGrid::has_group(GridGroup g) const { return groups_[int(g)] != nullptr; }

MpiComm& ProcessGrid::group(GridGroup g) {
  if (g == GridGroup::kEmbedding)
    TRIDENT_CHECK(groups_[int(g)] != nullptr,
                  "rank {} (pipeline stage {} of {}) is in no embedding group", world_rank_,
                  coord_.pp, layout_.pp);
  TRIDENT_CHECK(groups_[int(g)] != nullptr, "the grid builds no communicator for group {}",
                grid_group_name(g));
  return *groups_[int(g)];
}

void ProcessGrid::set_timeout(double seconds) {
  world_->set_timeout(seconds);
  for (auto& c : groups_)
    if (c) c->set_timeout(seconds);
}

}  // namespace trident
