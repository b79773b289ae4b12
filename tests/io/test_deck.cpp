// The input deck: defaults, file + --set precedence, every class of bad input (message and exit
// code), the to_yaml() round trip, and where relative paths are resolved.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "core/text.h"
#include "io/deck_schema.h"
#include "trident/check.h"
#include "trident/deck.h"

namespace trident {
namespace {

namespace fs = std::filesystem;

// Every test gets its own scratch directory and leaves the working directory as it found it.
class DeckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           fmt::format("trident_deck_{}_{}_{}", info->name(), ::getpid(), counter_++);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    old_cwd_ = fs::current_path();
  }
  void TearDown() override {
    fs::current_path(old_cwd_);
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string write(const std::string& relative, const std::string& text) {
    fs::path p = dir_ / relative;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p.string();
  }
  std::string in_dir(const std::string& relative) const {
    return (dir_ / relative).lexically_normal().string();
  }

  fs::path dir_;
  fs::path old_cwd_;
  static inline int counter_ = 0;
};

const char* kMinimal = "data:\n  train: train.bin\n";

// Runs `f`, which must throw a bad-input Error, and returns its message.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

std::string parse_error(const std::string& yaml, const std::vector<std::string>& sets = {}) {
  return error_of([&] { parse_deck(yaml, "/tmp", sets); });
}

::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\" does not contain \"" << part << "\"";
}

