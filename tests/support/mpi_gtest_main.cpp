// GoogleTest main for MPI tests: every rank runs every test, only rank 0 prints, and the
// program fails on every rank if any rank failed (the exit status is agreed with an all-reduce).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    std::fprintf(stderr, "MPI_Init_thread: MPI_THREAD_MULTIPLE not provided (got %d)\n", provided);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  ::testing::InitGoogleTest(&argc, argv);
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) delete listeners.Release(listeners.default_result_printer());
  int local_failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&local_failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (local_failed) std::fprintf(stderr, "rank %d: tests FAILED\n", rank);
  if (rank == 0) std::printf("%s on all ranks\n", any_failed ? "FAILED" : "PASSED");
  MPI_Finalize();
  return any_failed;
}
