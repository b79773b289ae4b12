// trident: one binary, several subcommands (train, bench, grid). Thin: parse, dispatch, and turn
// errors into one message and an exit status (2 for bad input, 1 otherwise) on every rank.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>

#include "app/commands.h"
#include "app/run_setup.h"
#include "app/slurm_launch.h"
#include "trident/blas_core.h"
#include "trident/check.h"
#include "trident/checkpoint.h"

namespace {

int world_rank_or_zero() {
  int init = 0, fin = 0, rank = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int world_size_or_one() {
  int init = 0, fin = 0, size = 1;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// A failing rank cannot know whether the others fail too, so with more than one rank it ends
// the whole job (MPI_Abort makes mpirun stop every rank with this status): no rank is left
// waiting in a collective.
[[noreturn]] void fail(const std::string& msg, int code) {
  const int size = world_size_or_one();
  if (size > 1)
    std::fprintf(stderr, "trident: error (rank %d): %s\n", world_rank_or_zero(), msg.c_str());
  else std::fprintf(stderr, "trident: error: %s\n", msg.c_str());
  std::fflush(stderr);
  if (size > 1) MPI_Abort(MPI_COMM_WORLD, code);
  if (trident::checkpoint_write_broken()) {  // Note [Leaving after a storage fault]
    std::fflush(stdout);
    std::_Exit(code);
  }
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Finalize();
  std::exit(code);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace trident;
  // First, before any GEMM and before MPI_Init: OpenBLAS chose its kernels when it was loaded,
  // and a fallback is only fixed by executing again (Note [BLAS core check]). Only rank 0
  // prints what happened, in the run header.
  BlasCoreCheck blas = check_blas_core();
  if (blas.action == BlasCoreAction::kReexec) blas.reexec_error = reexec_with_blas_core(blas, argv);

  CLI::App app{"trident: a framework-free GPT trainer for clusters"};
  app.require_subcommand(1);

  DeckArgs train_args;
  auto* train = app.add_subcommand("train", "train a model described by an input deck");
  train->add_option("deck", train_args.deck, "YAML input deck")->required();
  train->add_option("--set", train_args.overrides, "override one deck key: a.b=value")
      ->take_all()
      ->allow_extra_args(false);

  BenchArgs bench_args;
  auto* bench = app.add_subcommand("bench", "time whole training steps; ends with a bench: line");
  bench->add_option("deck", bench_args.deck.deck, "YAML input deck")->required();
  bench->add_option("--set", bench_args.deck.overrides, "override one deck key: a.b=value")
      ->take_all()
      ->allow_extra_args(false);
  bench->add_option("--warmup", bench_args.warmup_steps, "untimed steps first")
      ->check(CLI::NonNegativeNumber);
  bench->add_option("--steps", bench_args.steps, "timed steps (the median is reported)")
      ->check(CLI::PositiveNumber);

  DeckArgs eval_args;
  std::string eval_ckpt;
  auto* eval = app.add_subcommand("eval", "validation loss of a checkpoint");
  eval->add_option("deck", eval_args.deck, "YAML input deck (data.valid, layout)")->required();
  eval->add_option("--ckpt", eval_ckpt, "checkpoint directory (or checkpoint.dir: its latest)")
      ->required();
  eval->add_option("--set", eval_args.overrides, "override one deck key: a.b=value")
      ->take_all()
      ->allow_extra_args(false);

  GenerateArgs gen_args;
  auto* generate = app.add_subcommand("generate", "sample text from a checkpoint (one rank)");
  generate->add_option("deck", gen_args.deck.deck, "YAML input deck")->required();
  generate->add_option("--ckpt", gen_args.checkpoint, "checkpoint directory")->required();
  generate->add_option("--prompt", gen_args.prompt, "text to continue")->required();
  generate->add_option("--tokens", gen_args.tokens, "tokens to sample")->check(CLI::PositiveNumber);
  generate->add_option("--temperature", gen_args.temperature, "0: greedy")
      ->check(CLI::NonNegativeNumber);
  generate->add_option("--seed", gen_args.seed, "sampling seed");
  generate->add_option("--set", gen_args.deck.overrides, "override one deck key: a.b=value")
      ->take_all()
      ->allow_extra_args(false);

  ExportArgs export_args;
  auto* export_cmd = app.add_subcommand(
      "export", "write a checkpoint's weights as llm.c's GPT-2 checkpoint or as Hugging Face "
                "safetensors with config.json (one rank)");
  export_cmd->add_option("deck", export_args.deck.deck, "YAML input deck (the model)")->required();
  export_cmd
      ->add_option("out", export_args.out,
                   "file to write; safetensors: a directory (an existing one, or a path "
                   "ending in /) gets model.safetensors and config.json")
      ->required();
  export_cmd->add_option("--ckpt", export_args.checkpoint,
                         "checkpoint directory (or checkpoint.dir: its latest); without it, the "
                         "deck's own weights (model.init_from, or its seed's initialisation)");
  export_cmd->add_option("--format", export_args.format, "llmc | safetensors")
      ->required()
      ->check(CLI::IsMember({"llmc", "safetensors"}));
  export_cmd->add_option("--set", export_args.deck.overrides, "override one deck key: a.b=value")
      ->take_all()
      ->allow_extra_args(false);

  std::string ckpt_path;
  auto* ckpt = app.add_subcommand("ckpt", "checkpoint tools");
  ckpt->require_subcommand(1);
  auto* verify = ckpt->add_subcommand("verify", "check every shard and checksum; exit 2 if bad");
  verify->add_option("path", ckpt_path, "checkpoint directory (or checkpoint.dir)")->required();
  auto* inspect = ckpt->add_subcommand("inspect", "layout, step and tensors of a checkpoint");
  inspect->add_option("path", ckpt_path, "checkpoint directory (or checkpoint.dir)")->required();

  GridSizes grid_sizes;
  auto* grid = app.add_subcommand("grid", "print each rank's place and groups; no MPI needed");
  grid->add_option("--world", grid_sizes.world, "number of ranks")
      ->required()
      ->check(CLI::PositiveNumber);
  grid->add_option("--dp", grid_sizes.dp, "data-parallel size (0: world / (tp*pp*cp))");
  grid->add_option("--dp-replicate", grid_sizes.dp_replicate,
                   "replicas of the sharded data-parallel group (dp = dp_replicate * dp_shard)")
      ->check(CLI::PositiveNumber);
  grid->add_option("--dp-shard", grid_sizes.dp_shard,
                   "data-parallel ranks inside one replica (0: dp / dp_replicate)");
  grid->add_option("--cp", grid_sizes.cp, "context-parallel size")->check(CLI::PositiveNumber);
  int grid_ep = 1;
  grid->add_option("--ep", grid_ep, "expert-parallel size (ranks of dp × cp)")
      ->check(CLI::PositiveNumber);
  int grid_zero = 0;
  grid->add_option("--zero", grid_zero,
                   "ZeRO stage: with --dp-replicate > 1 the experts shard within a replica")
      ->check(CLI::Range(0, 3));
  grid->add_option("--tp", grid_sizes.tp, "tensor-parallel size")->check(CLI::PositiveNumber);
  grid->add_option("--pp", grid_sizes.pp, "pipeline-parallel size")->check(CLI::PositiveNumber);

  PlanArgs plan_args;
  CalibrateArgs calibrate_args;
  bool calibrate = false;
  auto* plan = app.add_subcommand(
      "plan", "predict step time and memory of layouts and rank them (no MPI); --calibrate "
              "measures this machine into a hardware file (under mpirun for the link)");
  plan->add_option("deck", plan_args.deck.deck, "YAML input deck (the model)");
  plan->add_option("--set", plan_args.deck.overrides, "override one deck key: a.b=value")
      ->take_all()
      ->allow_extra_args(false);
  plan->add_option("--hardware", plan_args.hardware,
                   "a path, or NAME: your calibration (--calibrate writes it), else "
                   "inputs/hardware/NAME.yaml");
  plan->add_option("--gpus", plan_args.gpus, "devices (ranks) to plan for")
      ->check(CLI::PositiveNumber);
  plan->add_option("--global-batch", plan_args.global_batch, "sequences per step")
      ->check(CLI::PositiveNumber);
  plan->add_option("--layout", plan_args.layout,
                   "one layout: dp=..,tp=..,pp=..,v=..,micro=..,zero=..,recompute=..");
  plan->add_flag("--json", plan_args.json, "one JSON object per layout");
  plan->add_option("--top", plan_args.top, "layouts printed")->check(CLI::PositiveNumber);
  plan->add_option("--png", plan_args.png, "draw the top layouts' predicted step split");
  plan->add_option("--tp", plan_args.tp, "search: only these tp sizes")->delimiter(',');
  plan->add_option("--pp", plan_args.pp, "search: only these pp sizes")->delimiter(',');
  plan->add_option("--ep", plan_args.ep, "search: only these expert-parallel sizes (mixtures)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  plan->add_option("--micro", plan_args.micro, "search: micro-batch sizes (default 1,2,4,8)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  plan->add_option("--zero", plan_args.zero, "search: ZeRO stages (default 0,1,2,3)")
      ->delimiter(',')
      ->check(CLI::Range(0, 3));
  plan->add_option("--dp-shard", plan_args.dp_shard,
                   "search: ZeRO-3 shard sizes (default dp and the in-node HSDP splits)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  plan->add_flag("--zero-capacity", plan_args.zero_capacity,
                 "the largest model that fits per device count at ZeRO 0-3 (no activations)");
  plan->add_option("--memory-gb", plan_args.memory_gb, "one device's memory (default: the file's)")
      ->check(CLI::PositiveNumber);
  plan->add_flag(
      "--async-checkpoint", plan_args.async_checkpoint,
      "as the deck's checkpoint.async: true: count the save's host snapshot (cpu: in each "
      "rank's memory) "
      "and print its size and copy time");
  plan->add_option("--sp", plan_args.sp, "search: sequence parallelism 0,1 with tp > 1")
      ->delimiter(',')
      ->check(CLI::Range(0, 1));
  plan->add_option("--recompute", plan_args.recompute, "search: none,mlp,full")
      ->delimiter(',')
      ->check(CLI::IsMember({"none", "mlp", "full"}));
  plan->add_option("--schedules", plan_args.schedules, "search: 1f1b,interleaved,zb-h1,gpipe")
      ->delimiter(',')
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved", "zb-h1"}));
  plan->add_option("--max-v", plan_args.max_v, "search: most virtual stages (interleaved)")
      ->check(CLI::PositiveNumber);
  plan->add_flag("--calibrate", calibrate, "measure this machine; write a hardware file");
  plan->add_option("--out", calibrate_args.out,
                   "--calibrate: the file to write (default: NAME.yaml in $TRIDENT_HARDWARE_DIR, "
                   "else ${XDG_DATA_HOME:-~/.local/share}/trident/hardware)");
  plan->add_option("--name", calibrate_args.name, "--calibrate: the description's name");
  plan->add_option("--threads", calibrate_args.threads, "--calibrate: threads (0: all cores)")
      ->check(CLI::NonNegativeNumber);
  plan->add_option("--emulate-gbps", calibrate_args.emulate_gbps,
                   "--calibrate: measure the emulated link too (comm.emulate_gbps)")
      ->check(CLI::NonNegativeNumber);
  plan->add_option("--emulate-latency-us", calibrate_args.emulate_latency_us,
                   "--calibrate: the emulated link's latency")
      ->check(CLI::NonNegativeNumber);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : int(ExitCode::kBadInput);
  }
  if (*train) install_stop_signal_handlers();

  try {
    if (*grid) return run_grid(grid_sizes, grid_ep, grid_zero);
    if (*plan && !calibrate) {
      if (plan_args.deck.deck.empty() || plan_args.hardware.empty())
        input_error("trident plan needs a deck and --hardware NAME (or --calibrate)");
      return run_plan(plan_args);
    }
    // Training commands are MPI programs; MPI_THREAD_MULTIPLE because the communication thread
    // and the compute thread both call MPI (on different communicators).
    // Open MPI's nonblocking all-reduce (what the communication thread uses) defaults to a
    // binomial tree for in-place buffers; the ring algorithm is faster for gradient-sized
    // buffers (docs/perf.md). A user's own setting wins.
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", /*overwrite=*/0);
    // ZeRO's reduce-scatter is one nonblocking reduce per block owner
    // (Note [Reduce-scatter as reduces]); libnbc's default for them, a chain of small
    // fragments, needs a progress call per fragment; the binomial tree moves each piece in one
    // message (docs/perf.md, "ZeRO"). A user's own setting wins.
    setenv("OMPI_MCA_coll_libnbc_ireduce_algorithm", "2", /*overwrite=*/0);
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    if (provided < MPI_THREAD_MULTIPLE)
      fail(fmt::format("MPI_Init_thread: this MPI provides thread level {} but trident needs "
                       "MPI_THREAD_MULTIPLE ({})",
                       provided, MPI_THREAD_MULTIPLE),
           int(ExitCode::kInternal));
    setup_step(check_slurm_launch);  // Note [Slurm launch check]
    int rc = 0;
    if (*train) rc = run_train(train_args, blas);
    if (*bench) rc = run_bench(bench_args, blas);
    if (*eval) rc = run_eval(eval_args, eval_ckpt);
    if (*generate) rc = run_generate(gen_args);
    if (*export_cmd) rc = run_export(export_args);
    if (*verify) rc = run_ckpt_verify(ckpt_path);
    if (*inspect) rc = run_ckpt_inspect(ckpt_path);
    if (*plan && calibrate) rc = run_calibrate(calibrate_args, blas);
    MPI_Finalize();
    return rc;
  } catch (const AgreedFailure& f) {
    // Every rank knows; each exits on its own with the agreed status.
    if (f.print) std::fprintf(stderr, "%s\n", f.message.c_str());
    if (trident::checkpoint_write_broken()) {  // Note [Leaving after a storage fault]
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(f.code);
    }
    MPI_Finalize();
    return f.code;
  } catch (const Error& e) {
    fail(e.what(), int(e.code()));
  } catch (const std::exception& e) {
    fail(e.what(), int(ExitCode::kInternal));
  }
}
