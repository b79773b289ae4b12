// Grid layout arithmetic (no MPI): the worked 16-rank example of grid.h and the refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "trident/check.h"
#include "trident/grid.h"

namespace trident {
namespace {

std::string input_error_of(int world, int dp, int tp, int pp) {
  try {
    make_layout(world, dp, tp, pp);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    return e.what();
  }
  return "(no error)";
}

TEST(MakeLayout, DerivesDp) {
  const GridLayout l = make_layout(16, 0, 2, 2);
  EXPECT_EQ(l.world, 16);
  EXPECT_EQ(l.dp, 4);
  EXPECT_EQ(l.tp, 2);
  EXPECT_EQ(l.pp, 2);
  EXPECT_EQ(make_layout(1, 0, 1, 1).dp, 1);
  EXPECT_EQ(make_layout(8, 2, 2, 2).dp, 2);
}

TEST(MakeLayout, RefusesWithTheNumbers) {
  EXPECT_NE(input_error_of(6, 0, 4, 1).find("world 6 is not divisible by tp 4 × pp 1"),
            std::string::npos);
  EXPECT_NE(input_error_of(4, 3, 2, 1).find("dp 3 × tp 2 × pp 1 = 6 but world is 4"),
            std::string::npos);
  EXPECT_NE(input_error_of(4, 0, 0, 1).find("tp must be at least 1, got 0"), std::string::npos);
  EXPECT_NE(input_error_of(4, 0, 1, -2).find("pp must be at least 1, got -2"), std::string::npos);
  EXPECT_NE(input_error_of(4, -1, 1, 1).find("dp must be at least 1"), std::string::npos);
  EXPECT_NE(input_error_of(0, 0, 1, 1).find("world size must be at least 1"), std::string::npos);
}

TEST(GridCoord, WorkedExampleOf16Ranks) {
  const GridLayout l = make_layout(16, 4, 2, 2);
  EXPECT_EQ(grid_coord(l, 13), (GridCoord{2, 1, 1}));  // 13 = 1 + 2·2 + 8·1
  EXPECT_EQ(grid_coord(l, 0), (GridCoord{0, 0, 0}));
  EXPECT_EQ(grid_coord(l, 7), (GridCoord{3, 1, 0}));
  EXPECT_EQ(grid_coord(l, 8), (GridCoord{0, 0, 1}));
  EXPECT_EQ(global_rank_of(l, {2, 1, 1}), 13);
}

TEST(GridCoord, RoundTripsForEveryRankOfEveryLayout) {
  for (int world : {1, 2, 6, 8, 12, 16})
    for (int tp = 1; tp <= world; ++tp)
      for (int pp = 1; pp <= world; ++pp) {
        if (world % (tp * pp) != 0) continue;
        const GridLayout l = make_layout(world, 0, tp, pp);
        for (int r = 0; r < world; ++r) {
          const GridCoord c = grid_coord(l, r);
          EXPECT_EQ(c.tp + tp * c.dp + tp * l.dp * c.pp, r);
          EXPECT_EQ(global_rank_of(l, c), r);
        }
      }
}

TEST(GridGroups, WorkedExampleOf16Ranks) {
  const GridLayout l = make_layout(16, 4, 2, 2);
  using V = std::vector<int>;
  EXPECT_EQ(grid_group_members(l, GridGroup::kTp, 13), (V{12, 13}));
  EXPECT_EQ(grid_group_members(l, GridGroup::kDp, 13), (V{9, 11, 13, 15}));
  EXPECT_EQ(grid_group_members(l, GridGroup::kPp, 13), (V{5, 13}));
  EXPECT_EQ(grid_group_members(l, GridGroup::kModelParallel, 13), (V{4, 5, 12, 13}));
  EXPECT_EQ(grid_group_members(l, GridGroup::kEmbedding, 13), (V{5, 13}));
  EXPECT_EQ(grid_group_members(l, GridGroup::kDp, 0), (V{0, 2, 4, 6}));
  EXPECT_EQ(grid_group_members(l, GridGroup::kDp, 1), (V{1, 3, 5, 7}));
  EXPECT_EQ(grid_group_members(l, GridGroup::kDp, 8), (V{8, 10, 12, 14}));
  EXPECT_EQ(grid_group_members(l, GridGroup::kModelParallel, 0), (V{0, 1, 8, 9}));
  EXPECT_EQ(grid_group_members(l, GridGroup::kModelParallel, 6), (V{6, 7, 14, 15}));
  EXPECT_EQ(grid_group_members(l, GridGroup::kPp, 0), (V{0, 8}));
}

TEST(GridGroups, EmbeddingGroupIsFirstAndLastStage) {
  using V = std::vector<int>;
  const GridLayout l = make_layout(8, 1, 2, 4);  // stages: [0 1] [2 3] [4 5] [6 7]
  EXPECT_EQ(grid_group_members(l, GridGroup::kEmbedding, 0), (V{0, 6}));
  EXPECT_EQ(grid_group_members(l, GridGroup::kEmbedding, 7), (V{1, 7}));
  EXPECT_TRUE(grid_group_members(l, GridGroup::kEmbedding, 2).empty());  // middle stage
  EXPECT_TRUE(grid_group_members(l, GridGroup::kEmbedding, 5).empty());
  EXPECT_EQ(grid_group_members(l, GridGroup::kPp, 3), (V{1, 3, 5, 7}));
  const GridLayout flat = make_layout(4, 0, 2, 1);
  EXPECT_EQ(grid_group_members(flat, GridGroup::kEmbedding, 3), (V{3}));
}

// Each kind of group partitions the world (embedding: the first and last stages), every
// member sees the same list, and sizes are those of the axis.
TEST(GridGroups, PartitionTheWorld) {
  for (auto [world, tp, pp] : {std::tuple{16, 2, 2}, {12, 3, 2}, {8, 1, 8}, {8, 8, 1}, {6, 1, 1}}) {
    const GridLayout l = make_layout(world, 0, tp, pp);
    const std::pair<GridGroup, int> kinds[] = {{GridGroup::kDp, l.dp},
                                               {GridGroup::kTp, l.tp},
                                               {GridGroup::kPp, l.pp},
                                               {GridGroup::kModelParallel, l.tp * l.pp}};
    for (auto [group, size] : kinds) {
      std::set<int> covered;
      for (int r = 0; r < world; ++r) {
        const auto members = grid_group_members(l, group, r);
        ASSERT_EQ(static_cast<int>(members.size()), size) << grid_group_name(group);
        EXPECT_TRUE(std::is_sorted(members.begin(), members.end()));
        EXPECT_NE(std::find(members.begin(), members.end(), r), members.end());
        for (int m : members) EXPECT_EQ(grid_group_members(l, group, m), members);
        covered.insert(members.begin(), members.end());
      }
      EXPECT_EQ(static_cast<int>(covered.size()), world);
    }
  }
}

TEST(FormatGridTable, OneRowPerRankWithItsGroups) {
  const std::string table = format_grid_table(make_layout(16, 4, 2, 2));
  std::istringstream in(table);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 18u);  // title, header, 16 ranks
  EXPECT_NE(lines[0].find("world 16 = dp 4 × tp 2 × pp 2"), std::string::npos);
  EXPECT_NE(lines[1].find("model-parallel group"), std::string::npos);
  // Rank 13: (dp 2, tp 1, pp 1), dp [9 11 13 15], tp [12 13], pp [5 13], mp [4 5 12 13].
  std::istringstream row(lines[2 + 13]);
  std::vector<std::string> cells;
  for (std::string cell; row >> cell;) cells.push_back(cell);
  const std::vector<std::string> expected = {"13", "2",   "1",   "1",   "[9", "11",
                                             "13", "15]", "[12", "13]", "[5", "13]",
                                             "[4", "5",   "12",  "13]", "[5", "13]"};
  EXPECT_EQ(cells, expected) << table;
}

// The embedding-group cell of each rank's row: the text under the header's "embedding group"
// (member lists are left-aligned, so a cell starts where its header does).
std::vector<std::string> embedding_cells(const std::string& table) {
  std::istringstream in(table);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  if (lines.size() < 2) return {};
  const size_t column = lines[1].find("embedding group");
  if (column == std::string::npos) return {};
  std::vector<std::string> cells;
  for (size_t i = 2; i < lines.size(); ++i)
    cells.push_back(lines[i].size() > column ? lines[i].substr(column) : "");
  return cells;
}

TEST(FormatGridTable, OnlyFirstAndLastStageHaveAnEmbeddingGroup) {
  // pp 4: ranks 0..3 are stages 0..3; stages 0 and 3 share wte, stages 1 and 2 hold none.
  const std::string deep = format_grid_table(make_layout(4, 1, 1, 4));
  const std::vector<std::string> deep_expected = {"[0 3]", "-", "-", "[0 3]"};
  EXPECT_EQ(embedding_cells(deep), deep_expected) << deep;
  // dp 2 × pp 3: ranks 0,1 first stage, 2,3 middle, 4,5 last; each dp column its own group.
  const std::string wide = format_grid_table(make_layout(6, 2, 1, 3));
  const std::vector<std::string> wide_expected = {"[0 4]", "[1 5]", "-", "-", "[0 4]", "[1 5]"};
  EXPECT_EQ(embedding_cells(wide), wide_expected) << wide;
}

}  // namespace
}  // namespace trident