::testing::AssertionResult StartsWith(const std::string& text, const std::string& prefix) {
  if (text.starts_with(prefix)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "\"" << text << "\" does not start with \"" << prefix << "\"";
}

TEST_F(DeckTest, DefaultsComeFromTheStructInitializers) {
  Deck d = parse_deck(kMinimal, dir_.string());
  EXPECT_EQ(d.model, ModelConfig{});
  EXPECT_EQ(d.train, TrainConfig{});
  EXPECT_EQ(d.log, LogConfig{});
  EXPECT_EQ(d.parallel, ParallelConfig{});
  EXPECT_EQ(d.comm, CommConfig{});
  EXPECT_EQ(d.data.train, in_dir("train.bin"));
  EXPECT_EQ(d.data.valid, "");
  EXPECT_FALSE(d.data.shuffle);
  EXPECT_EQ(d.run.threads, RunConfig{}.threads);
  EXPECT_EQ(d.run.out_dir, (fs::current_path() / "runs" / "deck").string());
  EXPECT_EQ(d.source, "");
}

TEST_F(DeckTest, ReadsEveryTypeFromNestedMaps) {
  Deck d = parse_deck("model: {layers: 6, d_model: 96, heads: 3}\n"
                      "train:\n"
                      "  lr: 3e-4\n"
                      "  lr_schedule: constant\n"
                      "  seed: 18446744073709551615\n"
                      "  steps: +7\n"
                      "data:\n"
                      "  train: /abs/train.bin\n"
                      "  shuffle: yes\n"
                      "comm:\n"
                      "  overlap: false\n"
                      "  bucket_mb: 2\n"
                      "log:\n"
                      "  jsonl: 'my metrics.jsonl'\n"
                      "run:\n",  // a section with every key commented out
                      dir_.string());
  EXPECT_EQ(d.model.layers, 6);
  EXPECT_EQ(d.model.d_model, 96);
  EXPECT_EQ(d.model.heads, 3);
  EXPECT_EQ(d.train.lr, 3e-4);
  EXPECT_EQ(d.train.lr_schedule, "constant");
  EXPECT_EQ(d.train.seed, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(d.train.steps, 7);
  EXPECT_EQ(d.data.train, "/abs/train.bin");
  EXPECT_TRUE(d.data.shuffle);
  EXPECT_FALSE(d.comm.overlap);
  EXPECT_EQ(d.comm.bucket_mb, 2.0);
  EXPECT_EQ(d.log.jsonl, "my metrics.jsonl");
}

TEST_F(DeckTest, OverridesApplyAfterTheFileInOrder) {
  std::string path = write("deck.yaml", "model:\n  layers: 6\n  heads: 4\ndata:\n  train: t.bin\n");
  Deck d = load_deck(path, {"model.layers=8", "train.lr=0.5", "train.lr=0.25",
                            " data.shuffle = true", "train.lr_schedule=constant"});
  EXPECT_EQ(d.model.layers, 8);  // --set beats the file
  EXPECT_EQ(d.model.heads, 4);   // the file beats the default
  EXPECT_EQ(d.train.lr, 0.25);   // the last --set wins
  EXPECT_TRUE(d.data.shuffle);
  EXPECT_EQ(d.train.lr_schedule, "constant");
  EXPECT_EQ(d.source, in_dir("deck.yaml"));
}

TEST_F(DeckTest, AnOverrideCanRepairAnOutOfRangeFileValue) {
  Deck d =
      parse_deck(std::string(kMinimal) + "train:\n  lr: -1\n", dir_.string(), {"train.lr=0.1"});
  EXPECT_EQ(d.train.lr, 0.1);
}

TEST_F(DeckTest, UnknownKeyNamesItSuggestsAndListsTheSection) {
  std::string msg = parse_error(std::string(kMinimal) + "model:\n  layres: 3\n");
  EXPECT_TRUE(StartsWith(msg, "(deck text):4:3: unknown key 'model.layres'"));
  EXPECT_TRUE(Contains(msg, "did you mean 'model.layers'?"));
  EXPECT_TRUE(Contains(msg, "model keys: layers, d_model, heads, vocab, seq_len, init_from"));

  msg = parse_error(std::string(kMinimal) + "train:\n  frobnicate: 1\n");
  EXPECT_TRUE(Contains(msg, "unknown key 'train.frobnicate'"));
  EXPECT_FALSE(Contains(msg, "did you mean"));
  EXPECT_TRUE(Contains(msg, "train keys: micro_batch, accum, steps, lr,"));

  // A key put in the wrong section is found by its name.
  msg = parse_error(std::string(kMinimal) + "train:\n  seq_len: 32\n");
  EXPECT_TRUE(Contains(msg, "did you mean 'model.seq_len'?"));
}

TEST_F(DeckTest, UnknownSectionSuggestsTheClosest) {
  std::string msg = parse_error(std::string(kMinimal) + "modle:\n  layers: 3\n");
  EXPECT_TRUE(StartsWith(msg, "(deck text):3:1: unknown section 'modle'"));
  EXPECT_TRUE(Contains(msg, "did you mean 'model'?"));
  EXPECT_TRUE(Contains(msg, "sections: model, train, data, log, run, parallel, comm"));

  // The --set spelling of a key, written at the top of a file.
  msg = parse_error(std::string(kMinimal) + "model.layers: 3\n");
  EXPECT_TRUE(Contains(msg, "unknown section 'model.layers' (keys are nested in the file: "
                            "'model:' then '  layers: ...')"));
}

TEST_F(DeckTest, UnknownOverrideKey) {
  std::string msg = parse_error(kMinimal, {"model.layrs=8"});
  EXPECT_TRUE(StartsWith(msg, "--set model.layrs=8: unknown key 'model.layrs'"));
  EXPECT_TRUE(Contains(msg, "did you mean 'model.layers'?"));
  EXPECT_TRUE(Contains(msg, "model keys: layers,"));

  msg = parse_error(kMinimal, {"optim.lr=1"});
  EXPECT_TRUE(Contains(msg, "unknown key 'optim.lr'"));
  EXPECT_TRUE(Contains(msg, "sections: model, train,"));
}

TEST_F(DeckTest, WrongTypeNamesTheKeyAndWhatWasFound) {
  std::string base = std::string(kMinimal) + "train:\n";
  std::string msg = parse_error(base + "  steps: ten\n");
  EXPECT_TRUE(StartsWith(msg, "(deck text):4:10: train.steps: expected an integer, got \"ten\""));
  EXPECT_TRUE(Contains(parse_error(base + "  steps: 1.5\n"),
                       "train.steps: expected an integer, got \"1.5\""));
  EXPECT_TRUE(
      Contains(parse_error(base + "  steps:\n"), "train.steps: expected an integer, got nothing"));
  EXPECT_TRUE(Contains(parse_error(base + "  steps: [1, 2]\n"),
                       "train.steps: expected an integer, got a list"));
  EXPECT_TRUE(Contains(parse_error(base + "  steps: 9999999999\n"),
                       "train.steps: 9999999999 does not fit in a 32-bit integer"));
  EXPECT_TRUE(
      Contains(parse_error(base + "  lr: fast\n"), "train.lr: expected a number, got \"fast\""));
  EXPECT_TRUE(Contains(parse_error(base + "  lr: .nan\n"), "train.lr: expected a number"));
  EXPECT_TRUE(Contains(parse_error(base + "  seed: -1\n"),
                       "train.seed: expected a non-negative integer, got \"-1\""));
  EXPECT_TRUE(Contains(parse_error(std::string(kMinimal) + "comm:\n  overlap: maybe\n"),
                       "comm.overlap: expected true or false, got \"maybe\""));
  EXPECT_TRUE(
      Contains(parse_error("data:\n  train: {a: 1}\n"), "data.train: expected a path, got a map"));

  msg = parse_error(kMinimal, {"train.steps=ten"});
  EXPECT_EQ(msg, "--set train.steps: expected an integer, got \"ten\"");
  msg = parse_error(kMinimal, {"train.steps=[1"});
  EXPECT_TRUE(StartsWith(msg, "--set train.steps: cannot read the value as YAML"));
}

TEST_F(DeckTest, OutOfRangeShowsTheRange) {
  std::string base = std::string(kMinimal) + "train:\n";
  EXPECT_TRUE(StartsWith(parse_error(base + "  lr: -1\n"),
                         "(deck text):4:7: train.lr: must be > 0, got -1"));
  EXPECT_TRUE(
      Contains(parse_error(base + "  beta2: 1\n"), "train.beta2: must be in [0, 1), got 1"));
  EXPECT_TRUE(Contains(parse_error(base + "  min_lr_ratio: 1.5\n"),
                       "train.min_lr_ratio: must be in [0, 1], got 1.5"));
  EXPECT_TRUE(Contains(parse_error(base + "  grad_clip: -0.5\n"),
                       "train.grad_clip: must be >= 0, got -0.5"));
  EXPECT_TRUE(Contains(parse_error(std::string(kMinimal) + "model:\n  vocab: 1\n"),
                       "model.vocab: must be >= 2, got 1"));
  EXPECT_EQ(parse_error(kMinimal, {"train.micro_batch=0"}),
            "--set train.micro_batch: must be >= 1, got 0");
  EXPECT_EQ(parse_error(kMinimal, {"comm.bucket_mb=0"}),
            "--set comm.bucket_mb: must be > 0, got 0");
  // Boundaries that are allowed.
  Deck d = parse_deck(kMinimal, "/tmp",
                      {"train.grad_clip=0", "train.beta1=0", "parallel.dp=0",
                       "train.min_lr_ratio=1", "train.warmup_steps=0"});
  EXPECT_EQ(d.train.grad_clip, 0.0);
}

// The grid's named dimensions (Note [Grid rank order] in src/comm/grid.cpp): the defaults keep
// the plain dp × tp × pp grid; whether the sizes fit the world is the grid's check.
TEST_F(DeckTest, GridDimensionsDefaultToThePlainGrid) {
  Deck d = parse_deck(kMinimal, "/tmp");
  EXPECT_EQ(d.parallel.dp_replicate, 1);
  EXPECT_EQ(d.parallel.dp_shard, 0);
  EXPECT_EQ(d.parallel.cp, 1);
  d = parse_deck(kMinimal, "/tmp",
                 {"parallel.dp_replicate=2", "parallel.dp_shard=4", "parallel.cp=2"});
  EXPECT_EQ(d.parallel.dp_replicate, 2);
  EXPECT_EQ(d.parallel.dp_shard, 4);
  EXPECT_EQ(d.parallel.cp, 2);
  EXPECT_EQ(parse_error(kMinimal, {"parallel.cp=0"}), "--set parallel.cp: must be >= 1, got 0");
  EXPECT_EQ(parse_error(kMinimal, {"parallel.dp_replicate=0"}),
            "--set parallel.dp_replicate: must be >= 1, got 0");
  EXPECT_EQ(parse_error(kMinimal, {"parallel.dp_shard=-1"}),
            "--set parallel.dp_shard: must be >= 0, got -1");
}

TEST_F(DeckTest, EnumListsTheChoices) {
  EXPECT_TRUE(Contains(parse_error(std::string(kMinimal) + "train:\n  lr_schedule: linear\n"),
                       "train.lr_schedule: must be one of cosine|constant, got \"linear\""));
  EXPECT_EQ(parse_error(kMinimal, {"train.lr_schedule=Cosine"}),
            "--set train.lr_schedule: must be one of cosine|constant, got \"Cosine\"");
}

TEST_F(DeckTest, GradDtypeIsFp32OrBf16) {
  EXPECT_EQ(parse_deck(kMinimal, "/tmp").comm.grad_dtype, "fp32");
  EXPECT_EQ(parse_deck(kMinimal, "/tmp", {"comm.grad_dtype=bf16"}).comm.grad_dtype, "bf16");
  EXPECT_EQ(parse_error(kMinimal, {"comm.grad_dtype=fp16"}),
            "--set comm.grad_dtype: must be one of fp32|bf16, got \"fp16\"");
}

TEST_F(DeckTest, MalformedYamlNamesTheFileLineAndColumn) {
  std::string path = write("bad.yaml", "data:\n  train: t.bin\nmodel: [1, 2\n");
  std::string msg = error_of([&] { load_deck(path); });
  EXPECT_TRUE(StartsWith(msg, path + ":")) << msg;
  EXPECT_TRUE(Contains(msg, "malformed YAML"));
  EXPECT_TRUE(std::isdigit(static_cast<unsigned char>(msg[path.size() + 1]))) << msg;

  path = write("tabs.yaml", "model:\n\tlayers: 3\n");
  EXPECT_TRUE(StartsWith(error_of([&] { load_deck(path); }), path + ":"));
}

TEST_F(DeckTest, MissingFile) {
  std::string path = in_dir("nowhere.yaml");
  std::string msg = error_of([&] { load_deck(path); });
  EXPECT_TRUE(StartsWith(msg, path + ": cannot open the deck file"));
  EXPECT_TRUE(Contains(msg, "No such file"));
  EXPECT_TRUE(StartsWith(error_of([&] { load_deck(dir_.string()); }), dir_.string() + ": "));
}

TEST_F(DeckTest, MalformedOverride) {
  EXPECT_EQ(parse_error(kMinimal, {"foo"}), "--set foo: expected key=value");
  EXPECT_EQ(parse_error(kMinimal, {"=3"}), "--set =3: expected key=value");
  EXPECT_EQ(parse_error(kMinimal, {"  =3"}), "--set   =3: expected key=value");
}

TEST_F(DeckTest, SectionsMustBeMaps) {
  std::string msg = parse_error(std::string(kMinimal) + "model: 4\n");
  EXPECT_TRUE(StartsWith(msg, "(deck text):3:8: model: expected a map of keys (layers, d_model"));
  EXPECT_TRUE(Contains(msg, "got \"4\""));
  EXPECT_TRUE(Contains(parse_error(std::string(kMinimal) + "train: [1]\n"),
                       "train: expected a map of keys"));
  EXPECT_TRUE(Contains(
      parse_error("- model\n- train\n"),
      "expected a map of sections (model, train, data, log, run, parallel, comm, checkpoint), "
      "got a list"));
  EXPECT_TRUE(Contains(parse_error("just words\n"), "expected a map of sections"));
}

TEST_F(DeckTest, DuplicatesAreRefused) {
  EXPECT_TRUE(Contains(parse_error(std::string(kMinimal) + "model: {layers: 2, layers: 3}\n"),
                       "key 'model.layers' appears twice"));
  EXPECT_TRUE(Contains(parse_error(std::string(kMinimal) + "data: {shuffle: true}\n"),
                       "section 'data' appears twice"));
}

TEST_F(DeckTest, CrossKeyChecks) {
  std::string msg = parse_error("");
  EXPECT_EQ(msg, "(deck text): data.train is required (the training token file)");
  EXPECT_TRUE(Contains(parse_error(kMinimal, {"data.train="}), "--set: data.train is required"));

  msg = parse_error(std::string(kMinimal) + "model:\n  d_model: 130\n");
  EXPECT_EQ(msg, "(deck text):4:12: model.d_model (130) must be a multiple of model.heads (4)");
  msg = parse_error(std::string(kMinimal) + "model:\n  d_model: 130\n", {"model.heads=3"});
  EXPECT_TRUE(StartsWith(msg, "--set: model.d_model (130) must be a multiple of model.heads (3)"));

  EXPECT_TRUE(Contains(parse_error(kMinimal, {"parallel.tp=3"}),
                       "parallel.tp (3) must divide model.heads (4)"));
  EXPECT_TRUE(Contains(parse_error(kMinimal, {"parallel.pp=5"}),
                       "parallel.pp (5) must be at most model.layers (4)"));
  // With a checkpoint the shape is its own, so these wait until it is read.
  Deck d = parse_deck(kMinimal, "/tmp", {"parallel.pp=5", "model.init_from=gpt2.bin"});
  EXPECT_EQ(d.parallel.pp, 5);
}

// A deck with a non-default value in every key, and values that are hard to print.
Deck unusual_deck(const std::string& dir) {
  return parse_deck(
      "model: {layers: 3, d_model: 96, heads: 6, vocab: 50257, seq_len: 1024,\n"
      "        init_from: 'ckpt/gpt2 124M.bin'}\n"
      "train: {micro_batch: 2, accum: 3, steps: 7, lr: 0.1, lr_schedule: constant,\n"
      "        warmup_steps: 0, min_lr_ratio: 0.3333333333333333, weight_decay: 0,\n"
      "        grad_clip: 1e-300, beta1: 0.8999999999999999, beta2: 0.999, eps: 1e-8,\n"
      "        seed: 18446744073709551615, val_every: 0, val_batches: 9}\n"
      "data: {train: 'a \"quoted\" #name: x.bin', valid: v.bin, shuffle: true}\n"
      "log: {every: 5, jsonl: \"sub/m\\tx.jsonl\", trace: trace.json}\n"
      "run: {threads: 16, out_dir: out}\n"
      "parallel: {dp: 2, tp: 3, pp: 3}\n"
      "comm: {overlap: false, bucket_mb: 0.1, first_bucket_mb: 123456789.125,\n"
      "       emulate_gbps: 12.5, emulate_latency_us: 2.5e-5, timeout_s: 1}\n",
      dir);
}

TEST_F(DeckTest, ToYamlRoundTripsExactly) {
  Deck d = unusual_deck(dir_.string());
  EXPECT_EQ(d.train.min_lr_ratio, 1.0 / 3.0);
  EXPECT_EQ(d.log.jsonl, "sub/m\tx.jsonl");
  Deck again = parse_deck(d.to_yaml(), "/somewhere/else");  // resolved paths are absolute
  EXPECT_EQ(again, d) << d.to_yaml() << "\n----\n" << again.to_yaml();
  EXPECT_EQ(again.to_yaml(), d.to_yaml());

  Deck defaults = parse_deck(kMinimal, dir_.string());
  EXPECT_EQ(parse_deck(defaults.to_yaml(), "/"), defaults);

  // Through a file, as a run saves it; the source line is only a comment.
  std::string path = write("saved/resolved.yaml", d.to_yaml());
  Deck loaded = load_deck(path);
  EXPECT_EQ(loaded.source, in_dir("saved/resolved.yaml"));
  loaded.source = d.source;
  EXPECT_EQ(loaded, d);
}

TEST_F(DeckTest, ToYamlListsEveryKeyInSchemaOrderBySection) {
  std::string yaml = parse_deck(kMinimal, dir_.string()).to_yaml();
  size_t pos = 0;
  std::string_view section;
  for (const deck_schema::Key& k : deck_schema::keys()) {
    if (k.section() != section) {
      section = k.section();
      size_t at = yaml.find(fmt::format("\n{}:\n", section), pos);
      ASSERT_NE(at, std::string::npos) << "section " << section << " missing or out of order";
      pos = at + 1;
    }
    // A grouped key (model.moe.experts) sits as "    experts: " under its "  moe:" line.
    std::string leaf(k.leaf()), indent = "  ";
    if (const size_t dot = leaf.find('.'); dot != std::string::npos) {
      const std::string group = fmt::format("\n  {}:\n", leaf.substr(0, dot));
      const size_t first = yaml.find(group);
      ASSERT_NE(first, std::string::npos) << k.name << ": no group line\n" << yaml;
      EXPECT_EQ(yaml.find(group, first + 1), std::string::npos) << group << " twice";
      pos = std::max(pos, first + 1);
      leaf = leaf.substr(dot + 1);
      indent = "    ";
    }
    size_t at = yaml.find(fmt::format("\n{}{}: ", indent, leaf), pos);
    ASSERT_NE(at, std::string::npos) << k.name << " missing or out of order\n" << yaml;
    pos = at + 1;
  }
  EXPECT_TRUE(Contains(yaml, "  lr: 0.001 "));
  EXPECT_TRUE(Contains(yaml, "  eps: 1e-08 "));
  EXPECT_TRUE(Contains(yaml, "  lr_schedule: \"cosine\" "));
}

TEST_F(DeckTest, PathsInTheFileResolveAgainstTheDecksDirectory) {
  write("decks/exp1.yaml", "model: {init_from: ckpt/m.bin}\n"
                           "data: {train: ../data/train.bin, valid: /abs/valid.bin}\n"
                           "log: {jsonl: logs/m.jsonl, trace: trace.json}\n");
  fs::create_directories(dir_ / "work");
  fs::current_path(dir_ / "work");
  Deck d = load_deck("../decks/exp1.yaml");  // a relative deck path works too
  EXPECT_EQ(d.source, in_dir("decks/exp1.yaml"));
  EXPECT_EQ(d.model.init_from, in_dir("decks/ckpt/m.bin"));
  EXPECT_EQ(d.data.train, in_dir("data/train.bin"));
  EXPECT_EQ(d.data.valid, "/abs/valid.bin");
  EXPECT_EQ(d.log.trace, in_dir("decks/trace.json"));
  EXPECT_EQ(d.log.jsonl, "logs/m.jsonl");  // relative to run.out_dir, as written
  // No run.out_dir: runs/<deck stem> under the working directory.
  EXPECT_EQ(d.run.out_dir, in_dir("work/runs/exp1"));

  write("decks/exp2.yaml", "data: {train: t.bin}\nrun: {out_dir: out/x}\n");
  EXPECT_EQ(load_deck(in_dir("decks/exp2.yaml")).run.out_dir, in_dir("decks/out/x"));
}

TEST_F(DeckTest, PathsFromOverridesResolveAgainstTheWorkingDirectory) {
  std::string path = write("decks/exp.yaml", "data: {train: t.bin, valid: v.bin}\n");
  fs::create_directories(dir_ / "work");
  fs::current_path(dir_ / "work");
  Deck d = load_deck(path, {"data.train=mine/t.bin", "run.out_dir=out", "log.trace=tr.json",
                            "model.init_from=/abs/ckpt.bin", "log.jsonl=m.jsonl"});
  EXPECT_EQ(d.data.train, in_dir("work/mine/t.bin"));
  EXPECT_EQ(d.data.valid, in_dir("decks/v.bin"));  // untouched: still from the file
  EXPECT_EQ(d.run.out_dir, in_dir("work/out"));
  EXPECT_EQ(d.log.trace, in_dir("work/tr.json"));
  EXPECT_EQ(d.model.init_from, "/abs/ckpt.bin");
  EXPECT_EQ(d.log.jsonl, "m.jsonl");
  // An empty path means "none" and stays empty.
  EXPECT_EQ(load_deck(path, {"data.valid="}).data.valid, "");
}

TEST(DeckReference, ListsEveryKeyWithTypeRangeAndDefault) {
  std::string ref = deck_reference();
  for (const deck_schema::Key& k : deck_schema::keys())
    EXPECT_TRUE(Contains(ref, std::string(k.name))) << k.name;
  EXPECT_TRUE(Contains(ref, "train.lr "));
  EXPECT_TRUE(Contains(ref, "> 0"));
  EXPECT_TRUE(Contains(ref, "cosine|constant"));
  EXPECT_TRUE(Contains(ref, "in [0, 1)"));
}

TEST(DeckSchema, EditDistanceCountsTranspositionsOnce) {
  EXPECT_EQ(edit_distance("layers", "layers"), 0);
  EXPECT_EQ(edit_distance("layres", "layers"), 1);
  EXPECT_EQ(edit_distance("layer", "layers"), 1);
  EXPECT_EQ(edit_distance("", "abc"), 3);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3);
}

}  // namespace
}  // namespace trident
