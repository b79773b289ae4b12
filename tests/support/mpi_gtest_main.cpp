// GoogleTest main for MPI tests: every rank runs every test, only rank 0 prints, and the
// program fails on every rank if any rank failed (the exit status is agreed with an all-reduce).
// Before MPI_Init, as trident does, the product's BLAS kernel (Note [Tests' BLAS core]).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "param_diagonal.h"
#include "products_blas_core.h"

// -fsanitize=address (the TRIDENT_SANITIZE build): gcc says so with a macro, clang with a feature.
#if defined(__SANITIZE_ADDRESS__)
#define TRIDENT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TRIDENT_ASAN 1
#endif
#endif
#ifdef TRIDENT_ASAN
#include <sanitizer/lsan_interface.h>
#endif

// Note [Leak checks around Open MPI]
// In the sanitized build LeakSanitizer must see trident's leaks, not Open MPI's: Open MPI loses
// blocks in MPI_Init and drops more when MPI_Finalize unloads its components, which at exit no
// suppression could name (their libraries are gone). So MPI_Init's allocations on this thread
// are not tracked, and the leak check runs once before MPI_Finalize, while Open MPI's blocks are
// still reachable and the tests' leaks are not. A leak fails the rank.
//
// tools/lsan.supp names what Open MPI's own threads lose.
int main(int argc, char** argv) {
  trident::testing::use_products_blas_core(argv);
  int provided = 0;
#ifdef TRIDENT_ASAN
  __lsan_disable();
#endif
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
#ifdef TRIDENT_ASAN
  __lsan_enable();
#endif
  if (provided < MPI_THREAD_MULTIPLE) {
    std::fprintf(stderr, "MPI_Init_thread: MPI_THREAD_MULTIPLE not provided (got %d)\n", provided);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  ::testing::InitGoogleTest(&argc, argv);
  const int left_out = trident::testing::apply_param_diagonal();  // Note [Parameter diagonal]
  if (rank == 0 && left_out > 0)
    std::printf("parameter diagonal: %d parameterized test(s) left out\n", left_out);
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) delete listeners.Release(listeners.default_result_printer());
  int local_failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&local_failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (local_failed) std::fprintf(stderr, "rank %d: tests FAILED\n", rank);
  if (rank == 0) std::printf("%s on all ranks\n", any_failed ? "FAILED" : "PASSED");
#ifdef TRIDENT_ASAN
  std::fflush(stdout);
  __lsan_do_leak_check();  // Note [Leak checks around Open MPI]
#endif
  MPI_Finalize();
  return any_failed;
}
