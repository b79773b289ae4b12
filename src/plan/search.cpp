// Layouts as text, and the search over them (trident/plan.h).
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <sstream>

#include "plan/plan_parts.h"
#include "trident/check.h"

namespace trident {
namespace {

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

int parse_positive(const std::string& key, const std::string& value, int min) {
  int v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || v < min)
    input_error("--layout: {}={} must be an integer ≥ {}", key, value, min);
  return v;
}

struct Zero3Option {
  int dp_shard = 0;
  bool reshard_after_forward = true;
  std::string gather = "micro_batch";
};

// ZeRO-3's variants of one layout: the shard group all of dp, or an HSDP split whose shard
// group (tp·dp_shard consecutive ranks) fills part of a node (the replicas then cross nodes);
// units regathered for backward or kept from forward; under pp or accumulation gathered per
// micro-batch or once per step (which keeps them: reshard_after_forward has no say then).
// Other stages: one variant, the defaults.
std::vector<Zero3Option> zero3_options(const PlanSearch& search, const Hardware& hw, int zero,
                                       int dp, int tp, int pp, int accum) {
  if (zero != 3) return {Zero3Option{}};
  const int per_node =
      hw.kind == "cpu" ? hw.devices_per_node / std::max(1, search.threads) : hw.devices_per_node;
  std::vector<int> shards;
  for (int s : divisors(dp)) {
    const bool in_node = s > 1 && s < dp && per_node > 0 && per_node % (tp * s) == 0;
    if (search.dp_shard.empty()
            ? (s == dp || in_node)
            : std::find(search.dp_shard.begin(), search.dp_shard.end(), s) != search.dp_shard.end())
      shards.push_back(s);
  }
  std::vector<Zero3Option> out;
  for (int s : shards) {
    out.push_back({s, true, "micro_batch"});
    out.push_back({s, false, "micro_batch"});
    if (pp > 1 || accum > 1) out.push_back({s, true, "step"});
  }
  return out;
}

// Note [Plan reductions per micro-batch]: a choice under accumulation only, where the trainer
// runs rounds (ZeRO-2/3, one chunk per stage, a one-pass backward).
std::vector<const char*> zero_reduce_options(int zero, int accum, int v,
                                             const std::string& schedule) {
  if (zero < 2 || accum == 1 || v > 1 || schedule == "zb-h1") return {"step"};
  return {"step", "micro_batch"};
}

}  // namespace

