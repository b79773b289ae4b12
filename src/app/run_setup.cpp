#include "app/run_setup.h"

#include <mpi.h>
#include <sched.h>

#include <climits>
#include <cmath>
#include <filesystem>
#include <functional>

#include <fmt/format.h>

#include "trident/check.h"

namespace trident {

void setup_step(const std::function<void()>& step) {
  int code = 0;
  std::string message;
  try {
    step();
  } catch (const Error& e) {
    code = int(e.code());
    message = e.what();
  } catch (const std::exception& e) {
    code = int(ExitCode::kInternal);
    message = e.what();
  }
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  int worst = 0, first_failing = INT_MAX;
  const int mine = code != 0 ? rank : INT_MAX;
  TRIDENT_MPI(MPI_Allreduce(&code, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  TRIDENT_MPI(MPI_Allreduce(&mine, &first_failing, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (worst == 0) return;
  AgreedFailure f;
  f.code = worst;
  f.print = rank == first_failing;
  f.message = world > 1 ? fmt::format("trident: error (rank {}): {}", rank, message)
                        : fmt::format("trident: error: {}", message);
  throw f;
}

std::unique_ptr<ProcessGrid> make_grid(const Deck& deck) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // Compare a hash of the resolved deck: min == max on every rank or the decks differ.
  const unsigned long long h = std::hash<std::string>{}(deck.to_yaml());
  unsigned long long lo = 0, hi = 0;
  TRIDENT_MPI(MPI_Allreduce(&h, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD));
  TRIDENT_MPI(MPI_Allreduce(&h, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD));
  if (lo != hi)
    input_error("the resolved deck differs between ranks (this is rank {}): every rank must be "
                "started with the same deck and --set options",
                rank);
  const ParallelConfig& p = deck.parallel;
  GridSizes sizes;
  sizes.world = world;
  sizes.dp = p.dp;
  sizes.tp = p.tp;
  sizes.pp = p.pp;
  sizes.cp = p.cp;
  sizes.dp_replicate = p.dp_replicate;
  sizes.dp_shard = p.dp_shard;
  const GridLayout layout = complete_layout(sizes);
  auto grid = std::make_unique<ProcessGrid>(layout);
  grid->set_timeout(deck.comm.timeout_s);  // all of the grid's communicators; set only here
  return grid;
}

std::unique_ptr<TraceWriter> make_trace(const Deck& deck, const ProcessGrid& grid) {
  if (deck.log.trace.empty()) return nullptr;
  std::filesystem::path p = deck.log.trace;
  if (grid.world_size() > 1)
    p.replace_filename(p.stem().string() + ".rank" + std::to_string(grid.world_rank()) +
                       p.extension().string());
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  return std::make_unique<TraceWriter>(p.string(), grid.world_rank(), TraceWriter::Clock::now());
}

Run make_run(const Deck& deck, const std::function<double(Backend&)>& measure_peak) {
  Run run;
  setup_step([&] { run.grid = make_grid(deck); });
  setup_step([&] {
    run.backend = make_backend(deck);
    const double peak = measure_peak(*run.backend);
    run.device_comms = make_device_comms(deck, *run.backend, *run.grid);
    run.trace = make_trace(deck, *run.grid);
    run.context = TrainContext{run.backend.get(), peak, run.grid.get(), run.trace.get()};
    attach_device_comms(run.device_comms, run.context);
    // Validates the datasets and model.init_from before anything is written.
    run.trainer = std::make_unique<Trainer>(deck, run.context);
  });
  return run;
}

nlohmann::json step_record(const StepStats& s, const Trainer::MemoryBytes& memory) {
  constexpr double mib = 1024.0 * 1024.0;
  nlohmann::json j = {{"step", s.step},
                      {"loss", s.loss},
                      {"lr", s.lr},
                      {"grad_norm", s.grad_norm},
                      {"tokens_per_s", s.tokens_per_s},
                      {"ms_per_step", s.ms_per_step},
                      {"mfu", s.mfu},
                      {"forward_ms", s.forward_ms},
                      {"backward_ms", s.backward_ms},
                      {"optimizer_ms", s.optimizer_ms},
                      {"comm_ms", s.comm_ms},
                      {"exposed_comm_ms", s.exposed_comm_ms},
                      {"overlap", s.overlap},
                      {"gather_comm_ms", s.gather_comm_ms},
                      {"gather_exposed_ms", s.gather_exposed_ms},
                      {"tp_comm_ms", s.tp_comm_ms},
                      {"tp_exposed_ms", s.tp_exposed_ms},
                      {"bubble", s.pipeline_ms > 0 ? s.pipeline_wait_ms / s.pipeline_ms : 0.0},
                      {"param_mib", memory.params / mib},
                      {"grad_mib", memory.grads / mib},
                      {"grad_resident_mib", memory.grads_resident / mib},
                      {"optimizer_mib", memory.optimizer / mib},
                      {"activation_mib", memory.activations / mib}};
  if (s.cp_comm_ms > 0) {  // context parallelism (Note [Ring attention])
    j["cp_comm_ms"] = s.cp_comm_ms;
    j["cp_exposed_ms"] = s.cp_exposed_ms;
  }
  if (s.moe.choices > 0) {  // mixtures of experts (src/model/moe.h): means over the run's ranks
    j["moe_aux_loss"] = s.moe.aux_loss;
    j["moe_z_loss"] = s.moe.z_loss;
    j["moe_load_max_over_mean"] = s.moe.load_max_over_mean;
    j["moe_load_max_over_mean_by_layer"] = s.moe.layer_load;  // the mixture layers, in order
    j["moe_dropped"] = s.moe.dropped;
    j["moe_dropped_fraction"] = double(s.moe.dropped) / double(s.moe.choices);
    j["a2a_ms"] = s.moe.a2a_ms;
    j["a2a_exposed_ms"] = s.moe.a2a_exposed_ms;
    j["moe_ms"] = s.moe.layer_ms;
    j["moe_route_ms"] = s.moe.route_ms;
  }
  if (s.unit_gathers > 0) {  // ZeRO-3
    j["unit_gathers"] = s.unit_gathers;
    j["late_unit_gathers"] = s.late_unit_gathers;
  }
  if (!std::isnan(s.val_loss)) j["val_loss"] = s.val_loss;
  if (s.skipped) {
    j["skipped"] = true;
    j["skips_in_a_row"] = s.skips_in_a_row;
  }
  return j;
}

int allowed_cores() {
  cpu_set_t set;
  return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
}

CoreCheck check_rank_cores(const Deck& deck) {
  CoreCheck c;
  int mine = allowed_cores();
  if (mine == 0) mine = INT_MAX;  // unknown here: another rank's count stands
  TRIDENT_MPI(MPI_Allreduce(MPI_IN_PLACE, &mine, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  c.cores = mine;
  if (deck.run.backend != "cpu" || mine >= deck.run.threads) return c;
  c.warning = fmt::format(
      "run.threads is {} but a rank may run on only {} core(s) (its CPU affinity: mpirun binds "
      "each rank to one core by default with up to 2 ranks, Slurm to --cpus-per-task), so its "
      "threads share cores and run at about {}/{} of their speed; launch with mpirun "
      "--bind-to none (or --map-by slot:PE={}), or srun --cpus-per-task={}",
      deck.run.threads, mine, mine, deck.run.threads, deck.run.threads, deck.run.threads);
  return c;
}

}  // namespace trident
