// Grid layout arithmetic (no MPI): the worked 16-rank examples of grid.h, the named groups, the
// refusals, and that cp = 1 keeps every rank, coordinate and group of the old dp × tp × pp grid.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "trident/check.h"
#include "trident/grid.h"

namespace trident {
namespace {

using V = std::vector<int>;

GridSizes sizes_of(int world, int pp, int dp_replicate, int dp_shard, int cp, int tp) {
  GridSizes s;
  s.world = world;
  s.pp = pp;
  s.dp_replicate = dp_replicate;
  s.dp_shard = dp_shard;
  s.cp = cp;
  s.tp = tp;
  return s;
}

std::string input_error_of(const GridSizes& s) {
  try {
    complete_layout(s);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    return e.what();
  }
  return "(no error)";
}

std::string input_error_of(int world, int dp, int tp, int pp) {
  GridSizes s;
  s.world = world;
  s.dp = dp;
  s.tp = tp;
  s.pp = pp;
  return input_error_of(s);
}

// Every layout of `world` over the five dimensions (all ordered factorisations).
std::vector<GridLayout> every_layout(int world) {
  std::vector<GridLayout> out;
  for (int pp = 1; pp <= world; ++pp)
    for (int rep = 1; rep <= world; ++rep)
      for (int shard = 1; shard <= world; ++shard)
        for (int cp = 1; cp <= world; ++cp) {
          const long long outer = 1LL * pp * rep * shard * cp;
          if (world % outer != 0) continue;
          out.push_back(complete_layout(sizes_of(world, pp, rep, shard, cp, world / outer)));
        }
  return out;
}

TEST(MakeLayout, DerivesDp) {
  const GridLayout l = make_layout(16, 0, 2, 2);
  EXPECT_EQ(l.world, 16);
  EXPECT_EQ(l.dp, 4);
  EXPECT_EQ(l.tp, 2);
  EXPECT_EQ(l.pp, 2);
  EXPECT_EQ(l.dp_replicate, 1);
  EXPECT_EQ(l.dp_shard, 4);
  EXPECT_EQ(l.cp, 1);
  EXPECT_EQ(make_layout(1, 0, 1, 1).dp, 1);
  EXPECT_EQ(make_layout(8, 2, 2, 2).dp, 2);
}

TEST(CompleteLayout, DerivesDpAndDpShard) {
  // dp 0, dp_shard 0: dp from the world, dp_shard = dp / dp_replicate.
  GridLayout l = complete_layout(sizes_of(32, 2, 2, 0, 2, 2));
  EXPECT_EQ(l.dp, 4);
  EXPECT_EQ(l.dp_replicate, 2);
  EXPECT_EQ(l.dp_shard, 2);
  EXPECT_EQ(l.cp, 2);
  // dp 0 with dp_shard given: dp = dp_replicate × dp_shard.
  l = complete_layout(sizes_of(8, 1, 2, 4, 1, 1));
  EXPECT_EQ(l.dp, 8);
  // dp given, dp_shard 0.
  GridSizes s = sizes_of(8, 1, 4, 0, 1, 2);
  s.dp = 4;
  l = complete_layout(s);
  EXPECT_EQ(l.dp_shard, 1);
  EXPECT_EQ(l.dp, 4);
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

TEST(CompleteLayout, RefusesWithTheNumbers) {
  GridSizes s = sizes_of(16, 1, 2, 3, 1, 2);
  s.dp = 8;
  EXPECT_NE(input_error_of(s).find("dp_replicate 2 × dp_shard 3 = 6 but dp is 8"),
            std::string::npos)
      << input_error_of(s);
  s = sizes_of(12, 1, 4, 0, 1, 2);  // dp 6 from the world
  EXPECT_NE(input_error_of(s).find("dp 6 is not divisible by dp_replicate 4"), std::string::npos)
      << input_error_of(s);
  s = sizes_of(16, 1, 2, 2, 2, 1);  // dp 4 × cp 2 = 8
  EXPECT_NE(input_error_of(s).find("dp 4 × tp 1 × pp 1 × cp 2 = 8 but world is 16"),
            std::string::npos)
      << input_error_of(s);
  s = sizes_of(12, 1, 1, 0, 8, 1);
  EXPECT_NE(input_error_of(s).find("world 12 is not divisible by tp 1 × pp 1 × cp 8"),
            std::string::npos)
      << input_error_of(s);
  EXPECT_NE(input_error_of(sizes_of(4, 1, 1, 0, 0, 1)).find("cp must be at least 1, got 0"),
            std::string::npos);
  EXPECT_NE(input_error_of(sizes_of(4, 1, 0, 0, 1, 1)).find("dp_replicate must be at least 1"),
            std::string::npos);
  EXPECT_NE(input_error_of(sizes_of(4, 1, 1, -1, 1, 1)).find("dp_shard must be at least 1"),
            std::string::npos);
}

TEST(GridCoord, WorkedExampleOf16Ranks) {
  const GridLayout l = make_layout(16, 4, 2, 2);
  // 13 = 1 + 2·2 + 8·1; with dp_replicate 1 the dp_shard coordinate is dp.
  EXPECT_EQ(grid_coord(l, 13), (GridCoord{.dp = 2, .tp = 1, .pp = 1, .dp_shard = 2}));
  EXPECT_EQ(grid_coord(l, 0), (GridCoord{0, 0, 0}));
  EXPECT_EQ(grid_coord(l, 7), (GridCoord{.dp = 3, .tp = 1, .pp = 0, .dp_shard = 3}));
  EXPECT_EQ(grid_coord(l, 8), (GridCoord{.dp = 0, .tp = 0, .pp = 1}));
  EXPECT_EQ(global_rank_of(l, {2, 1, 1}), 13);  // {dp, tp, pp} still names a rank
}

// grid.h's example: world 16 = pp 2 × dp_replicate 2 × dp_shard 2 × tp 2.
TEST(GridCoord, WorkedExampleWithDpReplicate) {
  const GridLayout l = complete_layout(sizes_of(16, 2, 2, 0, 1, 2));
  EXPECT_EQ(l.dp, 4);
  EXPECT_EQ(l.dp_shard, 2);
  const GridCoord c = grid_coord(l, 13);  // 1 + 2·(0 + 2·(1 + 2·1))
  EXPECT_EQ(c, (GridCoord{.dp = 2, .tp = 1, .pp = 1, .dp_replicate = 1, .dp_shard = 0, .cp = 0}));
  EXPECT_EQ(global_rank_of(l, c), 13);
  EXPECT_EQ(global_rank_of(l, {2, 1, 1}), 13);
  EXPECT_EQ(grid_coord(l, 6), (GridCoord{.dp = 3, .dp_replicate = 1, .dp_shard = 1}));
  // A coordinate whose dp disagrees with its dp_replicate and dp_shard is a bug.
  EXPECT_THROW(global_rank_of(l, GridCoord{.dp = 0, .dp_replicate = 1, .dp_shard = 1}), Error);
}

TEST(GridCoord, RoundTripsForEveryRankOfEveryLayout) {
  for (int world : {1, 2, 6, 8, 12, 16})
    for (const GridLayout& l : every_layout(world)) {
      SCOPED_TRACE(::testing::Message()
                   << "world " << world << " pp " << l.pp << " rep " << l.dp_replicate << " shard "
                   << l.dp_shard << " cp " << l.cp << " tp " << l.tp);
      EXPECT_EQ(l.dp, l.dp_replicate * l.dp_shard);
      for (int r = 0; r < world; ++r) {
        const GridCoord c = grid_coord(l, r);
        EXPECT_EQ(c.tp + l.tp * (c.cp + l.cp * (c.dp_shard + l.dp_shard * (c.dp_replicate +
                                                                           l.dp_replicate * c.pp))),
                  r);
        EXPECT_EQ(c.dp, c.dp_replicate * l.dp_shard + c.dp_shard);
        EXPECT_EQ(global_rank_of(l, c), r);
        EXPECT_EQ(global_rank_of(l, {c.dp, c.tp, c.pp, 0, 0, c.cp}), r);
      }
    }
}

// With cp = 1 the rank order is the old tp, dp, pp one for any split of dp: the old formulas,
// written out here, give the same coordinates and the same dp, tp, pp, model-parallel and
// embedding groups.
TEST(GridCoord, CpOneKeepsTodaysGrid) {
  for (int world : {1, 2, 4, 6, 8, 12, 16})
    for (const GridLayout& l : every_layout(world)) {
      if (l.cp != 1) continue;
      const int dp = l.dp, tp = l.tp, pp = l.pp;
      for (int r = 0; r < world; ++r) {
        const GridCoord c = grid_coord(l, r);
        EXPECT_EQ(c.tp, r % tp);
        EXPECT_EQ(c.dp, (r / tp) % dp);
        EXPECT_EQ(c.pp, r / (tp * dp));
        auto old_rank = [&](int d, int t, int p) { return t + tp * d + tp * dp * p; };
        V dp_group, tp_group, pp_group, mp_group, embedding;
        for (int d = 0; d < dp; ++d) dp_group.push_back(old_rank(d, c.tp, c.pp));
        for (int t = 0; t < tp; ++t) tp_group.push_back(old_rank(c.dp, t, c.pp));
        for (int p = 0; p < pp; ++p) pp_group.push_back(old_rank(c.dp, c.tp, p));
        for (int p = 0; p < pp; ++p)
          for (int t = 0; t < tp; ++t) mp_group.push_back(old_rank(c.dp, t, p));
        if (pp == 1) embedding = {r};
        else if (c.pp == 0 || c.pp == pp - 1)
          embedding = {old_rank(c.dp, c.tp, 0), old_rank(c.dp, c.tp, pp - 1)};
        EXPECT_EQ(grid_group_members(l, GridGroup::kDp, r), dp_group);
        EXPECT_EQ(grid_group_members(l, GridGroup::kTp, r), tp_group);
        EXPECT_EQ(grid_group_members(l, GridGroup::kPp, r), pp_group);
        EXPECT_EQ(grid_group_members(l, GridGroup::kModelParallel, r), mp_group);
        EXPECT_EQ(grid_group_members(l, GridGroup::kEmbedding, r), embedding);
        // cp = 1: the gradient group is dp, and nothing is split along cp.
        EXPECT_EQ(grid_group_members(l, GridGroup::kDpCp, r), dp_group);
        EXPECT_EQ(grid_group_members(l, GridGroup::kCp, r), V{r});
        if (l.dp_replicate == 1) {
          EXPECT_EQ(grid_group_members(l, GridGroup::kDpShard, r), dp_group);
          EXPECT_EQ(grid_group_members(l, GridGroup::kDpReplicate, r), V{r});
        }
      }
    }
}

TEST(GridGroups, WorkedExampleOf16Ranks) {
  const GridLayout l = make_layout(16, 4, 2, 2);
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

// grid.h's example, every named group of two ranks, written out by hand.
TEST(GridGroups, WorkedExampleWithDpReplicate) {
  const GridLayout l = complete_layout(sizes_of(16, 2, 2, 2, 1, 2));
  auto members = [&](GridGroup g, int r) { return grid_group_members(l, g, r); };
  // Rank 13: pp 1, dp_replicate 1, dp_shard 0, tp 1.
  EXPECT_EQ(members(GridGroup::kTp, 13), (V{12, 13}));
  EXPECT_EQ(members(GridGroup::kDpShard, 13), (V{13, 15}));
  EXPECT_EQ(members(GridGroup::kDpReplicate, 13), (V{9, 13}));
  EXPECT_EQ(members(GridGroup::kDp, 13), (V{9, 11, 13, 15}));
  EXPECT_EQ(members(GridGroup::kCp, 13), (V{13}));
  EXPECT_EQ(members(GridGroup::kDpCp, 13), (V{9, 11, 13, 15}));
  EXPECT_EQ(members(GridGroup::kDpShardCp, 13), (V{13, 15}));
  EXPECT_EQ(members(GridGroup::kPp, 13), (V{5, 13}));
  EXPECT_EQ(members(GridGroup::kModelParallel, 13), (V{4, 5, 12, 13}));
  EXPECT_EQ(members(GridGroup::kEmbedding, 13), (V{5, 13}));
  // Rank 6: pp 0, dp_replicate 1, dp_shard 1, tp 0.
  EXPECT_EQ(members(GridGroup::kTp, 6), (V{6, 7}));
  EXPECT_EQ(members(GridGroup::kDpShard, 6), (V{4, 6}));
  EXPECT_EQ(members(GridGroup::kDpReplicate, 6), (V{2, 6}));
  EXPECT_EQ(members(GridGroup::kDp, 6), (V{0, 2, 4, 6}));
  EXPECT_EQ(members(GridGroup::kPp, 6), (V{6, 14}));
  EXPECT_EQ(members(GridGroup::kModelParallel, 6), (V{6, 7, 14, 15}));
  // The rank inside each communicator is the coordinate: dp_replicate 1, dp_shard 1, dp 3.
  const GridCoord c = grid_coord(l, 6);
  EXPECT_EQ(grid_span_rank(l, grid_group_dims(GridGroup::kDpReplicate), c), 1);
  EXPECT_EQ(grid_span_rank(l, grid_group_dims(GridGroup::kDpShard), c), 1);
  EXPECT_EQ(grid_span_rank(l, grid_group_dims(GridGroup::kDp), c), 3);
}

// world 16 = dp_replicate 2 × dp_shard 2 × cp 2 × tp 2: rank 11 is tp 1, cp 1, dp_shard 0,
// dp_replicate 1 (11 = 1 + 2·(1 + 2·(0 + 2·1))).
TEST(GridGroups, WorkedExampleWithCp) {
  const GridLayout l = complete_layout(sizes_of(16, 1, 2, 2, 2, 2));
  auto members = [&](GridGroup g) { return grid_group_members(l, g, 11); };
  EXPECT_EQ(grid_coord(l, 11),
            (GridCoord{.dp = 2, .tp = 1, .pp = 0, .dp_replicate = 1, .dp_shard = 0, .cp = 1}));
  EXPECT_EQ(members(GridGroup::kTp), (V{10, 11}));
  EXPECT_EQ(members(GridGroup::kCp), (V{9, 11}));
  EXPECT_EQ(members(GridGroup::kDpShard), (V{11, 15}));
  EXPECT_EQ(members(GridGroup::kDpReplicate), (V{3, 11}));
  EXPECT_EQ(members(GridGroup::kDp), (V{3, 7, 11, 15}));
  EXPECT_EQ(members(GridGroup::kDpCp), (V{1, 3, 5, 7, 9, 11, 13, 15}));
  EXPECT_EQ(members(GridGroup::kDpShardCp), (V{9, 11, 13, 15}));
  EXPECT_EQ(members(GridGroup::kPp), (V{11}));
  EXPECT_EQ(members(GridGroup::kModelParallel), (V{10, 11}));
  EXPECT_EQ(members(GridGroup::kEmbedding), (V{11}));
  const GridCoord c = grid_coord(l, 11);
  EXPECT_EQ(grid_span_rank(l, grid_group_dims(GridGroup::kDpCp), c), 5);  // (2·1 + 0)·2 + 1
  EXPECT_EQ(grid_span_rank(l, grid_group_dims(GridGroup::kDpShardCp), c), 1);
  EXPECT_EQ(grid_span_rank(l, grid_group_dims(GridGroup::kCp), c), 1);
}

TEST(GridGroups, EmbeddingGroupIsFirstAndLastStage) {
  const GridLayout l = make_layout(8, 1, 2, 4);  // stages: [0 1] [2 3] [4 5] [6 7]
  EXPECT_EQ(grid_group_members(l, GridGroup::kEmbedding, 0), (V{0, 6}));
  EXPECT_EQ(grid_group_members(l, GridGroup::kEmbedding, 7), (V{1, 7}));
  EXPECT_TRUE(grid_group_members(l, GridGroup::kEmbedding, 2).empty());  // middle stage
  EXPECT_TRUE(grid_group_members(l, GridGroup::kEmbedding, 5).empty());
  EXPECT_EQ(grid_group_members(l, GridGroup::kPp, 3), (V{1, 3, 5, 7}));
  const GridLayout flat = make_layout(4, 0, 2, 1);
  EXPECT_EQ(grid_group_members(flat, GridGroup::kEmbedding, 3), (V{3}));
}

// Each kind of group partitions the world (embedding: the first and last stages), every member
// sees the same list, sizes are the product of the spanned sizes, and a rank's position in the
// list is its span rank (its rank inside the communicator).
TEST(GridGroups, PartitionTheWorld) {
  for (int world : {6, 8, 12, 16})
    for (const GridLayout& l : every_layout(world))
      for (GridGroup group : kGridGroups) {
        if (group == GridGroup::kEmbedding) continue;
        int size = 1;
        for (GridDim d : kGridDims)
          if (grid_group_dims(group).contains(d)) size *= grid_dim_size(l, d);
        std::set<int> covered;
        for (int r = 0; r < world; ++r) {
          const auto members = grid_group_members(l, group, r);
          ASSERT_EQ(static_cast<int>(members.size()), size) << grid_group_name(group);
          EXPECT_TRUE(std::is_sorted(members.begin(), members.end()));
          const auto me = std::find(members.begin(), members.end(), r);
          ASSERT_NE(me, members.end());
          EXPECT_EQ(me - members.begin(),
                    grid_span_rank(l, grid_group_dims(group), grid_coord(l, r)));
          for (int m : members) EXPECT_EQ(grid_group_members(l, group, m), members);
          covered.insert(members.begin(), members.end());
        }
        EXPECT_EQ(static_cast<int>(covered.size()), world);
      }
}

std::vector<std::string> lines_of(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<std::string> words_of(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

TEST(FormatGridTable, OneRowPerRankWithItsGroups) {
  const std::string table = format_grid_table(make_layout(16, 4, 2, 2));
  const auto lines = lines_of(table);
  ASSERT_EQ(lines.size(), 19u);  // sizes, formula, header, 16 ranks
  EXPECT_NE(lines[0].find("world 16 = pp 2 × dp_replicate 1 × dp_shard 4 × cp 1 × tp 2"),
            std::string::npos);
  EXPECT_NE(lines[1].find("global rank = tp_rank + 2·(cp_rank + 1·(dp_shard_rank + "
                          "4·(dp_replicate_rank + 1·pp_rank)))"),
            std::string::npos)
      << lines[1];
  // cp = 1, dp_replicate = 1: today's columns, no more.
  const std::vector<std::string> header = {"rank",           "dp",    "tp",        "pp",   "dp",
                                           "group",          "tp",    "group",     "pp",   "group",
                                           "model-parallel", "group", "embedding", "group"};
  EXPECT_EQ(words_of(lines[2]), header) << table;
  // Rank 13: (dp 2, tp 1, pp 1), dp [9 11 13 15], tp [12 13], pp [5 13], mp [4 5 12 13].
  const std::vector<std::string> expected = {"13", "2",   "1",   "1",   "[9", "11",
                                             "13", "15]", "[12", "13]", "[5", "13]",
                                             "[4", "5",   "12",  "13]", "[5", "13]"};
  EXPECT_EQ(words_of(lines[3 + 13]), expected) << table;
}

TEST(FormatGridTable, ShowsTheDimensionsAndGroupsThatAreNotTrivial) {
  // grid.h's example: dp_replicate and dp_shard get a coordinate and a group column each.
  std::string table = format_grid_table(complete_layout(sizes_of(16, 2, 2, 2, 1, 2)));
  auto lines = lines_of(table);
  ASSERT_EQ(lines.size(), 19u);
  EXPECT_EQ(
      words_of(lines[2]),
      (std::vector<std::string>{
          "rank",      "dp",    "tp",           "pp",    "dp_replicate", "dp_shard",       "dp",
          "group",     "tp",    "group",        "pp",    "group",        "model-parallel", "group",
          "embedding", "group", "dp_replicate", "group", "dp_shard",     "group"}))
      << table;
  // Rank 13: dp 2, tp 1, pp 1, dp_replicate 1, dp_shard 0; then dp, tp, pp, mp, embedding,
  // dp_replicate and dp_shard groups.
  EXPECT_EQ(words_of(lines[3 + 13]),
            (std::vector<std::string>{"13", "2",   "1",   "1",   "1",  "0",   "[9",  "11",
                                      "13", "15]", "[12", "13]", "[5", "13]", "[4",  "5",
                                      "12", "13]", "[5",  "13]", "[9", "13]", "[13", "15]"}))
      << table;
  // cp 2 with dp_replicate 1: cp, cp group and dp_cp group (dp_shard_cp is dp_cp here).
  table = format_grid_table(complete_layout(sizes_of(8, 1, 1, 2, 2, 2)));
  lines = lines_of(table);
  EXPECT_EQ(words_of(lines[2]),
            (std::vector<std::string>{"rank", "dp", "tp", "pp", "cp", "dp", "group", "tp", "group",
                                      "pp", "group", "model-parallel", "group", "embedding",
                                      "group", "cp", "group", "dp_cp", "group"}))
      << table;
  // Rank 5 = tp 1 + 2·(cp 0 + 2·dp_shard 1).
  EXPECT_EQ(words_of(lines[3 + 5]),
            (std::vector<std::string>{"5", "1", "1", "0", "0", "[1", "5]", "[4", "5]", "[5]", "[4",
                                      "5]", "[5]", "[5", "7]", "[1", "3", "5", "7]"}))
      << table;
}

// The embedding-group cell of each rank's row: the text under the header's "embedding group"
// (member lists are left-aligned, so a cell starts where its header does).
std::vector<std::string> embedding_cells(const std::string& table) {
  const auto lines = lines_of(table);
  size_t header = 0;
  while (header < lines.size() && lines[header].find("embedding group") == std::string::npos)
    ++header;
  if (header == lines.size()) return {};
  const size_t column = lines[header].find("embedding group");
  std::vector<std::string> cells;
  for (size_t i = header + 1; i < lines.size(); ++i) {
    const std::string rest = lines[i].size() > column ? lines[i].substr(column) : "";
    cells.push_back(rest.substr(0, rest.find("  ")));
  }
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

// Note [Expert parallelism]: world 8 = dp 4 × tp 2, ep 2. The dp_cp group of rank 0 is
// {0 2 4 6} (tp rank 0): its ep groups are {0 2} and {4 6}, its replicas {0 4} and {2 6}.
TEST(GridExperts, FoldOverDpCpConsecutively) {
  const GridLayout g = make_layout(8, 4, 2, 1);
  EXPECT_EQ(grid_expert_members(g, 2, 0, false), (std::vector<int>{0, 2}));
  EXPECT_EQ(grid_expert_members(g, 2, 6, false), (std::vector<int>{4, 6}));
  EXPECT_EQ(grid_expert_members(g, 2, 0, true), (std::vector<int>{0, 4}));
  EXPECT_EQ(grid_expert_members(g, 2, 3, true), (std::vector<int>{3, 7}));
  EXPECT_EQ(grid_expert_members(g, 4, 5, false), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(grid_expert_members(g, 4, 5, true), (std::vector<int>{5}));
  const std::string table = format_grid_table(g, 2);
  EXPECT_NE(table.find("ep group"), std::string::npos) << table;
  EXPECT_NE(table.find("expert_dp 2"), std::string::npos) << table;
  EXPECT_THROW(format_grid_table(g, 3), Error);  // 3 does not divide dp × cp = 4
  EXPECT_EQ(format_grid_table(g, 1).find("ep group"), std::string::npos);
}

// Note [Experts with HSDP]: world 8 = dp_replicate 2 × dp_shard 4, ep 2. Without ZeRO the
// expert-dp replicas span both replicas {0 2 4 6}; with ZeRO they stay in the replica {0 2},
// whose shards the replicas' second hop all-reduces ({0 4} is the dp_replicate group).
TEST(GridExperts, StayWithinAReplicaUnderHsdp) {
  const GridLayout g = complete_layout(sizes_of(8, 1, 2, 4, 1, 1));
  EXPECT_EQ(grid_expert_members(g, 2, 0, true), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(grid_expert_members(g, 2, 0, true, 3), (std::vector<int>{0, 2}));
  EXPECT_EQ(grid_expert_members(g, 2, 5, true, 1), (std::vector<int>{5, 7}));
  EXPECT_EQ(grid_expert_members(g, 2, 5, false, 1), (std::vector<int>{4, 5}));
  const std::string table = format_grid_table(g, 2, 3);
  EXPECT_NE(table.find("expert_dp 2 = dp_shard"), std::string::npos) << table;
  EXPECT_NE(table.find("all-reduced over the 2 replicas"), std::string::npos) << table;
  // ep 8 divides dp × cp = 8 but not dp_shard × cp = 4.
  EXPECT_NO_THROW(format_grid_table(g, 8));
  EXPECT_THROW(format_grid_table(g, 8, 1), Error);
}

}  // namespace
}  // namespace trident