PlanLayout parse_layout(const std::string& text, int global_batch, const PlanLayout& defaults) {
  PlanLayout l = defaults;
  bool accum_given = false, dp_given = false;
  int replicate = 0;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos) input_error("--layout: \"{}\" is not key=value", item);
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "dp") l.dp = parse_positive(key, value, 1), dp_given = true;
    else if (key == "tp") l.tp = parse_positive(key, value, 1);
    else if (key == "pp") l.pp = parse_positive(key, value, 1);
    else if (key == "cp") l.cp = parse_positive(key, value, 1);
    else if (key == "ep") l.ep = parse_positive(key, value, 1);
    else if (key == "cp_comm") {
      if (value != "ring" && value != "allgather")
        input_error("--layout: cp_comm={} must be ring or allgather", value);
      l.cp_comm = value;
    } else if (key == "v") l.v = parse_positive(key, value, 1);
    else if (key == "micro") l.micro_batch = parse_positive(key, value, 1);
    else if (key == "accum") l.accum = parse_positive(key, value, 1), accum_given = true;
    else if (key == "zero") {
      l.zero = parse_positive(key, value, 0);
      if (l.zero > 3) input_error("--layout: zero={} must be 0, 1, 2 or 3", value);
    } else if (key == "dp_shard") l.dp_shard = parse_positive(key, value, 1);
    else if (key == "dp_replicate") replicate = parse_positive(key, value, 1);
    else if (key == "reshard_after_forward") {
      if (value != "0" && value != "1" && value != "true" && value != "false")
        input_error("--layout: reshard_after_forward={} must be true or false", value);
      l.reshard_after_forward = value == "1" || value == "true";
    } else if (key == "zero3_gather") {
      if (value != "micro_batch" && value != "step")
        input_error("--layout: zero3_gather={} must be micro_batch or step", value);
      l.zero3_gather = value;
    } else if (key == "zero_reduce") {
      if (value != "micro_batch" && value != "step")
        input_error("--layout: zero_reduce={} must be step or micro_batch", value);
      l.zero_reduce = value;
    } else if (key == "recompute") {
      if (value != "none" && value != "mlp" && value != "full")
        input_error("--layout: recompute={} must be none, mlp or full", value);
      l.recompute = value;
    } else if (key == "schedule") {
      if (value != "gpipe" && value != "1f1b" && value != "zb-h1" && value != "interleaved")
        input_error("--layout: schedule={} must be gpipe, 1f1b, zb-h1 or interleaved", value);
      l.schedule = value;
    } else if (key == "sp") {
      if (value != "0" && value != "1" && value != "true" && value != "false")
        input_error("--layout: sp={} must be true or false", value);
      l.sequence_parallel = value == "1" || value == "true";
    } else if (key == "threads") l.threads = parse_positive(key, value, 1);
    else if (key == "node") l.ranks_per_node = parse_positive(key, value, 1);
    else
      input_error(
          "--layout: unknown key \"{}\" (keys: dp tp pp cp cp_comm ep v micro accum zero dp_shard "
          "dp_replicate reshard_after_forward zero3_gather zero_reduce recompute schedule sp "
          "threads "
          "node)",
          key);
  }
  // HSDP: dp = dp_replicate × dp_shard; either one with dp, or both (then dp follows).
  if (replicate > 0) {
    if (l.dp_shard > 0 && !dp_given) l.dp = replicate * l.dp_shard;
    if (l.dp % replicate != 0)
      input_error("--layout: dp_replicate={} must divide dp={}", replicate, l.dp);
    if (l.dp_shard > 0 && replicate * l.dp_shard != l.dp)
      input_error("--layout: dp_replicate·dp_shard = {}·{} must be dp={}", replicate, l.dp_shard,
                  l.dp);
    l.dp_shard = l.dp / replicate;
  }
  if (l.dp_shard > 0 && l.dp % l.dp_shard != 0)
    input_error("--layout: dp_shard={} must divide dp={}", l.dp_shard, l.dp);
  if (l.dp_shard > 0 && l.dp_shard < l.dp && l.zero != 3)
    input_error("--layout: dp_shard={} < dp={} (HSDP) needs zero=3", l.dp_shard, l.dp);
  if (l.v > 1 && l.schedule == "1f1b") l.schedule = "interleaved";
  if (l.v == 1 && l.schedule == "interleaved") l.schedule = "1f1b";
  if (!accum_given && global_batch > 0) {
    const int per_step = l.dp * l.micro_batch;
    if (global_batch % per_step != 0)
      input_error("--layout: the global batch {} is not a multiple of dp·micro = {}", global_batch,
                  per_step);
    l.accum = global_batch / per_step;
  }
  return l;
}

std::string format_layout(const PlanLayout& l) {
  std::string s = fmt::format("dp={},tp={},pp={},", l.dp, l.tp, l.pp);
  if (l.cp > 1) s += fmt::format("cp={},{}", l.cp, l.cp_comm == "ring" ? "" : "cp_comm=allgather,");
  if (l.ep > 1) s += fmt::format("ep={},", l.ep);
  s += fmt::format("v={},micro={},accum={},zero={}", l.v, l.micro_batch, l.accum, l.zero);
  if (l.zero == 3) {  // the HSDP split, and ZeRO-3's options where not the default
    if (l.replicas() > 1) s += fmt::format(",dp_replicate={}", l.replicas());
    s += fmt::format(",dp_shard={}", l.shard());
    if (!l.reshard_after_forward) s += ",reshard_after_forward=false";
    if (l.zero3_gather != "micro_batch") s += ",zero3_gather=" + l.zero3_gather;
  }
  if (l.zero_reduce != "step") s += ",zero_reduce=" + l.zero_reduce;
  s += ",recompute=" + l.recompute;
  if (l.pp > 1) s += ",schedule=" + l.schedule;
  if (l.tp > 1) s += fmt::format(",sp={}", l.sequence_parallel ? 1 : 0);
  if (l.threads > 1) s += fmt::format(",threads={}", l.threads);
  if (l.ranks_per_node > 0) s += fmt::format(",node={}", l.ranks_per_node);
  return s;
}

