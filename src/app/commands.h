// The subcommands of the trident binary. main.cpp parses the command line; each command builds
// the parts it needs and runs. Errors are thrown as trident::Error and turned into exit codes
// by main.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trident {

struct BlasCoreCheck;

struct DeckArgs {
  std::string deck;
  std::vector<std::string> overrides;  // --set key=value, in order
};

struct BenchArgs {
  DeckArgs deck;
  int warmup_steps = 2;
  int steps = 5;
};

struct GenerateArgs {
  DeckArgs deck;
  std::string checkpoint;
  std::string prompt;
  int tokens = 200;
  double temperature = 0.8;  // 0: greedy
  uint64_t seed = 1;
};

struct ExportArgs {
  DeckArgs deck;
  std::string checkpoint;  // empty: the deck's own weights (model.init_from or the seed's)
  std::string format;      // llmc | safetensors
  std::string out;
};

// blas: main's check of the OpenBLAS kernel, for the header (trident/blas_core.h).
int run_train(const DeckArgs& args, const BlasCoreCheck& blas);
// SIGTERM and SIGUSR1 only ask train to stop at the next step boundary (Note [Stop signals]).
// Installed first thing in main, before MPI_Init: a signal during start-up must not kill it.
void install_stop_signal_handlers();
int run_eval(const DeckArgs& args, const std::string& checkpoint);
int run_generate(const GenerateArgs& args);
int run_export(const ExportArgs& args);
int run_ckpt_verify(const std::string& path);
int run_ckpt_inspect(const std::string& path);
int run_bench(const BenchArgs& args, const BlasCoreCheck& blas);
struct GridSizes;  // trident/grid.h
// ep: the expert groups too, laid out as under parallel.zero `zero` (HSDP keeps them in a replica)
int run_grid(const GridSizes& sizes, int ep = 1, int zero = 0);

struct PlanArgs {
  DeckArgs deck;
  std::string hardware;  // a name under inputs/hardware/ or a path
  int gpus = 0;          // ranks (devices) to plan for
  int global_batch = 0;  // sequences per step; 0: the deck's micro_batch·accum·dp
  std::string layout;    // evaluate this one layout only
  bool json = false;     // one JSON object per layout instead of the table
  int top = 10;          // layouts printed
  std::string png;       // a PNG of the top layouts' predicted step split
  // Restrict the search (empty: everything): sizes and options to try.
  std::vector<int> tp, pp, ep, micro, zero, sp, dp_shard;
  std::vector<std::string> recompute, schedules;
  int max_v = 4;
  // The largest model per device count at each ZeRO stage (zero_capacity) instead of a plan.
  bool zero_capacity = false;
  double memory_gb = 0;  // > 0: one device's memory instead of the hardware file's
  // checkpoint.async's snapshot: in a cpu rank's memory and fit; printed (PlanModel).
  bool async_checkpoint = false;
};
// No MPI: a model evaluated on one process (src/plan/, Note [Plan model]).
int run_plan(const PlanArgs& args);

struct CalibrateArgs {
  std::string out;                // empty: <name>.yaml in user_hardware_dir() (trident/plan.h)
  std::string name;               // the description's name; empty: "this-machine"
  int threads = 0;                // 0: every core of the node
  double emulate_gbps = 0;        // also measure the emulated link (comm.emulate_gbps) ...
  double emulate_latency_us = 0;  // ... with this latency
};
// `trident plan --calibrate`: an MPI program (one rank measures GEMMs and memory; with two or
// more ranks the link too). Writes the description and prints its path.
int run_calibrate(const CalibrateArgs& args, const BlasCoreCheck& blas);

}  // namespace trident
