// ProcessGrid under MPI: for every layout that fits the world (every split over pp, dp_replicate,
// dp_shard, cp and tp), each communicator holds exactly the ranks the pure functions name, in
// the same order; and a 4-rank HSDP layout checked against hand-written groups.
#include <gtest/gtest.h>
#include <mpi.h>

#include "trident/check.h"
#include "trident/grid.h"

namespace trident {
namespace {

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// The world ranks of a communicator's members, in communicator rank order.
std::vector<int> members_of(const MpiComm& comm) {
  std::vector<int> members(comm.size());
  const int me = world_rank();
  TRIDENT_MPI(MPI_Allgather(&me, 1, MPI_INT, members.data(), 1, MPI_INT, comm.raw()));
  return members;
}

std::vector<GridLayout> layouts_that_fit(int world) {
  std::vector<GridLayout> out;
  for (int pp = 1; pp <= world; ++pp)
    for (int rep = 1; rep <= world; ++rep)
      for (int shard = 1; shard <= world; ++shard)
        for (int cp = 1; cp <= world; ++cp) {
          const int outer = pp * rep * shard * cp;
          if (world % outer != 0) continue;
          GridSizes s;
          s.world = world;
          s.pp = pp;
          s.dp_replicate = rep;
          s.dp_shard = shard;
          s.cp = cp;
          s.tp = world / outer;
          out.push_back(complete_layout(s));
        }
  return out;
}

TEST(ProcessGrid, EveryLayoutThatFitsMatchesThePureFunctions) {
  const int world = world_size(), me = world_rank();
  for (const GridLayout& layout : layouts_that_fit(world)) {
    SCOPED_TRACE(fmt::format("pp {} dp_replicate {} dp_shard {} cp {} tp {}", layout.pp,
                             layout.dp_replicate, layout.dp_shard, layout.cp, layout.tp));
    ProcessGrid grid(layout);
    const GridCoord c = grid_coord(layout, me);
    EXPECT_EQ(grid.world_rank(), me);
    EXPECT_EQ(grid.coord(), c);
    EXPECT_EQ(grid.dp().rank(), c.dp);
    EXPECT_EQ(grid.tp().rank(), c.tp);
    EXPECT_EQ(grid.pp().rank(), c.pp);
    EXPECT_EQ(grid.dp().size(), layout.dp);
    EXPECT_EQ(grid.tp().size(), layout.tp);
    EXPECT_EQ(grid.pp().size(), layout.pp);
    EXPECT_EQ(grid.world().size(), world);
    EXPECT_EQ(members_of(grid.dp()), grid_group_members(layout, GridGroup::kDp, me));
    EXPECT_EQ(members_of(grid.tp()), grid_group_members(layout, GridGroup::kTp, me));
    EXPECT_EQ(members_of(grid.pp()), grid_group_members(layout, GridGroup::kPp, me));
    // Every named group: the communicator's members, and its rank is the coordinate in it.
    for (GridGroup g : kGridGroups) {
      SCOPED_TRACE(grid_group_name(g));
      const auto members = grid_group_members(layout, g, me);
      if (!grid_group_has_communicator(g) || members.empty()) {
        EXPECT_FALSE(grid.has_group(g));
        EXPECT_THROW(grid.group(g), Error);
        continue;
      }
      ASSERT_TRUE(grid.has_group(g));
      EXPECT_EQ(members_of(grid.group(g)), members);
      EXPECT_EQ(grid.group(g).name(), grid_group_name(g));
      if (g != GridGroup::kEmbedding)
        EXPECT_EQ(grid.group(g).rank(), grid_span_rank(layout, grid_group_dims(g), c));
    }
    EXPECT_EQ(grid.dp_replicate().rank(), c.dp_replicate);
    EXPECT_EQ(grid.dp_shard().rank(), c.dp_shard);
    EXPECT_EQ(grid.cp().rank(), c.cp);
    EXPECT_EQ(grid.dp_cp().size(), layout.dp * layout.cp);
    EXPECT_EQ(grid.dp_cp().rank(), c.dp * layout.cp + c.cp);
    EXPECT_EQ(grid.dp_shard_cp().size(), layout.dp_shard * layout.cp);
    EXPECT_EQ(grid.dp_shard_cp().rank(), c.dp_shard * layout.cp + c.cp);
    const auto embedding = grid_group_members(layout, GridGroup::kEmbedding, me);
    EXPECT_EQ(grid.in_embedding_group(), !embedding.empty());
    if (grid.in_embedding_group()) EXPECT_EQ(members_of(grid.embedding()), embedding);
    else EXPECT_THROW(grid.embedding(), Error);

    EXPECT_EQ(grid.is_first_stage(), c.pp == 0);
    EXPECT_EQ(grid.is_last_stage(), c.pp == layout.pp - 1);

    // The dp communicator sums over exactly the dp group.
    int sum = me, expected = 0;
    for (int m : grid_group_members(layout, GridGroup::kDp, me)) expected += m;
    grid.dp().all_reduce(&sum, 1).wait();
    EXPECT_EQ(sum, expected);

    // pp() ranks are stages: pass the world rank one stage down the pipe.
    if (layout.pp > 1) {
      int from_prev = -1;
      Work recv, send;
      if (!grid.is_first_stage()) recv = grid.pp().recv(&from_prev, 1, c.pp - 1);
      if (!grid.is_last_stage()) send = grid.pp().send(&me, 1, c.pp + 1);
      recv.wait();
      send.wait();
      if (!grid.is_first_stage())
        EXPECT_EQ(from_prev, global_rank_of(layout, {c.dp, c.tp, c.pp - 1, 0, 0, c.cp}));
    }
  }
}

// HSDP on 4 ranks: dp 4 = dp_replicate 2 × dp_shard 2 (tp, pp, cp 1). Rank r has dp_shard r % 2
// and dp_replicate r / 2, so the shard groups are neighbours and the replicas are 2 apart.
TEST(ProcessGrid, HsdpOfFourRanks) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const int me = world_rank();
  GridSizes s;
  s.world = 4;
  s.dp_replicate = 2;
  ProcessGrid grid(complete_layout(s));
  EXPECT_EQ(grid.layout().dp, 4);
  EXPECT_EQ(grid.layout().dp_shard, 2);
  using V = std::vector<int>;
  const V shard_groups[] = {{0, 1}, {0, 1}, {2, 3}, {2, 3}};
  const V replica_groups[] = {{0, 2}, {1, 3}, {0, 2}, {1, 3}};
  EXPECT_EQ(members_of(grid.dp_shard()), shard_groups[me]);
  EXPECT_EQ(members_of(grid.dp_replicate()), replica_groups[me]);
  EXPECT_EQ(members_of(grid.dp()), (V{0, 1, 2, 3}));
  EXPECT_EQ(members_of(grid.dp_cp()), (V{0, 1, 2, 3}));
  EXPECT_EQ(members_of(grid.dp_shard_cp()), shard_groups[me]);
  EXPECT_EQ(members_of(grid.cp()), (V{me}));
  EXPECT_EQ(members_of(grid.tp()), (V{me}));
  EXPECT_EQ(grid.dp_shard().size(), 2);
  EXPECT_EQ(grid.dp_replicate().size(), 2);
  EXPECT_EQ(grid.dp_shard().rank(), me % 2);
  EXPECT_EQ(grid.dp_replicate().rank(), me / 2);
  EXPECT_EQ(grid.dp().rank(), me);  // dp = 2·dp_replicate + dp_shard
  EXPECT_EQ(grid.coord().dp, me);

