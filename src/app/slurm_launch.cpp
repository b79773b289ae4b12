#include "app/slurm_launch.h"

#include <mpi.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "trident/check.h"

namespace trident {
namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return *end == '\0' ? int(x) : fallback;
}

}  // namespace

// Note [Slurm launch check]
// srun starts SLURM_STEP_NUM_TASKS tasks, each with its own SLURM_PROCID; wired to srun's PMI
// (`srun --mpi=pmix`), every task is one rank of one world. So a world holding fewer distinct
// PROCIDs than the step has tasks is a launch mistake that would train separate copies, and is
// refused on every rank. A legitimate `mpirun` inside an allocation passes: its daemons are a
// step of one task per node, and every node's ranks share that node's PROCID.
//
// The two mistakes:
//   - srun's --mpi plugin does not match the MPI library: each task starts as a singleton,
//     a world of one (Debian's Open MPI refuses earlier, in MPI_Init, with its own message;
//     other builds carry on and train N separate copies);
//   - `srun mpirun trident`: every srun task runs its own mpirun, whose ranks all share the
//     task's PROCID — several worlds, each training the whole run.
void check_slurm_launch() {
  if (std::getenv("SLURM_JOB_ID") == nullptr) return;
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int step_tasks = env_int("SLURM_STEP_NUM_TASKS", 0);
  if (step_tasks == 0) {  // the batch script itself, not an srun step
    const int job_tasks = env_int("SLURM_NTASKS", 1);
    if (rank == 0 && world < job_tasks)
      fmt::print(stderr,
                 "WARNING: this Slurm job has {} tasks but trident runs as {} rank(s) outside "
                 "srun; start it with `srun --mpi=pmix build/trident ...` (jobs/slurm/*.sbatch "
                 "do) to use them all\n",
                 job_tasks, world);
    return;
  }
  const int procid = env_int("SLURM_PROCID", -1);
  std::vector<int> ids(size_t(world), -1);
  TRIDENT_MPI(MPI_Allgather(&procid, 1, MPI_INT, ids.data(), 1, MPI_INT, MPI_COMM_WORLD));
  std::sort(ids.begin(), ids.end());
  const int distinct = int(std::unique(ids.begin(), ids.end()) - ids.begin());
  if (distinct >= step_tasks) return;
  input_error(
      "launch: srun started {} tasks, but this MPI world of {} rank(s) holds only {} of them, "
      "so every task trains on its own. Either srun's MPI plugin does not match the MPI library "
      "(use `srun --mpi=pmix`; `srun --mpi=list` shows what this Slurm offers) or mpirun runs "
      "inside srun (`srun mpirun ...`: use one launcher, srun or mpirun, not both)",
      step_tasks, world, distinct);
}

}  // namespace trident
