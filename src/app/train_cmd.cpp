// `trident train DECK [--set k=v]...`: the step loop with progress, metrics and validation.
#include <mpi.h>

#include <fmt/format.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "app/backend_factory.h"
#include "app/commands.h"
#include "app/gemm_peak.h"
#include "app/run_setup.h"
#include "io/tensorboard.h"
#include "train/checkpoint_saver.h"
#include "trident/check.h"
#include "trident/checkpoint.h"
#include "trident/metrics.h"
#include "trident/peak_check.h"
#include "trident/train.h"

namespace trident {
namespace fs = std::filesystem;

namespace {

// Note [Stop signals]
// SIGTERM and SIGUSR1 (what Slurm sends before the time limit) only set a flag; at the next
// step boundary every rank learns whether any rank got one (an all-reduce), and then all of
// them save a checkpoint and exit 0 together.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

// Through the grid's world communicator, so a rank that stopped answering ends the job after
// comm.timeout_s here too instead of hanging. Also counts the ranks whose checkpoint writer is
// still writing (Note [Background commit]) and those whose step ran above their GEMM peak.
struct Boundary {
  bool signalled = false;
  bool writes_ended = true;  // no rank's writer is still writing
  bool peak_low = false;  // some rank's step ran above its GEMM peak (Note [Peak measured again])
};
Boundary agree_at_boundary(ProcessGrid& grid, const CheckpointSaver& saver, bool peak_low) {
  int flags[3] = {g_stop_signal != 0 ? 1 : 0, saver.writing() ? 1 : 0, peak_low ? 1 : 0};
  grid.world().all_reduce(flags, 3).wait();
  return {flags[0] != 0, flags[1] == 0, flags[2] != 0};
}

// A fresh run's id: rank 0 draws it, every rank gets the same.
std::string new_run_id() {
  char id[17] = {};
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    std::random_device rd;
    const unsigned long long v = (static_cast<unsigned long long>(rd()) << 32) ^ rd();
    std::snprintf(id, sizeof(id), "%016llx", v);
  }
  TRIDENT_MPI(MPI_Bcast(id, 17, MPI_CHAR, 0, MPI_COMM_WORLD));
  return id;
}

// Note [Run state file]
// Rank 0 writes run.out_dir/run_state.json when train ends, so a batch script can tell "done"
// from "stopped by a signal, resume me" without parsing the log (exit status is 0 for both, as
// Slurm and users expect). It is removed at start-up, so a stale one never speaks for this
// run. Written to a temporary name and renamed: never half a file.
void write_run_state(const fs::path& out_dir, const char* state, const char* reason, int step,
                     int steps, const std::string& checkpoint) {
  const nlohmann::json j = {{"state", state},
                            {"reason", reason},
                            {"step", step},
                            {"steps", steps},
                            {"checkpoint", checkpoint}};
  const fs::path tmp = out_dir / "run_state.json.tmp";
  {
    std::ofstream f(tmp);
    f << j.dump() << "\n";
    if (!f.flush())
      throw Error(fmt::format("cannot write {}: {}", tmp.string(), std::strerror(errno)),
                  ExitCode::kInternal);
  }
  fs::rename(tmp, out_dir / "run_state.json");
}

// Note [A damaged latest]
// A `latest` that fails to load (a shard missing, truncated or with a bad CRC) stops the run
// with exit 2, as Megatron and DeepSpeed do; trident does not fall back to an older checkpoint
// by itself, which would silently redo steps and hide the damage. The message ends with the
// way back: the newest older step_* directory of checkpoint.dir, and the command that points
// `latest` at it.
std::string previous_checkpoint_hint(const std::string& dir, const std::string& damaged) {
  const fs::path p = previous_checkpoint(dir, damaged);
  if (p.empty()) return "";
  return fmt::format(". The previous checkpoint is {}: check it with `trident ckpt verify {}`, "
                     "then `ln -sfn {} {}` resumes from it",
                     p.string(), p.string(), p.filename().string(),
                     (fs::path(dir) / "latest").string());
}

std::string format_eta(double seconds) {
  if (seconds < 120) return fmt::format("{:.0f} s", seconds);
  if (seconds < 7200) return fmt::format("{:.1f} min", seconds / 60);
  return fmt::format("{:.1f} h", seconds / 3600);
}

}  // namespace