  // HSDP's two steps: sum inside the shard group, then across the replicas; the result is the
  // sum over all of dp.
  int sum = me + 1;
  grid.dp_shard().all_reduce(&sum, 1).wait();
  EXPECT_EQ(sum, me < 2 ? 1 + 2 : 3 + 4);
  grid.dp_replicate().all_reduce(&sum, 1).wait();
  EXPECT_EQ(sum, 1 + 2 + 3 + 4);

  grid.set_timeout(42.0);
  EXPECT_EQ(grid.world().timeout(), 42.0);
  for (GridGroup g : kGridGroups)
    if (grid.has_group(g)) EXPECT_EQ(grid.group(g).timeout(), 42.0) << grid_group_name(g);
}

// cp on 4 ranks: dp_shard 2 × cp 2. Rank r has cp r % 2 and dp r / 2; dp_cp is everyone.
TEST(ProcessGrid, ContextParallelOfFourRanks) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const int me = world_rank();
  GridSizes s;
  s.world = 4;
  s.cp = 2;
  ProcessGrid grid(complete_layout(s));
  using V = std::vector<int>;
  const V cp_groups[] = {{0, 1}, {0, 1}, {2, 3}, {2, 3}};
  const V dp_groups[] = {{0, 2}, {1, 3}, {0, 2}, {1, 3}};
  EXPECT_EQ(members_of(grid.cp()), cp_groups[me]);
  EXPECT_EQ(members_of(grid.dp()), dp_groups[me]);
  EXPECT_EQ(members_of(grid.dp_cp()), (V{0, 1, 2, 3}));
  EXPECT_EQ(members_of(grid.dp_shard_cp()), (V{0, 1, 2, 3}));
  EXPECT_EQ(grid.cp().rank(), me % 2);
  EXPECT_EQ(grid.dp().rank(), me / 2);
  EXPECT_EQ(grid.dp_cp().rank(), me);
}

TEST(ProcessGrid, RefusesALayoutForAnotherWorldOnEveryRank) {
  const int world = world_size();
  try {
    ProcessGrid grid(GridLayout{world * 2, world * 2, 1, 1});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    EXPECT_NE(std::string(e.what()).find(fmt::format("but {} ranks are running", world)),
              std::string::npos)
        << e.what();
  }
  // A layout that does not multiply out is refused before any communicator is split.
  EXPECT_THROW(ProcessGrid(GridLayout{world, 3, 2, 1}), Error);
  // So is one whose dp_replicate × dp_shard is not dp.
  EXPECT_THROW(ProcessGrid(GridLayout{world, world, 1, 1, 2, world, 1}), Error);
  // And the world is still usable (no rank is left inside a collective).
  int one = 1;
  MPI_Allreduce(MPI_IN_PLACE, &one, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(one, world);
}

}  // namespace
}  // namespace trident
