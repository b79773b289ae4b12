// `trident plan DECK --hardware NAME --gpus N`: ranks the layouts that fit, or evaluates one
// (--layout), with the model of src/plan/ (Note [Plan model]). No MPI, no allocation of the
// model: it runs on a laptop for a 1000-GPU job.
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "trident/check.h"
#include "trident/peak_check.h"
#include "trident/plan.h"

namespace trident {
namespace {

nlohmann::json to_json(const Prediction& p, const Hardware& hw) {
  const PlanLayout& l = p.layout;
  nlohmann::json j = {{"dp", l.dp},
                      {"tp", l.tp},
                      {"pp", l.pp},
                      {"cp", l.cp},
                      {"cp_comm", l.cp_comm},
                      {"ep", l.ep},
                      {"v", l.v},
                      {"micro_batch", l.micro_batch},
                      {"accum", l.accum},
                      {"zero", l.zero},
                      {"dp_shard", l.shard()},
                      {"dp_replicate", l.replicas()},
                      {"reshard_after_forward", l.reshard_after_forward},
                      {"zero3_gather", l.zero3_gather},
                      {"zero_reduce", l.zero_reduce},
                      {"recompute", l.recompute},
                      {"schedule", l.schedule},
                      {"sequence_parallel", l.sequence_parallel},
                      {"hardware", hw.name},
                      {"hardware_file", hw.path},
                      {"step_s", p.step_s},
                      {"tokens_per_s", p.tokens_per_s},
                      {"tflops_per_gpu", p.tflops_per_gpu},
                      {"mfu", p.mfu},
                      {"memory_gb_per_rank", p.memory_bytes / 1e9},
                      {"fits", p.fits}};
  if (!p.why_not.empty()) j["why_not"] = p.why_not;
  for (const PlanTerm& t : p.time) j["time_s"][t.name] = t.value;
  for (const PlanTerm& t : p.memory) j["memory_bytes"][t.name] = t.value;
  for (const PlanTerm& t : p.info) j["info"][t.name] = t.value;
  return j;
}

// checkpoint.async's line (Note [Plan checkpoint snapshot] in src/plan/memory.cpp): where the
// snapshot sits, its size, and one save's copy time at the file's host copy rate.
std::string snapshot_line(const Prediction& p, const Hardware& hw) {
  const CheckpointSnapshot& s = p.snapshot;
  const bool cpu = hw.kind == "cpu";
  std::string where =
      cpu ? "in the rank's memory, counted in its total"
          : fmt::format("in pinned host memory, not the device's; {:.3g} GB per node of {} "
                        "rank{}{}",
                        s.host_bytes_per_node / 1e9, s.node_ranks, s.node_ranks > 1 ? "s" : "",
                        hw.host_memory_gb > 0
                            ? fmt::format(" against the node's {:.4g} GB", hw.host_memory_gb)
                            : "");
  const double rate = host_copy_bytes_per_s(hw);
  std::string via = hw.host_copy_path;
  if (via.empty())
    via = cpu && hw.host_copy_gbytes_per_s <= 0
              ? "half of memory_gbytes_per_s: a copy reads and writes each byte"
              : (cpu ? "memcpy" : "device to host");
  const std::string time =
      rate > 0 ? fmt::format("{:.3g} ms per save at {:.3g} GB/s ({}, {})", 1e3 * s.copy_s,
                             rate / 1e9, via, hw.name)
               : fmt::format("copy time unknown: {} has no host_copy_gbytes_per_s", hw.name);
  return fmt::format("checkpoint snapshot: {:.3g} GB per rank ({}), {}", s.bytes_per_rank / 1e9,
                     where, time);
}

void add_snapshot(nlohmann::json& j, const Prediction& p, const Hardware& hw) {
  j["checkpoint_snapshot"] = {{"bytes_per_rank", p.snapshot.bytes_per_rank},
                              {"host_bytes_per_node", p.snapshot.host_bytes_per_node},
                              {"copy_s", p.snapshot.copy_s},
                              {"host_copy_gbytes_per_s", host_copy_bytes_per_s(hw) / 1e9},
                              {"in", hw.kind == "cpu" ? "rank memory" : "pinned host memory"}};
}

// The step's split as "gemm 61% bubble 12% ...", largest first, terms of at least 1%.
std::string split(const Prediction& p) {
  std::vector<PlanTerm> t = p.time;
  std::sort(t.begin(), t.end(),
            [](const PlanTerm& a, const PlanTerm& b) { return a.value > b.value; });
  std::string s;
  for (const PlanTerm& x : t)
    if (x.value >= 0.01 * p.step_s)
      s += fmt::format("{} {:.0f}%  ", x.name, 100 * x.value / p.step_s);
  return s;
}

void print_one(const Prediction& p, const Hardware& hw) {
  fmt::print("layout {} on {} ({} rank{}), hardware file {}\n", format_layout(p.layout), hw.name,
             p.layout.world(), p.layout.world() > 1 ? "s" : "", hw.path);
  if (!p.why_not.empty()) fmt::print("  does not fit: {}\n", p.why_not);
  if (p.step_s > 0)
    fmt::print("  step {:.4g} s  {:.4g} tokens/s  {:.4g} TFLOP/s per rank  MFU {}\n", p.step_s,
               p.tokens_per_s, p.tflops_per_gpu, format_mfu_percent(p.mfu));
  for (const PlanTerm& t : p.time)
    fmt::print("  time    {:<24} {:>12.4g} s  {:>5.1f}%\n", t.name, t.value,
               p.step_s > 0 ? 100 * t.value / p.step_s : 0.0);
  for (const PlanTerm& t : p.memory)
    fmt::print("  memory  {:<24} {:>12.4g} GB\n", t.name, t.value / 1e9);
  fmt::print("  memory  {:<24} {:>12.4g} GB per rank (capacity {:.4g} GB per {})\n", "total",
             p.memory_bytes / 1e9, hw.memory_gb, hw.kind == "cpu" ? "node" : "device");
  for (const PlanTerm& t : p.info) fmt::print("  info    {:<24} {:>12.4g}\n", t.name, t.value);
}

// A mixture's line: what its FLOPs count and that the all-to-alls are not overlapped.
void print_moe(const PlanModel& model) {
  const GPTConfig& b = model.block;
  if (!b.has_moe()) return;
  fmt::print("plan: mixture of {} experts (width {}), top {}, in {} of {} layers: FLOPs count "
             "the active parameters; ep's all-to-alls are counted exposed, not overlapped "
             "(moe_all_to_all_exposed); routing taken as balanced\n",
             b.moe.experts, b.expert_width(), b.moe.top_k,
             (model.layers + b.moe.every - 1) / b.moe.every, model.layers);
}

// Why the best wins over the runner-up: the terms that differ most.
std::string why_best(const Prediction& a, const Prediction& b) {
  std::vector<std::pair<double, std::string>> d;
  for (const PlanTerm& t : a.time) d.push_back({b.term(t.name) - t.value, t.name});
  std::sort(d.begin(), d.end(),
            [](const auto& x, const auto& y) { return std::abs(x.first) > std::abs(y.first); });
  if (b.step_s - a.step_s <= 1e-9 * a.step_s)
    return fmt::format("ties with #2 ({}) at {:.4g} s per step and holds {:.3g} GB per rank "
                       "against its {:.3g} GB",
                       format_layout(b.layout), a.step_s, a.memory_bytes / 1e9,
                       b.memory_bytes / 1e9);
  std::string s = fmt::format("{:.1f}% faster than #2 ({}): ", 100 * (b.step_s / a.step_s - 1),
                              format_layout(b.layout));
  for (size_t i = 0; i < d.size() && i < 3; ++i)
    if (d[i].first != 0)
      s += fmt::format("{}{} {:+.3g} s", i ? ", " : "", d[i].second, -d[i].first);
  return s + " per step against it";
}

void draw_png(const std::vector<Prediction>& top, const Hardware& hw, const std::string& png) {
  const std::string script = find_in_tree("tools/plot_plan.py");
  if (script.empty()) input_error("--png: tools/plot_plan.py not found beside the build");
  const std::string data = png + ".jsonl";
  {
    std::ofstream out(data);
    for (const Prediction& p : top) out << to_json(p, hw).dump() << "\n";
    if (!out) input_error("--png: cannot write {}", data);
  }
  const std::string cmd = fmt::format("/usr/bin/python3 '{}' '{}' --out '{}'", script, data, png);
  if (std::system(cmd.c_str()) != 0)
    input_error("--png: {} failed (it needs python3-matplotlib)", cmd);
  fmt::print("plan: wrote {} (data {})\n", png, data);
}

// The largest model per device count at each ZeRO stage: 1, 2, 4, ... up to --gpus (1024).
int print_zero_capacity(const PlanArgs& args, const PlanModel& model, const Hardware& hw) {
  const int most = args.gpus > 0 ? args.gpus : 1024;
  std::vector<int> devices;
  for (int n = 1; n < most; n *= 2) devices.push_back(n);
  devices.push_back(most);
  const std::vector<int> zeros = args.zero.empty() ? std::vector<int>{0, 1, 2, 3} : args.zero;
  if (!args.json)
    fmt::print("plan: the largest model that fits {:.4g} GB per {} ({}, {}), by ZeRO stage: "
               "the deck's block (d_model {}) with its layers scaled, dp = devices, model "
               "states only (params, grads, optimizer; ZeRO-3's gathered pool), no "
               "activations\n{:>8}",
               hw.memory_gb, hw.kind == "cpu" ? "node" : "device", hw.name, hw.dtype, model.d_model,
               "devices");
  if (!args.json)
    for (int z : zeros) fmt::print("  {:>14}", fmt::format("zero {} params", z));
  for (int n : devices) {
    if (!args.json) fmt::print("\n{:>8}", n);
    for (int z : zeros) {
      const ZeroCapacity c = zero_capacity(model, hw, z, n);
      if (args.json)
        fmt::print("{}\n", nlohmann::json{{"zero", c.zero},
                                          {"devices", c.devices},
                                          {"layers", c.layers},
                                          {"d_model", model.d_model},
                                          {"params", c.params},
                                          {"model_states_gb_per_rank", c.state_bytes / 1e9},
                                          {"memory_gb", c.capacity_bytes / 1e9},
                                          {"hardware", hw.name},
                                          {"dtype", hw.dtype}}
                               .dump());
      else fmt::print("  {:>14.4g}", c.params);
    }
  }
  if (!args.json) fmt::print("\n");
  return 0;
}

}  // namespace

int run_plan(const PlanArgs& args) {
  const Deck deck = load_deck(args.deck.deck, args.deck.overrides);
  Hardware hw = find_hardware(args.hardware);
  if (args.memory_gb > 0) hw.memory_gb = args.memory_gb;
  // A user's calibration of a shipped name wins (Note [User hardware files]): say so.
  const std::string shipped = find_in_tree("inputs/hardware/" + args.hardware + ".yaml");
  std::error_code ec;
  if (!args.json && !shipped.empty() && !std::filesystem::equivalent(shipped, hw.path, ec))
    fmt::print("plan: --hardware {} reads {}, which shadows the shipped {} (give its path to "
               "use that one)\n",
               args.hardware, hw.path, shipped);
  PlanModel model = PlanModel::from_deck(deck);
  model.async_checkpoint = model.async_checkpoint || args.async_checkpoint;
  if (!deck.model.init_from.empty() && !args.json)
    fmt::print("plan: model.init_from is set ({}); the plan uses the deck's model.* shape "
               "({} layers, d_model {}, {} heads, vocab {}), not the file's: set them to match\n",
               deck.model.init_from, model.layers, model.d_model, model.heads, model.vocab);
  GPTConfig block = model.block;
  block.channels = model.d_model;
  if (hw.kind == "gpu" && !block.is_gpt2_block() && !args.json)
    fmt::print("plan: {}; trident's GPU kernels for this block are built but have not yet run "
               "on a GPU (tools/gpu-check.sh), so this plan is a target for it\n",
               describe_block(block));
  // Note [Widening at the bf16 boundary] (src/model/gpt_bf16_widen.cpp): a bf16 run computes
  // cp's attention and the mixtures through the fp32 ops, which the plan prices at the file's
  // bf16 rates: say so where the search may choose them. What they hold and send is fp32 and
  // counted so (cp's K/V exchange, the mixtures' buffers).
  if (hw.kind == "gpu" && hw.dtype == "bf16" && !args.json)
    fmt::print("plan: priced in bf16; trident's bf16 runs compute {}context parallelism's "
               "attention (cp > 1) in fp32 ops on bf16 inputs, priced here at bf16 rates (a "
               "target until a GPU has measured them), at tp > 1 too (Note [Widening under tp]); "
               "cp's K/V exchange is priced in fp32 (4 B), as it is sent\n",
               model.block.has_moe() ? "the mixtures and " : "");
  const int deck_dp = deck.parallel.dp > 0 ? deck.parallel.dp : 1;
  const int global_batch = args.global_batch > 0
                               ? args.global_batch
                               : deck.train.micro_batch * deck.train.accum * deck_dp;
  const int threads = hw.kind == "cpu" ? deck.run.threads : 1;

  if (args.zero_capacity) return print_zero_capacity(args, model, hw);

  if (!args.layout.empty()) {
    // Keys the text leaves out keep the deck's values (ZeRO-3's and HSDP's keys too, once the
    // deck has them: parallel.dp_shard, reshard_after_forward, zero3_gather).
    PlanLayout defaults;
    defaults.dp = deck_dp;
    defaults.tp = deck.parallel.tp;
    defaults.pp = deck.parallel.pp;
    defaults.cp = deck.parallel.cp;
    defaults.cp_comm = deck.parallel.cp_comm;
    defaults.v = deck.parallel.virtual_stages;
    defaults.micro_batch = deck.train.micro_batch;
    defaults.accum = deck.train.accum;
    defaults.zero = deck.parallel.zero;
    defaults.zero_reduce = deck.parallel.zero_reduce;
    defaults.recompute = deck.train.recompute;
    defaults.schedule = deck.parallel.schedule;
    defaults.sequence_parallel = deck.parallel.sequence_parallel;
    defaults.threads = threads;
    const PlanLayout layout = parse_layout(args.layout, args.global_batch, defaults);
    if (args.gpus > 0 && args.gpus != layout.world())
      input_error("--layout: dp·cp·tp·pp = {} but --gpus is {}", layout.world(), args.gpus);
    const Prediction p = predict(model, layout, hw);
    if (p.step_s <= 0)  // a layout trident refuses: bad input
      input_error("--layout {}: {}", args.layout, p.why_not);
    if (args.json) {
      nlohmann::json j = to_json(p, hw);
      if (model.async_checkpoint) add_snapshot(j, p, hw);
      fmt::print("{}\n", j.dump());
    } else {
      print_moe(model), print_one(p, hw);
      if (model.async_checkpoint) fmt::print("  {}\n", snapshot_line(p, hw));
    }
    if (!args.png.empty()) draw_png({p}, hw, args.png);
    return 0;
  }

  if (args.gpus <= 0) input_error("trident plan: --gpus N (or --layout) is needed");
  PlanSearch search;
  search.gpus = args.gpus;
  search.global_batch = global_batch;
  search.threads = threads;
  if (!args.tp.empty()) search.tp = args.tp;
  if (!args.pp.empty()) search.pp = args.pp;
  if (!args.ep.empty()) search.ep = args.ep;
  if (!args.micro.empty()) search.micro_batches = args.micro;
  if (!args.zero.empty()) search.zero = args.zero;
  if (!args.dp_shard.empty()) search.dp_shard = args.dp_shard;
  if (!args.sp.empty()) search.sequence_parallel = args.sp;
  if (!args.recompute.empty()) search.recompute = args.recompute;
  if (!args.schedules.empty()) search.schedules = args.schedules;
  search.max_v = args.max_v;
  const std::vector<Prediction> ranked = rank_layouts(model, hw, search);
  if (ranked.empty())
    input_error("trident plan: no layout of {} ranks runs {} sequences per step (the global "
                "batch must be a multiple of dp·micro_batch; heads {} must divide by tp)",
                args.gpus, global_batch, model.heads);
  const size_t top = std::min(ranked.size(), size_t(args.top));
  if (args.json) {
    for (size_t i = 0; i < top; ++i) {
      nlohmann::json j = to_json(ranked[i], hw);
      if (model.async_checkpoint) add_snapshot(j, ranked[i], hw);
      fmt::print("{}\n", j.dump());
    }
  } else {
    size_t fitting = 0;
    for (const Prediction& p : ranked) fitting += p.fits;
    fmt::print("plan: {} ({} layers, d_model {}, {} heads, seq {}), {} on {} ({} rank{}), "
               "global batch {} sequences; {} layouts, {} fit\n",
               deck.source, model.layers, model.d_model, model.heads, model.seq_len, hw.name,
               hw.path, args.gpus, args.gpus > 1 ? "s" : "", global_batch, ranked.size(), fitting);
    print_moe(model);
    fmt::print("{:>3}  {:<90} {:>11} {:>9} {:>6} {:>9}  {}\n", "#", "layout", "tokens/s", "TFLOP/s",
               "MFU", "GB/rank", "step split");
    for (size_t i = 0; i < top; ++i) {
      const Prediction& p = ranked[i];
      fmt::print("{:>3}  {:<90} {:>11.4g} {:>9.4g} {:>6} {:>9.3g}  {}{}\n", i + 1,
                 format_layout(p.layout), p.tokens_per_s, p.tflops_per_gpu,
                 format_mfu_percent(p.mfu), p.memory_bytes / 1e9, p.fits ? "" : "[does not fit] ",
                 split(p));
    }
    if (ranked.size() > 1 && ranked[0].fits && ranked[1].fits)
      fmt::print("best: {}\n", why_best(ranked[0], ranked[1]));
    else if (!ranked[0].fits)
      fmt::print("plan: no layout fits in {:.4g} GB per {}\n", hw.memory_gb,
                 hw.kind == "cpu" ? "node" : "device");
    if (model.async_checkpoint) fmt::print("#1 {}\n", snapshot_line(ranked[0], hw));
  }
  if (!args.png.empty())
    draw_png({ranked.begin(), ranked.begin() + std::min<size_t>(top, 8)}, hw, args.png);
  return 0;
}

}  // namespace trident
