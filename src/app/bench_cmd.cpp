// `trident bench DECK`: times whole training steps (forward, backward, optimizer) after warm-up,
// on a device backend also one step's per-op device times (CUDA events), and ends with one
// machine-readable line: `bench: key=value ...` (medians over the timed steps,
// as seen by rank 0; with data parallelism every rank runs the same steps).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "app/backend_factory.h"
#include "app/commands.h"
#include "app/gemm_peak.h"
#include "app/run_setup.h"
#include "io/tensorboard.h"
#include "trident/metrics.h"
#include "trident/peak_check.h"
#include "trident/pipeline.h"
#include "trident/train.h"

namespace trident {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int run_bench(const BenchArgs& args, const BlasCoreCheck& blas) {
  Deck deck;
  setup_step([&] {
    deck = load_deck(args.deck.deck, args.deck.overrides);
    deck.train.steps = std::max(deck.train.steps, args.warmup_steps + args.steps);
  });
  // Measured carefully (best of several runs) before the model is built and, on the CPU, again
  // after the steps; the larger is kept, so a noisy moment cannot shrink the denominator and
  // inflate MFU. A device measures only before: after the steps its GEMM's 768 MiB would sit
  // beside the model's memory, outside the memory plan (Note [Memory plan]). Then checked
  // (check_gemm_peak): a peak implausible for the hardware gives no MFU, not a wrong one.
  double peak = 0;
  int node_ranks = 1;
  // Device memory this run takes (device backends): free before the model, less the least
  // free after any step (cudaMemGetInfo; scratch only grows, so after-step samples see it).
  size_t free_before = 0, least_free = SIZE_MAX;
  Run run = make_run(deck, [&](Backend& backend) {
    node_ranks = ranks_on_this_node();
    peak = backend.measure_gemm_peak_flops();
    free_before = backend.is_device() ? backend.free_memory_bytes() : 0;
    return peak;
  });
  ProcessGrid* grid = run.grid.get();
  Backend* backend = run.backend.get();
  const std::unique_ptr<TraceWriter>& trace = run.trace;
  Trainer& trainer = *run.trainer;
  const bool lead = grid->world_rank() == 0;
  const double nominal = backend->nominal_peak_flops();
  const CoreCheck cores = check_rank_cores(deck);  // Note [Threads and binding]
  if (lead) {
    if (backend->is_device())
      fmt::print("bench: measured cuBLASLt bf16 GEMM peak {:.1f} TFLOP/s (8192³, fp32 "
                 "accumulate; per rank; before the model is built); "
                 "nominal dense bf16 peak {:.0f} TFLOP/s\n",
                 peak / 1e12, nominal / 1e12);
    else
      fmt::print("bench: measured sgemm peak {:.1f} GFLOP/s with {} threads, 2048³, best of "
                 "5-10 runs (per rank; measured again after the steps, the larger is used); "
                 "blas_core={}\n",
                 peak / 1e9, backend->threads(), blas.chosen);
    if (const std::string n = blas_core_note(blas); !n.empty()) fmt::print("bench: {}\n", n);
    if (!cores.warning.empty()) fmt::print("bench: WARNING: {}\n", cores.warning);
  }
  const GPTConfig& cfg = trainer.model_config();