void install_stop_signal_handlers() {
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGUSR1, on_stop_signal);
}

int run_train(const DeckArgs& args, const BlasCoreCheck& blas) {
  // Setup in agreed steps (see setup_step): bad input stops every rank with one message.
  Deck deck;
  setup_step([&] { deck = load_deck(args.deck, args.overrides); });
  std::string note;
  GPTConfig shape;
  setup_step([&] { shape = model_config_from_deck(deck, &note); });
  CheckedPeak peak;
  int node_ranks = 1;
  Run run = make_run(deck, [&](Backend& backend) {
    // As carefully as the steps need (Note [Train's GEMM peak]): this rank's share of a step.
    const double step_flops = shape.train_flops_per_token(deck.model.seq_len) *
                              deck.train.micro_batch * deck.model.seq_len * deck.train.accum /
                              (deck.parallel.tp * deck.parallel.pp * deck.parallel.cp);
    node_ranks = ranks_on_this_node();
    peak = check_gemm_peak(measure_train_gemm_peak(backend, step_flops), backend, blas, node_ranks);
    // A test's way to a start-up peak measured far too low (Note [Peak measured again]).
    if (const char* f = std::getenv("TRIDENT_FAULT_PEAK_SCALE"); f && peak.flops > 0)
      peak.flops *= std::atof(f);
    return peak.flops;
  });
  ProcessGrid* grid = run.grid.get();
  Backend* backend = run.backend.get();
  const std::unique_ptr<TraceWriter>& trace = run.trace;
  Trainer& trainer = *run.trainer;
  const bool lead = grid->world_rank() == 0;

  // Checkpoints: one run per checkpoint.dir (a lock held by rank 0), then resume if asked.
  const CheckpointConfig& ck = deck.checkpoint;
  std::unique_ptr<CheckpointDirLock> lock;
  std::string resume_from;
  setup_step([&] {
    if (ck.dir.empty()) {
      if (ck.resume == "true")
        input_error("checkpoint.resume: true needs checkpoint.dir (it is empty)");
      return;
    }
    if (lead) lock = std::make_unique<CheckpointDirLock>(ck.dir);
    if (ck.resume != "false") resume_from = latest_checkpoint(ck.dir);
    if (ck.resume == "true" && resume_from.empty())
      input_error("checkpoint.resume: true, but checkpoint.dir {} has no checkpoint (no "
                  "'latest')",
                  ck.dir);
  });
  int first_step = 0;
  std::string run_id;
  if (!resume_from.empty()) {
    CheckpointMeta meta;
    setup_step([&] {
      try {
        meta = trainer.load(resume_from);
      } catch (const Error& e) {  // Note [A damaged latest]
        if (e.code() != ExitCode::kBadInput) throw;
        throw Error(e.what() + previous_checkpoint_hint(ck.dir, resume_from), e.code());
      }
    });
    first_step = int(meta.step);
    run_id = meta.run_id;
    if (lead)
      fmt::print("resumed from {} (step {}, run {}, saved by dp {} x tp {} x pp {})\n", resume_from,
                 meta.step, meta.run_id, meta.dp, meta.tp, meta.pp);
  } else {
    run_id = new_run_id();
    if (lead && ck.resume == "auto" && !ck.dir.empty())
      fmt::print("checkpoint.resume: auto, but {} has no checkpoint yet: starting from step 0\n",
                 ck.dir);
  }
  const int end_step =
      deck.train.stop_at > 0 ? std::min(deck.train.stop_at, deck.train.steps) : deck.train.steps;
  // Note [Asynchronous checkpoints]: with checkpoint.async the saves are written in the
  // background; `report` tells what ended, once every rank knows.
  CheckpointSaver saver(trainer, *backend, ck, deck.comm.timeout_s, run_id);
  std::string saved_path;
  struct Reported {
    double write_ms = 0;
    std::string error;  // the first failure's message
    bool stop = false;  // a failure that ends the run (checkpoint.on_error, or the last save)
    void add(const Reported& o) {
      write_ms += o.write_ms;
      if (error.empty()) error = o.error;
      stop = stop || o.stop;
    }
  };
  auto report = [&](bool last_save) {
    Reported r;
    for (const SaveOutcome& o : saver.take_finished()) {
      r.write_ms += o.write_ms;
      if (o.ok()) {
        saved_path = o.path;
        if (lead)
          fmt::print("checkpoint: {} ({}, {:.2f} s{})\n", o.path, o.why, o.write_ms / 1e3,
                     saver.async() ? " written in the background" : "");
        continue;
      }
      if (o.code != ExitCode::kBadInput) throw Error(o.error, o.code);  // a timeout: the job ends
      const std::string prev = latest_checkpoint(ck.dir);
      if (lead)
        fmt::print("WARNING: checkpoint of step {} ({}) failed: {}; latest is still {}\n", o.step,
                   o.why, o.error, prev.empty() ? "none" : prev);
      if (r.error.empty())
        r.error = fmt::format("checkpoint of step {} failed: {}", o.step, o.error);
      r.stop = r.stop || ck.on_error == "stop" || last_save;
    }
    return r;
  };
  // A stop: the run's end or a signal. The last save waits for its write (and the one before).
  auto final_save = [&](int steps_done, const char* why, double* block_ms) {
    if (ck.dir.empty()) return Reported{};
    *block_ms += saver.save(steps_done, why, /*last=*/true);
    *block_ms += saver.wait();
    return report(/*last_save=*/true);
  };
  auto stop_on_failure = [&](const Reported& r) {
    if (!r.stop) return;
    throw AgreedFailure{
        int(ExitCode::kBadInput), lead,
        fmt::format("trident: error: {} (checkpoint.on_error: {}{})", r.error, ck.on_error,
                    ck.on_error == "continue" ? "; the last save" : "")};
  };
  if (lead) {
    fmt::print("{}\n", deck.to_yaml());
    if (!note.empty()) fmt::print("{}\n", note);
  }

  const fs::path out_dir = deck.run.out_dir;
  const fs::path metrics_path = out_dir / deck.log.jsonl;
  std::unique_ptr<JsonlWriter> metrics;
  std::unique_ptr<TensorBoardWriter> tensorboard;
  const CoreCheck cores = check_rank_cores(deck);  // Note [Threads and binding]
  // A new event file per run start; a directory that cannot be made stops every rank.
  setup_step([&] {
    if (lead && !deck.log.tensorboard.empty())
      tensorboard = std::make_unique<TensorBoardWriter>(deck.log.tensorboard, first_step);
  });
  if (lead) {
    fs::create_directories(metrics_path.parent_path());
    fs::create_directories(out_dir);
    fs::remove(out_dir / "run_state.json");  // Note [Run state file]
    std::ofstream(out_dir / "deck.yaml") << deck.to_yaml();
    // A resumed run continues its metrics file.
    metrics = std::make_unique<JsonlWriter>(metrics_path.string(), /*append=*/first_step > 0);
    const GridLayout& g = grid->layout();
    const std::string dp_split =  // HSDP's split of dp, when there is one
        g.dp_replicate > 1
            ? fmt::format(" (dp_replicate {} x dp_shard {})", g.dp_replicate, g.dp_shard)
            : "";
    const std::string layout = fmt::format(
        "model: {} layers, d_model {}, {} heads, vocab {} (padded {}), {:.2f} M parameters\n"
        "batch: {} tokens/step ({} micro-batch x {} seq x {} accum x {} dp), {} steps\n"
        "ranks: {} (dp {}{} x tp {} x pp {}), backend {} with {} threads per rank on {} allowed "
        "core(s), GEMM peak {:.1f} GFLOP/s per rank, blas_core={}\n",
        shape.layers, shape.channels, shape.heads, shape.vocab, shape.padded_vocab,
        trainer.model().num_params() / 1e6, trainer.tokens_per_step(), deck.train.micro_batch,
        deck.model.seq_len, deck.train.accum, trainer.dp_size(), deck.train.steps,
        grid->world_size(), g.dp, dp_split, g.tp, g.pp, backend->name(), backend->threads(),
        cores.cores, peak.measured_flops / 1e9, blas.chosen);
    fmt::print("{}", layout);
    if (tensorboard) {  // the texts once per run start
      tensorboard->write_code_text(first_step, "run/deck", deck.to_yaml());
      tensorboard->write_code_text(first_step, "run/layout", layout);
      fmt::print("tensorboard: {}\n", tensorboard->path());
    }
    if (const std::string n = blas_core_note(blas); !n.empty()) fmt::print("{}\n", n);
    if (!cores.warning.empty()) fmt::print("WARNING: {}\n", cores.warning);
    if (!peak.problem.empty()) fmt::print("WARNING: {}\n", peak.problem);
  }

  const auto t_start = std::chrono::steady_clock::now();
  StepStats last;
  bool mfu_warned = false;
  int peak_measurements = 0;  // since start-up (Note [Peak measured again])
  bool stopped_by_signal = false;
  int steps_done = first_step;
  for (int step = first_step; step < end_step; ++step) {
    const bool writing_during = saver.writing();  // the step overlaps a background write
    StepStats s = trainer.train_step(step);
    steps_done = step + 1;
    const bool last_step = step + 1 == deck.train.steps;
    if (deck.train.val_every > 0 && (s.step % deck.train.val_every == 0 || last_step))
      s.val_loss = trainer.validate();
    // Checkpoints before the record, so that it carries what this step boundary did.
    // An MFU left out for being above 1 (not for a skipped step or a missing peak).
    const auto above_peak = [&] {
      return !s.skipped && trainer.peak_flops() > 0 && std::isnan(s.mfu);
    };
    const Boundary at = agree_at_boundary(*grid, saver, above_peak());  // Note [Stop signals]
    if (at.peak_low && peak_measurements < kMaxPeakMeasurements) {
      ++peak_measurements;
      const double before = trainer.peak_flops();
      trainer.set_peak_flops(measure_gemm_peak_again(*backend, before, blas, node_ranks));
      s.mfu = trainer.mfu_of(s);
      if (lead)
        fmt::print("note: a step ran above the GEMM peak of {:.1f} GFLOP/s per rank (step {}: "
                   "{:.1f} GFLOP/s per rank), so it was measured again ({} of {}): {:.1f} "
                   "GFLOP/s per rank\n",
                   before / 1e9, s.step, s.model_flops_per_s / grid->world_size() / 1e9,
                   peak_measurements, kMaxPeakMeasurements, trainer.peak_flops() / 1e9);
    }
    double block_ms = 0;
    Reported saved = at.writes_ended ? report(false) : Reported{};
    if (at.signalled) {
      stopped_by_signal = true;
      saved.add(final_save(steps_done, "stop signal", &block_ms));
    } else if (ck.every > 0 && !ck.dir.empty() && steps_done % ck.every == 0 &&
               steps_done != end_step) {
      // One save at a time: the write in flight ends first, on every rank, so its outcome is
      // reported here alike; an async save's own outcome comes at a later boundary.
      block_ms += saver.wait();
      saved.add(report(false));
      if (!saved.stop) {  // a failure that stops the run saves nothing more
        block_ms += saver.save(steps_done, "every");
        if (!saver.async()) saved.add(report(false));
      }
    }
    if (lead) {
      if (!s.warning.empty()) fmt::print("WARNING: {}\n", s.warning);
      // Still above 1 after measuring again: the peak it is measured against is too low.
      if (above_peak() && !mfu_warned) {
        mfu_warned = true;
        fmt::print("WARNING: MFU came out above 1 at step {} against the GEMM peak of {:.1f} "
                   "GFLOP/s per rank, measured {} time(s) (blas_core={}): it was measured low "
                   "(a busy machine, or a kernel change since); MFU is not reported. `trident "
                   "bench` measures it carefully.\n",
                   s.step, trainer.peak_flops() / 1e9, 1 + peak_measurements, blas.chosen);
      }
      nlohmann::json record = step_record(s, trainer.memory_bytes());
      if (!ck.dir.empty()) {                                      // Note [Asynchronous checkpoints]
        record["ckpt_block_ms"] = block_ms + s.snapshot_wait_ms;  // Note [Deferred host snapshot]
        record["ckpt_write_ms"] = saved.write_ms;
        record["ckpt_writing"] = writing_during ? 1 : 0;
        if (!saved.error.empty()) {
          record["ckpt_failed"] = 1;
          record["ckpt_error"] = saved.error;
        }
      }
      metrics->write(record);
      if (tensorboard) {
        tensorboard->write_step(record);
        if (!saved.error.empty()) tensorboard->write_code_text(s.step, "ckpt/error", saved.error);
      }
      if (s.skipped) {  // Note [Non-finite steps]: always shown
        fmt::print("step {:>5}/{} | skipped: loss {:.4f}, norm {:.3f} not finite; no update "
                   "({} in a row, train.max_skips {})\n",
                   s.step, deck.train.steps, s.loss, s.grad_norm, s.skips_in_a_row,
                   deck.train.max_skips);
        std::fflush(stdout);
      } else if (s.step % deck.log.every == 0 || last_step || step == first_step ||
                 s.step == end_step) {
        const double elapsed =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
        const double eta = elapsed / (s.step - first_step) * (end_step - s.step);
        std::string val = std::isnan(s.val_loss) ? "" : fmt::format(" | val {:.4f}", s.val_loss);
        std::string comm =
            trainer.dp_size() > 1
                ? fmt::format(" | comm {:.1f} ms, exposed {:.1f} ms", s.comm_ms, s.exposed_comm_ms)
                : "";
        fmt::print("step {:>5}/{} | loss {:.4f}{} | lr {:.2e} | norm {:.3f} | {:.1f} ms | "
                   "{:.0f} tok/s | mfu {}{} | eta {}\n",
                   s.step, deck.train.steps, s.loss, val, s.lr, s.grad_norm, s.ms_per_step,
                   s.tokens_per_s, format_mfu_percent(s.mfu), comm, format_eta(eta));
        std::fflush(stdout);
      }
    }
    last = s;
    stop_on_failure(saved);
    if (stopped_by_signal) break;
  }
  const char* reason = stopped_by_signal               ? "stop signal"
                       : steps_done < deck.train.steps ? "stop_at"
                                                       : "end";
  if (!stopped_by_signal) {
    double block_ms = 0;
    stop_on_failure(final_save(steps_done, reason, &block_ms));
  }
  if (lead)
    write_run_state(out_dir, steps_done < deck.train.steps ? "stopped" : "done", reason, steps_done,
                    deck.train.steps, saved_path);
  if (trace) {
    trace->write();
    if (lead) fmt::print("trace: {} (one file per rank; open in Perfetto)\n", trace->path());
  }
  if (lead)
    fmt::print("{}: {} steps, final loss {:.4f}{}; metrics in {}, resolved deck in {}\n",
               stopped_by_signal ? "stopped by signal" : "done", steps_done, last.loss,
               std::isnan(last.val_loss) ? "" : fmt::format(", val loss {:.4f}", last.val_loss),
               metrics_path.string(), (out_dir / "deck.yaml").string());
  return 0;
}

}  // namespace trident
