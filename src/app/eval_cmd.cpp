// The commands that use a trained model: `trident eval DECK --ckpt PATH` (validation loss, in
// the deck's layout), `trident generate DECK --ckpt PATH --prompt TEXT` (sampling, one rank)
// and `trident export DECK [--ckpt PATH] --format llmc|safetensors OUT` (weights out).
#include <mpi.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

#include "app/backend_factory.h"
#include "app/commands.h"
#include "app/run_setup.h"
#include "trident/check.h"
#include "trident/train.h"

namespace trident {
namespace {

// The deck's model, in the deck's layout, with the checkpoint's weights.
struct Loaded {
  Deck deck;
  std::unique_ptr<ProcessGrid> grid;
  std::unique_ptr<Backend> backend;
  DeviceComms device_comms;
  std::unique_ptr<Trainer> trainer;
  CheckpointMeta meta;
  std::string path;
};

// `whole`: one rank holds the whole model on the host, whatever layout the deck names (the
// checkpoint loads in any layout). An empty `checkpoint`: the deck's own weights.
Loaded load_for_inference(const DeckArgs& args, const std::string& checkpoint, bool whole = false) {
  Loaded l;
  setup_step([&] {
    l.deck = load_deck(args.deck, args.overrides);
    if (!whole) return;
    ParallelConfig& p = l.deck.parallel;
    p.dp = p.tp = p.pp = p.cp = p.dp_replicate = p.dp_shard = 1;
    p.stage_layers.clear();
    p.sequence_parallel = false;
    p.zero = 0;
    l.deck.run.backend = "cpu";
  });
  setup_step([&] { l.grid = make_grid(l.deck); });
  setup_step([&] {
    if (!checkpoint.empty()) l.path = resolve_checkpoint(checkpoint);
    l.backend = make_backend(l.deck);
    l.device_comms = make_device_comms(l.deck, *l.backend, *l.grid);
    TrainContext ctx{l.backend.get(), 0.0, l.grid.get(), nullptr};
    attach_device_comms(l.device_comms, ctx);
    l.trainer = std::make_unique<Trainer>(l.deck, ctx);
  });
  if (!l.path.empty()) setup_step([&] { l.meta = l.trainer->load(l.path); });
  return l;
}

}  // namespace

int run_eval(const DeckArgs& args, const std::string& checkpoint) {
  Loaded l = load_for_inference(args, checkpoint);
  if (l.deck.data.valid.empty())
    input_error("eval: data.valid is empty in {}: nothing to evaluate on", l.deck.source);
  const double loss = l.trainer->validate();
  if (l.grid->world_rank() == 0)
    fmt::print("eval: checkpoint {} (step {}): val_loss={:.6f} over {} micro-batches of {}x{} "
               "tokens from {}\n",
               l.path, l.meta.step, loss, l.deck.train.val_batches, l.deck.train.micro_batch,
               l.deck.model.seq_len, l.deck.data.valid);
  return 0;
}

int run_generate(const GenerateArgs& args) {
  Loaded l = load_for_inference(args.deck, args.checkpoint);
  if (l.grid->world_size() != 1)
    input_error("generate runs on one rank (it got {}); the checkpoint loads in any layout",
                l.grid->world_size());
  GPT& model = l.trainer->model();
  const GPTConfig& cfg = model.config();
  if (model.precision() != Precision::kFp32)
    input_error("generate: run.precision bf16 keeps no fp32 logits to sample from; use --set "
                "run.precision=fp32 (the checkpoint's weights are fp32 either way)");
  if (cfg.vocab > 256)
    input_error("generate: model.vocab {} is not byte-level; only byte-level (vocab 256) "
                "models can turn text into tokens here",
                cfg.vocab);
  std::vector<int32_t> tokens(args.prompt.begin(), args.prompt.end());
  for (int32_t& t : tokens) t = int32_t(static_cast<unsigned char>(t));
  if (tokens.empty()) input_error("generate: --prompt is empty");
  const int T = l.deck.model.seq_len;
  std::mt19937_64 rng(args.seed);
  std::string out;
  std::vector<float> probs(size_t(cfg.vocab));
  for (int i = 0; i < args.tokens; ++i) {
    // The last T tokens as context; the logits of the last position pick the next token.
    const int n = std::min<int>(int(tokens.size()), T);
    model.forward(0, tokens.data() + tokens.size() - n, nullptr, 1, n);
    // The last position's logits, read on the host (Note [Backend memory]).
    HostView<const float> row(model.backend(), model.logits() + size_t(n - 1) * cfg.padded_vocab,
                              size_t(cfg.vocab), /*load=*/true);
    const float* logits = row.data();
    int next = int(std::max_element(logits, logits + cfg.vocab) - logits);
    if (args.temperature > 0) {
      const float top = logits[next];
      double sum = 0;
      for (int v = 0; v < cfg.vocab; ++v)
        sum += probs[v] = float(std::exp((logits[v] - top) / args.temperature));
      std::discrete_distribution<int> pick(probs.begin(), probs.end());
      next = pick(rng);
    }
    tokens.push_back(next);
    out.push_back(char(next));
  }
  fmt::print("{}{}\n", args.prompt, out);
  return 0;
}

// Note [Export on one rank]
// Export loads the whole model on one rank, in the host's memory (an HDF5 checkpoint loads in
// any layout), and writes it with save_llmc_weights or save_safetensors_weights: both formats
// are one file, written by one writer. A model too large for one host would need each rank to
// write its shard's slices, which these writers do not do.
int run_export(const ExportArgs& args) {
  setup_step([] {
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world != 1)
      input_error("export runs on one rank (it got {}); the checkpoint loads in any layout", world);
  });
  Loaded l = load_for_inference(args.deck, args.checkpoint, /*whole=*/true);
  GPT& model = l.trainer->model();
  size_t bytes = 0;
  if (args.format == "llmc") {
    save_llmc_weights(model, args.out);
    bytes = std::filesystem::file_size(args.out);
  } else {
    // A directory gets what from_pretrained reads: model.safetensors and config.json.
    std::string out = args.out;
    std::error_code ec;
    const bool directory = out.ends_with('/') || std::filesystem::is_directory(out, ec);
    if (directory) {
      std::filesystem::create_directories(out, ec);
      if (ec) input_error("export: cannot make the directory {}: {}", out, ec.message());
      out = (std::filesystem::path(out) / "model.safetensors").string();
    }
    bytes = save_safetensors_weights(model, out, /*with_config=*/directory);
  }
  const GPTConfig& cfg = model.config();
  const std::string from =
      l.path.empty() ? (l.deck.model.init_from.empty()
                            ? fmt::format("the deck's initialisation (seed {})", l.deck.train.seed)
                            : l.deck.model.init_from)
                     : fmt::format("checkpoint {} (step {})", l.path, l.meta.step);
  fmt::print("export: {} -> {} ({}, {} bytes): layers={} d_model={} heads={} vocab={} "
             "max_seq_len={}; {}\n",
             from, args.out, args.format, bytes, cfg.layers, cfg.channels, cfg.heads, cfg.vocab,
             cfg.max_seq_len, describe_block(cfg));
  return 0;
}

}  // namespace trident
