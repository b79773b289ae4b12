// The process grid: layout arithmetic (pure) and the communicators built from it.
#include "trident/grid.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "trident/check.h"

namespace trident {

GridLayout make_layout(int world, int dp, int tp, int pp) {
  if (world < 1) input_error("grid: world size must be at least 1, got {}", world);
  if (tp < 1) input_error("grid: tp must be at least 1, got {}", tp);
  if (pp < 1) input_error("grid: pp must be at least 1, got {}", pp);
  if (dp < 0) input_error("grid: dp must be at least 1 (or 0 to derive it), got {}", dp);
  const long long model = static_cast<long long>(tp) * pp;
  if (dp == 0) {
    if (world % model != 0)
      input_error("grid: world {} is not divisible by tp {} × pp {}", world, tp, pp);
    dp = static_cast<int>(world / model);
  } else if (static_cast<long long>(dp) * model != world) {
    input_error("grid: dp {} × tp {} × pp {} = {} but world is {}", dp, tp, pp,
                static_cast<long long>(dp) * model, world);
  }
  return GridLayout{world, dp, tp, pp};
}

GridCoord grid_coord(const GridLayout& layout, int global_rank) {
  TRIDENT_CHECK(global_rank >= 0 && global_rank < layout.world, "rank {} outside world {}",
                global_rank, layout.world);
  GridCoord c;
  c.tp = global_rank % layout.tp;
  c.dp = (global_rank / layout.tp) % layout.dp;
  c.pp = global_rank / (layout.tp * layout.dp);
  return c;
}

int global_rank_of(const GridLayout& layout, GridCoord c) {
  TRIDENT_CHECK(c.dp >= 0 && c.dp < layout.dp && c.tp >= 0 && c.tp < layout.tp && c.pp >= 0 &&
                    c.pp < layout.pp,
                "coordinate (dp {}, tp {}, pp {}) outside dp {} × tp {} × pp {}", c.dp, c.tp, c.pp,
                layout.dp, layout.tp, layout.pp);
  return c.tp + layout.tp * c.dp + layout.tp * layout.dp * c.pp;
}

const char* grid_group_name(GridGroup group) {
  switch (group) {
    case GridGroup::kDp: return "dp";
    case GridGroup::kTp: return "tp";
    case GridGroup::kPp: return "pp";
    case GridGroup::kModelParallel: return "model-parallel";
    case GridGroup::kEmbedding: return "embedding";
  }
  return "?";
}

std::vector<int> grid_group_members(const GridLayout& layout, GridGroup group, int global_rank) {
  const GridCoord c = grid_coord(layout, global_rank);
  std::vector<int> members;
  auto add = [&](int dp, int tp, int pp) {
    members.push_back(global_rank_of(layout, {dp, tp, pp}));
  };
  switch (group) {
    case GridGroup::kDp:
      for (int d = 0; d < layout.dp; ++d) add(d, c.tp, c.pp);
      break;
    case GridGroup::kTp:
      for (int t = 0; t < layout.tp; ++t) add(c.dp, t, c.pp);
      break;
    case GridGroup::kPp:
      for (int p = 0; p < layout.pp; ++p) add(c.dp, c.tp, p);
      break;
    case GridGroup::kModelParallel:  // pp outer, tp inner: ascending global ranks
      for (int p = 0; p < layout.pp; ++p)
        for (int t = 0; t < layout.tp; ++t) add(c.dp, t, p);
      break;
    case GridGroup::kEmbedding:
      if (layout.pp == 1) {
        members.push_back(global_rank);
      } else if (c.pp == 0 || c.pp == layout.pp - 1) {
        add(c.dp, c.tp, 0);
        add(c.dp, c.tp, layout.pp - 1);
      }
      break;
  }
  return members;
}

namespace {

std::string format_members(const std::vector<int>& members) {
  if (members.empty()) return "-";
  return fmt::format("[{}]", fmt::join(members, " "));
}

constexpr GridGroup kAllGroups[] = {GridGroup::kDp, GridGroup::kTp, GridGroup::kPp,
                                    GridGroup::kModelParallel, GridGroup::kEmbedding};

}  // namespace

std::string format_grid_table(const GridLayout& layout) {
  // Cells first, so each column can be as wide as its widest cell.
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"rank", "dp", "tp", "pp"});
  for (GridGroup g : kAllGroups) rows[0].push_back(fmt::format("{} group", grid_group_name(g)));
  for (int r = 0; r < layout.world; ++r) {
    const GridCoord c = grid_coord(layout, r);
    std::vector<std::string> row = {std::to_string(r), std::to_string(c.dp), std::to_string(c.tp),
                                    std::to_string(c.pp)};
    for (GridGroup g : kAllGroups) row.push_back(format_members(grid_group_members(layout, g, r)));
    rows.push_back(std::move(row));
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows)
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());

  std::string out = fmt::format(
      "world {} = dp {} × tp {} × pp {}   (global rank = tp_rank + {}·dp_rank + {}·pp_rank)\n",
      layout.world, layout.dp, layout.tp, layout.pp, layout.tp, layout.tp * layout.dp);
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      // Numbers right-aligned, member lists left-aligned.
      line +=
          i < 4 ? fmt::format("{:>{}}", row[i], width[i]) : fmt::format("{:<{}}", row[i], width[i]);
      if (i + 1 < row.size()) line += "  ";
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
    input_error("grid: the layout is for world {} (dp {} × tp {} × pp {}) but {} ranks are running",
                layout.world, layout.dp, layout.tp, layout.pp, world_size);
  layout_ = make_layout(layout.world, layout.dp, layout.tp, layout.pp);
  coord_ = grid_coord(layout_, world_rank_);

  world_ = MpiComm::duplicate(world, "world");
  auto members = [&](GridGroup g) { return grid_group_members(layout_, g, world_rank_); };
  dp_ = split(world, members(GridGroup::kDp), world_rank_, "dp");
  tp_ = split(world, members(GridGroup::kTp), world_rank_, "tp");
  pp_ = split(world, members(GridGroup::kPp), world_rank_, "pp");
  embedding_ = split(world, members(GridGroup::kEmbedding), world_rank_, "embedding");
  TRIDENT_CHECK(dp_->rank() == coord_.dp && tp_->rank() == coord_.tp && pp_->rank() == coord_.pp,
                "communicator ranks (dp {}, tp {}, pp {}) differ from the grid coordinates "
                "(dp {}, tp {}, pp {})",
                dp_->rank(), tp_->rank(), pp_->rank(), coord_.dp, coord_.tp, coord_.pp);
}

ProcessGrid::~ProcessGrid() = default;

MpiComm& ProcessGrid::embedding() {
  TRIDENT_CHECK(embedding_ != nullptr, "rank {} (pipeline stage {} of {}) is in no embedding group",
                world_rank_, coord_.pp, layout_.pp);
  return *embedding_;
}

void ProcessGrid::set_timeout(double seconds) {
  for (MpiComm* c : {world_.get(), dp_.get(), tp_.get(), pp_.get(), embedding_.get()})
    if (c) c->set_timeout(seconds);
}

}  // namespace trident
