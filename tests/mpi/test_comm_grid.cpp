// ProcessGrid under MPI: for every layout that fits the world, each communicator holds exactly
// the ranks the pure functions name, in the same order.
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
  for (int tp = 1; tp <= world; ++tp)
    for (int pp = 1; pp <= world; ++pp)
      if (world % (tp * pp) == 0) out.push_back(make_layout(world, 0, tp, pp));
  return out;
}

TEST(ProcessGrid, EveryLayoutThatFitsMatchesThePureFunctions) {
  const int world = world_size(), me = world_rank();
  for (const GridLayout& layout : layouts_that_fit(world)) {
    SCOPED_TRACE(fmt::format("dp {} tp {} pp {}", layout.dp, layout.tp, layout.pp));
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
        EXPECT_EQ(from_prev, global_rank_of(layout, {c.dp, c.tp, c.pp - 1}));
    }
  }
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
  // And the world is still usable (no rank is left inside a collective).
  int one = 1;
  MPI_Allreduce(MPI_IN_PLACE, &one, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(one, world);
}

}  // namespace
}  // namespace trident
