// `trident train DECK [--set k=v]...`: the step loop with progress, metrics and validation.
#include <mpi.h>

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "app/commands.h"
#include "app/run_setup.h"
#include "trident/check.h"
#include "trident/metrics.h"
#include "trident/train.h"

namespace trident {
namespace fs = std::filesystem;

namespace {

std::string format_eta(double seconds) {
  if (seconds < 120) return fmt::format("{:.0f} s", seconds);
  if (seconds < 7200) return fmt::format("{:.1f} min", seconds / 60);
  return fmt::format("{:.1f} h", seconds / 3600);
}

nlohmann::json to_json(const StepStats& s) {
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
                      {"tp_comm_ms", s.tp_comm_ms}};
  if (!std::isnan(s.val_loss)) j["val_loss"] = s.val_loss;
  return j;
}

}  // namespace

int run_train(const DeckArgs& args) {
  // Setup in agreed steps (see setup_step): bad input stops every rank with one message.
  Deck deck;
  setup_step([&] { deck = load_deck(args.deck, args.overrides); });
  std::unique_ptr<ProcessGrid> grid;
  setup_step([&] { grid = make_grid(deck); });
  const bool lead = grid->world_rank() == 0;

  std::string note;
  GPTConfig shape;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<TraceWriter> trace;
  TrainContext ctx;
  std::unique_ptr<Trainer> trainer_ptr;
  setup_step([&] {
    shape = model_config_from_deck(deck, &note);
    backend = make_cpu_backend(deck.run.threads);
    trace = make_trace(deck, *grid);
    ctx = TrainContext{backend.get(), backend->measure_gemm_peak_flops(), grid.get(),
                       trace.get()};
    // Validates datasets and init_from before anything is written.
    trainer_ptr = std::make_unique<Trainer>(deck, ctx);
  });
  Trainer& trainer = *trainer_ptr;
  if (lead) {
    fmt::print("{}\n", deck.to_yaml());
    if (!note.empty()) fmt::print("{}\n", note);
  }

  const fs::path out_dir = deck.run.out_dir;
  const fs::path metrics_path = out_dir / deck.log.jsonl;
  std::unique_ptr<JsonlWriter> metrics;
  if (lead) {
    fs::create_directories(metrics_path.parent_path());
    std::ofstream(out_dir / "deck.yaml") << deck.to_yaml();
    metrics = std::make_unique<JsonlWriter>(metrics_path.string());
    fmt::print(
        "model: {} layers, d_model {}, {} heads, vocab {} (padded {}), {:.2f} M parameters\n"
        "batch: {} tokens/step ({} micro-batch x {} seq x {} accum x {} dp), {} steps\n"
        "ranks: {} (dp {} x tp {} x pp {}), backend {} with {} threads per rank, GEMM peak "
        "{:.1f} GFLOP/s per rank\n",
        shape.layers, shape.channels, shape.heads, shape.vocab, shape.padded_vocab,
        trainer.model().num_params() / 1e6, trainer.tokens_per_step(), deck.train.micro_batch,
        deck.model.seq_len, deck.train.accum, trainer.dp_size(), deck.train.steps,
        grid->world_size(), grid->layout().dp, grid->layout().tp, grid->layout().pp,
        backend->name(), backend->threads(), ctx.peak_flops / 1e9);
  }

  const auto t_start = std::chrono::steady_clock::now();
  StepStats last;
  for (int step = 0; step < deck.train.steps; ++step) {
    StepStats s = trainer.train_step(step);
    const bool last_step = step + 1 == deck.train.steps;
    if (deck.train.val_every > 0 && (s.step % deck.train.val_every == 0 || last_step))
      s.val_loss = trainer.validate();
    if (lead) {
      metrics->write(to_json(s));
      if (s.step % deck.log.every == 0 || last_step || step == 0) {
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                             t_start).count();
        const double eta = elapsed / s.step * (deck.train.steps - s.step);
        std::string val = std::isnan(s.val_loss) ? "" : fmt::format(" | val {:.4f}", s.val_loss);
        std::string comm = trainer.dp_size() > 1
                               ? fmt::format(" | comm {:.1f} ms, exposed {:.1f} ms",
                                             s.comm_ms, s.exposed_comm_ms)
                               : "";
        fmt::print("step {:>5}/{} | loss {:.4f}{} | lr {:.2e} | norm {:.3f} | {:.1f} ms | "
                   "{:.0f} tok/s | mfu {:.1f}%{} | eta {}\n",
                   s.step, deck.train.steps, s.loss, val, s.lr, s.grad_norm, s.ms_per_step,
                   s.tokens_per_s, 100 * s.mfu, comm, format_eta(eta));
        std::fflush(stdout);
      }
    }
    last = s;
  }
  if (trace) {
    trace->write();
    if (lead) fmt::print("trace: {} (one file per rank; open in Perfetto)\n", trace->path());
  }
  if (lead)
    fmt::print("done: {} steps, final loss {:.4f}{}; metrics in {}, resolved deck in {}\n",
               deck.train.steps, last.loss,
               std::isnan(last.val_loss) ? "" : fmt::format(", val loss {:.4f}", last.val_loss),
               metrics_path.string(), (out_dir / "deck.yaml").string());
  return 0;
}

}  // namespace trident
