// What train and bench share: the run's parts built from the deck (make_run: the grid, a check
// that every rank read the same deck, the backend, the per-rank trace file, the Trainer).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "app/backend_factory.h"
#include "trident/deck.h"
#include "trident/grid.h"
#include "trident/trace.h"
#include "trident/train.h"

namespace trident {

// A setup step that failed on at least one rank, agreed on by all of them: every rank exits
// with `code`; only the lowest failing rank prints `message` (the whole line).
struct AgreedFailure {
  int code = 1;
  bool print = false;
  std::string message;
};

// Runs one setup step (reading the deck, building the grid, opening data) on every rank and
// agrees on the outcome with one all-reduce, so bad input ends every rank with one message and
// the same exit status — no abort, no hang. `step` may call collectives only if every rank
// reaches it (i.e. all earlier steps succeeded everywhere). Throws AgreedFailure.
void setup_step(const std::function<void()>& step);

// Builds the process grid over MPI_COMM_WORLD from parallel.{dp,tp,pp,cp,dp_replicate,dp_shard}
// (complete_layout: dp 0 and dp_shard 0 derived). Refuses, identically on every rank, a layout
// that does not fit, or a deck that differs between ranks (the ranks would otherwise issue
// different collectives and hang).
std::unique_ptr<ProcessGrid> make_grid(const Deck& deck);

// log.trace with ".rank<r>" before the extension when there is more than one rank; null when
// log.trace is empty.
std::unique_ptr<TraceWriter> make_trace(const Deck& deck, const ProcessGrid& grid);

// A run's parts, built by make_run. Destroyed in reverse: the Trainer before what it uses.
struct Run {
  std::unique_ptr<ProcessGrid> grid;
  std::unique_ptr<Backend> backend;
  DeviceComms device_comms;
  std::unique_ptr<TraceWriter> trace;
  TrainContext context;  // what the Trainer was given
  std::unique_ptr<Trainer> trainer;
};
// Builds a run from a resolved deck in two agreed setup steps (setup_step): the grid, then the
// backend, the GEMM peak MFU is reported against (measure_peak, FLOP/s per rank: train measures
// briefly, bench carefully), the device communicators, the trace and the Trainer. Bad input
// ends every rank with one message (AgreedFailure).
Run make_run(const Deck& deck, const std::function<double(Backend&)>& measure_peak);

// Note [Threads and binding]
// A CPU rank's run.threads run on the cores its affinity allows, and launchers bind tightly
// (mpirun: one core per rank for up to two ranks; Slurm: --cpus-per-task), so a rank asked for 2
// threads may run both on one core, at half speed, silently. So train and bench count every
// rank's allowed cores (sched_getaffinity), agree over the world, print the fewest as cores=
// beside threads=, and warn, naming the launch fix, when a rank has fewer cores than threads.

// Cores the calling thread may run on (its affinity: the launcher's binding); 0 if unknown.
int allowed_cores();
struct CoreCheck {
  int cores = 0;        // the fewest cores any rank may run on
  std::string warning;  // empty when every rank has a core per thread
};
// See Note [Threads and binding]. Collective over MPI_COMM_WORLD; a device backend is not checked.
CoreCheck check_rank_cores(const Deck& deck);

// One step's line of metrics.jsonl (train and bench write the same fields; README lists them),
// with this rank's memory (Trainer::memory_bytes) in MiB. log.tensorboard writes the same.
nlohmann::json step_record(const StepStats& s, const Trainer::MemoryBytes& memory);

}  // namespace trident
