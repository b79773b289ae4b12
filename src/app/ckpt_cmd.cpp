// `trident ckpt verify PATH` and `trident ckpt inspect PATH`.
#include <mpi.h>

#include <fmt/format.h>

#include "app/commands.h"
#include "app/run_setup.h"
#include "trident/checkpoint.h"

namespace trident {

int run_ckpt_verify(const std::string& path) {
  std::string resolved;
  setup_step([&] {
    resolved = resolve_checkpoint(path);
    verify_checkpoint(resolved, MPI_COMM_WORLD);
  });
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    const CheckpointMeta meta = read_checkpoint_meta(resolved);
    fmt::print("ok: {}: step {}, run {}, every shard and checksum verified\n", resolved, meta.step,
               meta.run_id);
  }
  return 0;
}

int run_ckpt_inspect(const std::string& path) {
  std::string text;
  setup_step([&] { text = describe_checkpoint(resolve_checkpoint(path)); });
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) fmt::print("{}", text);
  return 0;
}

}  // namespace trident