  // Note [Bench files]
  // Besides its `bench:` line, bench writes run.out_dir/metrics.jsonl (every step, as train
  // does, with "timed": false for warm-up) and run.out_dir/bench.json (the line's keys and
  // values, numbers unrounded; mfu null when not reported), so a scaling study reads figures,
  // not log text, and anyone can recompute the medians from the steps.
  std::unique_ptr<JsonlWriter> metrics;
  std::unique_ptr<TensorBoardWriter> tensorboard;
  const std::filesystem::path out_dir = deck.run.out_dir;
  if (lead) {
    std::filesystem::create_directories(out_dir);
    metrics = std::make_unique<JsonlWriter>((out_dir / deck.log.jsonl).string());
  }
  setup_step([&] {  // the deck, the steps as train writes them, then the figures
    if (!lead || deck.log.tensorboard.empty()) return;
    tensorboard = std::make_unique<TensorBoardWriter>(deck.log.tensorboard, 0);
    tensorboard->write_code_text(0, "run/deck", deck.to_yaml());
  });
  std::vector<double> ms, fwd, bwd, opt, comm, comm_cpu, exposed, overlap, tp_comm, tp_exposed,
      cp_comm, cp_exposed, bubble, gather, gather_exposed, held_wait, runner;
  // Per-op device time (device backends): measured on one extra step after the timed ones, so
  // the events around every op do not slow the timed steps.
  const int total_steps = args.warmup_steps + args.steps;
  for (int i = 0; i < total_steps + (backend->is_device() ? 1 : 0); ++i) {
    const bool op_step = i == total_steps;
    backend->set_op_timing(op_step);
    StepStats s = trainer.train_step(i);
    if (lead && !s.warning.empty()) fmt::print("WARNING: {}\n", s.warning);
    if (backend->is_device()) least_free = std::min(least_free, backend->free_memory_bytes());
    if (op_step) {
      const auto layers = backend->take_range_times_ms();
      const auto ops = backend->take_op_times_ms();
      backend->set_op_timing(false);
      double total = 0;
      for (const Backend::DeviceTime& op : ops) total += op.ms;
      if (lead) {
        fmt::print("bench: per-op device time of one step (CUDA events; step {:.2f} ms wall, "
                   "ops {:.2f} ms):\n",
                   s.ms_per_step, total);
        for (const Backend::DeviceTime& op : ops)
          fmt::print("bench:   {:<18} {:9.3f} ms {:5.1f}%\n", op.kind, op.ms,
                     100.0 * op.ms / total);
        fmt::print("bench: per-layer device time of the same step:\n");
        for (const Backend::DeviceTime& r : layers)
          fmt::print("bench:   {:<20} {:3d} × {:8.3f} ms = {:9.3f} ms\n", r.kind, r.count,
                     r.ms / r.count, r.ms);
      }
      continue;
    }
    const bool timed = i >= args.warmup_steps;
    if (lead) {
      nlohmann::json record = step_record(s, trainer.memory_bytes());
      record["timed"] = timed;
      record["pipeline_ms"] = s.pipeline_ms;
      record["pipeline_wait_ms"] = s.pipeline_wait_ms;
      record["comm_cpu_ms"] = s.comm_cpu_ms;
      metrics->write(record);
      if (tensorboard) tensorboard->write_step(record);
      fmt::print("bench: step {} {}: {:.1f} ms (forward {:.1f}, backward {:.1f}, optimizer "
                 "{:.1f}, comm {:.1f}, exposed comm {:.1f}, comm thread cpu {:.1f} in {} polls{}) "
                 "loss {:.4f}\n",
                 i + 1, timed ? "timed" : "warm-up", s.ms_per_step, s.forward_ms, s.backward_ms,
                 s.optimizer_ms, s.comm_ms, s.exposed_comm_ms, s.comm_cpu_ms, s.comm_polls,
                 deck.parallel.zero > 0
                     ? fmt::format(", all-gather {:.1f}, exposed {:.1f}, held wait {:.1f}",
                                   s.gather_comm_ms, s.gather_exposed_ms, s.held_wait_ms)
                     : std::string(),
                 s.loss);
      std::fflush(stdout);
    }
    if (!timed) continue;
    ms.push_back(s.ms_per_step);
    fwd.push_back(s.forward_ms);
    bwd.push_back(s.backward_ms);
    opt.push_back(s.optimizer_ms);
    comm.push_back(s.comm_ms);
    comm_cpu.push_back(s.comm_cpu_ms);
    exposed.push_back(s.exposed_comm_ms);
    gather.push_back(s.gather_comm_ms);
    gather_exposed.push_back(s.gather_exposed_ms);
    held_wait.push_back(s.held_wait_ms);
    overlap.push_back(s.overlap);
    tp_comm.push_back(s.tp_comm_ms);
    tp_exposed.push_back(s.tp_exposed_ms);
    cp_comm.push_back(s.cp_comm_ms);
    cp_exposed.push_back(s.cp_exposed_ms);
    bubble.push_back(s.pipeline_ms > 0 ? s.pipeline_wait_ms / s.pipeline_ms : 0.0);
    // The runner's own share: neither compute nor waiting (headers, posting, tests, copies).
    runner.push_back(s.pipeline_ms > 0
                         ? (s.pipeline_ms - s.pipeline_compute_ms - s.pipeline_wait_ms) /
                               s.pipeline_ms
                         : 0.0);
  }
  // Note [Per-stage figures]
  // Every stage's median bubble, runner share and activation memory, gathered over pp (every
  // rank takes part), printed by the lead for its pipeline next to the schedule's model: the
  // idle fraction with equal pass costs, and the micro-batches in flight that the activations
  // are sized for.
  const int pp = grid->layout().pp;
  constexpr int kPerStage = 3;
  std::vector<double> per_stage(kPerStage * size_t(pp));
  {
    const double own[kPerStage] = {median(bubble), double(trainer.model().activation_bytes()),
                                   median(runner)};
    grid->pp().all_gather(own, per_stage.data(), kPerStage).wait();
  }
  if (!backend->is_device()) peak = std::max(peak, backend->measure_gemm_peak_flops());
  const double step_ms = median(ms);
  const double tokens_per_s = trainer.tokens_per_step() / (step_ms / 1e3);
  const double flops_per_token = cfg.train_flops_per_token(deck.model.seq_len);
  const int ranks = grid->world_size();
  const CheckedPeak checked = check_gemm_peak(peak, *backend, blas, node_ranks);
  const double achieved = flops_per_token * tokens_per_s;
  const double mfu = mfu_or_nan(achieved, checked.flops * ranks);
  // No nominal peak (the CPU backend): not reported, rather than an MFU of 0.
  const double mfu_nominal = nominal > 0 ? mfu_or_nan(achieved, nominal * ranks) : NAN;
  // llm.c's FLOP count, for comparison with figures published with it.
  const double mfu_nominal_llmc =
      nominal > 0
          ? mfu_or_nan(cfg.llmc_flops_per_token(deck.model.seq_len) * tokens_per_s, nominal * ranks)
          : NAN;
  if (trace) trace->write();
  if (lead) {
    if (!checked.problem.empty()) fmt::print("bench: WARNING: {}\n", checked.problem);
    else if (std::isnan(mfu))
      fmt::print("bench: WARNING: MFU came out above 1 ({:.1f} GFLOP/s achieved per rank, "
                 "against a measured peak of {:.1f} with blas_core={}): the peak measurement "
                 "was wrong (the machine busy while measuring, or a GEMM kernel faster than "
                 "the one measured); MFU is not reported\n",
                 achieved / ranks / 1e9, peak / 1e9, blas.chosen);
    // One list makes both the `bench:` line, which stays the last line, and bench.json
    // (Note [Bench files]): `decimals` is the line's precision (-1: printed as it is); a figure
    // that is not reported (NaN) is n/a on the line and null in the JSON.
    struct Field {
      const char* key;
      nlohmann::json value;
      int decimals;
    };
    const PipeSchedule schedule = parse_pipe_schedule(deck.parallel.schedule, "parallel.schedule");
    const int chunks = deck.parallel.virtual_stages;
    const double model_bubble = bubble_model(schedule, pp, deck.train.accum, chunks);
    auto in_flight = [&](int st) {  // over the stage's chunks
      int n = 0;
      for (int c = 0; c < chunks; ++c)
        n += max_in_flight(schedule, pp, st, deck.train.accum, chunks, c);
      return n;
    };
    for (int st = 0; st < pp && pp > 1; ++st)
      fmt::print("bench: stage {} of {} ({}{}, {} micro-batches): bubble {:.3f} (model {:.3f}), "
                 "runner {:.4f} of the schedule's time, activations {:.1f} MiB for {} "
                 "micro-batches{} in flight\n",
                 st, pp, pipe_schedule_name(schedule),
                 chunks > 1 ? fmt::format(" × {} chunks", chunks) : std::string(), deck.train.accum,
                 per_stage[kPerStage * st], model_bubble, per_stage[kPerStage * st + 2],
                 per_stage[kPerStage * st + 1] / (1024.0 * 1024.0), in_flight(st),
                 chunks > 1 ? " (chunk passes)" : "");
    // The pipeline's bubble: idle stage-time over all stage-time, the mean of the stages'
    // (each runs the whole schedule). Stage 0's alone (`bubble`) also holds the imbalance of
    // the stages: the first waits for a slower last one in every steady-state F/B pair.
    double activation_max = 0, bubble_mean = 0, runner_max = 0;
    for (int st = 0; st < pp; ++st) {
      runner_max = std::max(runner_max, per_stage[kPerStage * st + 2]);
      activation_max = std::max(activation_max, per_stage[kPerStage * st + 1]);
      bubble_mean += per_stage[kPerStage * st] / pp;
    }
    const Trainer::MemoryBytes memory = trainer.memory_bytes();  // per rank
    constexpr double mib = 1024.0 * 1024.0;
    const auto figure = [](double x) {
      return std::isnan(x) ? nlohmann::json() : nlohmann::json(x);
    };
    const std::vector<Field> fields = {
        {"tokens_per_s", tokens_per_s, 1},
        {"ms_per_step", step_ms, 2},
        {"mfu", figure(mfu), 4},
        {"mfu_nominal", figure(mfu_nominal), 4},
        {"mfu_nominal_llmc", figure(mfu_nominal_llmc), 4},
        {"peak_gflops", peak * ranks / 1e9, 1},
        {"nominal_peak_gflops", nominal * ranks / 1e9, 1},
        {"achieved_gflops", achieved / 1e9, 1},
        {"forward_ms", median(fwd), 2},
        {"backward_ms", median(bwd), 2},
        {"optimizer_ms", median(opt), 2},
        {"comm_ms", median(comm), 2},
        {"comm_cpu_ms", median(comm_cpu), 2},
        {"exposed_comm_ms", median(exposed), 2},
        {"overlap", median(overlap), 3},
        {"gather_comm_ms", median(gather), 2},
        {"gather_exposed_ms", median(gather_exposed), 2},
        {"held_wait_ms", median(held_wait), 2},
        {"tp_comm_ms", median(tp_comm), 2},
        {"tp_exposed_ms", median(tp_exposed), 2},
        {"cp_comm_ms", median(cp_comm), 2},
        {"cp_exposed_ms", median(cp_exposed), 2},
        {"bubble", median(bubble), 3},
        {"bubble_mean", bubble_mean, 3},
        {"bubble_model", model_bubble, 3},
        {"pipeline_runner_max", runner_max, 4},
        {"activation_mb", trainer.model().activation_bytes() / (1024.0 * 1024.0), 1},
        {"activation_max_stage_mb", activation_max / (1024.0 * 1024.0), 1},
        {"schedule", pipe_schedule_name(schedule), -1},
        {"device_used_mib",
         backend->is_device() && least_free <= free_before
             ? nlohmann::json((free_before - least_free) / mib)
             : nlohmann::json(),
         1},
        {"param_mib", memory.params / mib, 1},
        {"grad_mib", memory.grads / mib, 1},
        {"grad_resident_mib", memory.grads_resident / mib, 1},
        {"optimizer_mib", memory.optimizer / mib, 1},
        {"activation_mib", memory.activations / mib, 1},
        {"params_m", trainer.model().num_params() / 1e6, 2},
        {"tokens_per_step", trainer.tokens_per_step(), -1},
        {"ranks", ranks, -1},
        {"dp", grid->layout().dp, -1},
        {"tp", grid->layout().tp, -1},
        {"tp_overlap",  // as the model runs it (Note [Chunks on the host])
         trainer.model().tp_overlap() != nullptr, -1},
        {"pp", pp, -1},
        {"cp", grid->layout().cp, -1},
        {"cp_comm", deck.parallel.cp_comm, -1},
        {"zero", deck.parallel.zero, -1},
        {"threads", backend->threads(), -1},
        {"cores", cores.cores, -1},  // the fewest any rank may run on (Note [Threads and binding])
        {"backend", backend->name(), -1},
        {"blas_core", blas.chosen, -1}};
    nlohmann::ordered_json summary;
    std::string line = "bench:";
    for (const Field& f : fields) {
      summary[f.key] = f.value;
      const std::string text = f.value.is_null()     ? std::string("n/a")
                               : f.value.is_string() ? f.value.get<std::string>()
                               : f.decimals >= 0
                                   ? fmt::format("{:.{}f}", f.value.get<double>(), f.decimals)
                                   : f.value.dump();
      line += fmt::format(" {}={}", f.key, text);
    }
    const std::string attention = backend->attention_note();
    summary["attention"] = attention;
    if (!attention.empty()) fmt::print("bench: attention: {}\n", attention);
    summary["warmup_steps"] = args.warmup_steps;
    summary["timed_steps"] = args.steps;
    std::ofstream(out_dir / "bench.json") << summary.dump(1) << "\n";
    if (tensorboard) tensorboard->write_scalars(total_steps, summary, "bench/");
    fmt::print("bench: figures in {}, steps in {}\n", (out_dir / "bench.json").string(),
               metrics->path());
    fmt::print("{}\n", line);
  }
  return 0;
}

}  // namespace trident