std::vector<Prediction> rank_layouts(const PlanModel& m, const Hardware& hw,
                                     const PlanSearch& search) {
  std::vector<Prediction> out;
  const int gpus = search.gpus;
  auto allowed = [](const std::vector<int>& only, int x) {
    return only.empty() || std::find(only.begin(), only.end(), x) != only.end();
  };
  // cp where each sequence splits into 2·cp chunks of at least kMinCpChunkTokens (or the sizes
  // asked for), each with every exchange asked for.
  std::vector<std::pair<int, std::string>> cps;
  for (int cp : divisors(gpus)) {
    const bool fits = m.seq_len % (2 * cp) == 0 && m.seq_len / (2 * cp) >= kMinCpChunkTokens;
    if (!(search.cp.empty() ? cp == 1 || fits : allowed(search.cp, cp))) continue;
    if (cp == 1) cps.push_back({1, "ring"});  // no exchange to choose
    else
      for (const std::string& comm : search.cp_comm) cps.push_back({cp, comm});
  }
  // ep: the divisors of the experts that divide dp·cp (or the sizes asked for); 1 when dense.
  auto eps = [&](int dp_cp) {
    std::vector<int> out;
    if (m.block.moe.experts == 0) return std::vector<int>{1};
    for (int ep : divisors(std::max(1, m.block.moe.experts)))
      if (dp_cp % ep == 0 && allowed(search.ep, ep)) out.push_back(ep);
    return out;
  };
  for (const auto& [cp, cp_comm] : cps)
    for (int tp : divisors(gpus / cp))
      for (int pp : divisors(gpus / (cp * tp))) {
        const int dp = gpus / (cp * tp * pp);
        if (pp > m.layers || m.heads % tp != 0) continue;
        if (!allowed(search.tp, tp) || !allowed(search.pp, pp)) continue;
        for (int micro : search.micro_batches) {
          if (search.global_batch % (dp * micro) != 0) continue;
          const int accum = search.global_batch / (dp * micro);
          std::vector<std::pair<std::string, int>> schedules = {{"1f1b", 1}};
          if (pp > 1)
            for (const std::string& s : search.schedules) {
              if (s == "interleaved")
                for (int v = 2; v <= search.max_v; ++v) schedules.push_back({s, v});
              else if (s != "1f1b") schedules.push_back({s, 1});
            }
          for (const auto& [schedule, v] : schedules)
            for (const std::string& recompute : search.recompute)
              for (int zero : search.zero) {
                if (dp == 1 && zero > 0) continue;
                for (const Zero3Option& z3 : zero3_options(search, hw, zero, dp, tp, pp, accum))
                  for (const char* zero_reduce : zero_reduce_options(zero, accum, v, schedule))
                    for (int sp : search.sequence_parallel)
                      for (int ep : eps(dp * cp)) {
                        if (sp == 1 && tp == 1) continue;
                        if (sp == 0 && tp > 1 && !allowed(search.sequence_parallel, 0)) continue;
                        PlanLayout l;
                        l.dp = dp, l.tp = tp, l.pp = pp, l.v = v, l.micro_batch = micro;
                        l.cp = cp, l.cp_comm = cp_comm, l.ep = ep;
                        l.accum = accum, l.zero = zero, l.recompute = recompute;
                        l.schedule = schedule, l.sequence_parallel = sp == 1;
                        l.dp_shard = z3.dp_shard,
                        l.reshard_after_forward = z3.reshard_after_forward;
                        l.zero3_gather = z3.gather;
                        l.zero_reduce = zero_reduce;
                        l.threads = search.threads;
                        Prediction p = predict(m, l, hw);
                        if (p.step_s <= 0)
                          continue;  // a layout trident refuses (p.why_not says why)
                        out.push_back(std::move(p));
                      }
              }
        }
      }
  std::stable_sort(out.begin(), out.end(), [](const Prediction& a, const Prediction& b) {
    if (a.fits != b.fits) return a.fits;
    if (a.tokens_per_s != b.tokens_per_s) return a.tokens_per_s > b.tokens_per_s;
    return a.memory_bytes < b.memory_bytes;
  });
  return out;
}

}  // namespace trident
