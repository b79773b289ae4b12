// The input deck: a YAML file that describes a run completely, plus `--set a.b=v` overrides.
//
// Every key has a type, a default and an allowed range (the schema lives in src/io/deck.cpp).
// Unknown keys, wrong types and out-of-range values throw trident::Error with ExitCode::kBadInput
// naming the key and what is allowed. Relative paths written in the deck file are resolved
// against the deck's directory; relative paths given with --set against the working directory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trident {

struct ModelConfig {
  int layers = 4;
  int d_model = 128;
  int heads = 4;
  int vocab = 256;        // real vocabulary; the model pads it to a multiple of 128
  int seq_len = 64;
  std::string init_from;  // llm.c GPT-2 checkpoint; its shape replaces the deck's
};

struct TrainConfig {
  int micro_batch = 4;
  int accum = 1;
  int steps = 100;
  double lr = 1e-3;
  std::string lr_schedule = "cosine";  // cosine | constant
  int warmup_steps = 10;
  double min_lr_ratio = 0.1;           // cosine decays to lr * min_lr_ratio
  double weight_decay = 0.1;
  double grad_clip = 1.0;              // 0 turns clipping off
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  uint64_t seed = 1337;
  int val_every = 50;                  // 0: no validation
  int val_batches = 4;                 // micro-batches per validation
};

struct DataConfig {
  std::string train;
  std::string valid;                   // empty: no validation
  bool shuffle = false;
};

struct LogConfig {
  int every = 1;                       // print every N steps (metrics file gets every step)
  std::string jsonl = "metrics.jsonl"; // relative to run.out_dir
  std::string trace;                   // Chrome-trace JSON per rank; empty: none
};

struct RunConfig {
  int threads = 2;
  std::string out_dir;                 // default: runs/<deck file stem>
};

struct ParallelConfig {
  int dp = 0;                          // 0: derived from the world size
  int tp = 1;
  int pp = 1;
};

struct CommConfig {
  bool overlap = true;
  double bucket_mb = 25.0;
  double first_bucket_mb = 1.0;
  double emulate_gbps = 0.0;           // 0: no emulation
  double emulate_latency_us = 0.0;
  double timeout_s = 300.0;
};

struct Deck {
  ModelConfig model;
  TrainConfig train;
  DataConfig data;
  LogConfig log;
  RunConfig run;
  ParallelConfig parallel;
  CommConfig comm;
  std::string source;                  // the deck file's path

  // The resolved deck (every key, defaults filled in) as YAML: printed and saved with the run.
  std::string to_yaml() const;
};

// Reads `path`, applies each "a.b=value" override in order, validates. Throws on bad input.
Deck load_deck(const std::string& path, const std::vector<std::string>& overrides = {});
// The same from YAML text (tests; `source_dir` resolves relative paths).
Deck parse_deck(const std::string& yaml_text, const std::string& source_dir,
                const std::vector<std::string>& overrides = {});

}  // namespace trident
