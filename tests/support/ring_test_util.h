// Shared by the MPI tests of the rings (test_cp_attention, test_tp_overlap): a communicator of
// the first n ranks, and reproducible random inputs.
#pragma once

#include <mpi.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "trident/comm.h"

namespace trident::testing {

// The first `n` ranks of the world as a communicator named `name` (null on the others, which
// skip).
inline std::unique_ptr<MpiComm> first_ranks(int n, const std::string& name) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm sub = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank < n ? 0 : MPI_UNDEFINED, rank, &sub);
  if (sub == MPI_COMM_NULL) return nullptr;
  return std::make_unique<MpiComm>(sub, name);
}

// n values drawn from N(0, 1) with `seed`.
inline std::vector<float> random_values(size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

}  // namespace trident::testing
