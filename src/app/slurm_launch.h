// Under Slurm, checks that the MPI world is the srun step: the two launch mistakes that make
// every task train alone (or twice) are stopped here with one message saying what went wrong.
#pragma once

namespace trident {

// See Note [Slurm launch check]. Collective over MPI_COMM_WORLD; call on every rank after MPI_Init.
// Throws trident::Error (bad input, exit 2) identically on every rank of the world when srun's
// tasks are not all in this MPI world; prints a warning (rank 0) when a multi-task job runs
// trident outside srun. Does nothing outside Slurm.
void check_slurm_launch();

}  // namespace trident
