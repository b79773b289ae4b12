// Note [ZeRO-3 units] (zero3.h): the units, and the gathers' schedule over a step.
#include "train/zero3.h"

#include "train/zero3_pool.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "trident/check.h"
#include "trident/grad_reducer.h"

namespace trident {

std::vector<std::string> zero3_unit_names(const std::vector<ParamInfo>& params) {
  std::vector<std::string> names;
  for (const ParamInfo& p : params) {
    if (p.layer >= 0) names.push_back(fmt::format("h{}", p.layer));
    else if (p.name == "wte" || p.name == "wpe") names.push_back(p.name);
    else names.push_back("head");  // the final norm, an untied LM head
  }
  for (size_t i = 0; i < names.size(); ++i)
    for (size_t j = i + 2; j < names.size(); ++j)
      if (names[j] == names[i] && names[j - 1] != names[i])
        internal_error(__FILE__, __LINE__,
                       fmt::format("ZeRO-3 unit '{}' is not one run of the parameter list: '{}' "
                                   "lies between its '{}' and '{}'",
                                   names[i], params[j - 1].name, params[i].name, params[j].name));
  return names;
}

UnitGathers::UnitGathers(GradReducer& reducer, const GPT& model,
                         const std::vector<int>& reducer_unit_first, Options options)
    : reducer_(reducer), options_(options) {
  const std::vector<ParamInfo>& params = model.params_info();
  const std::vector<std::string> names = zero3_unit_names(params);
  unit_of_param_.assign(params.size(), -1);
  for (size_t i = 0; i < params.size(); ++i) {
    if (i == 0 || names[i] != names[i - 1]) units_.push_back({names[i], i, i, 0, 0});
    units_.back().end_param = i + 1;
    unit_of_param_[i] = int(units_.size()) - 1;
  }
  for (Zero3Unit& u : units_) {
    u.first_bucket = reducer.bucket_of_param(size_t(reducer_unit_first[u.first_param]));
    u.end_bucket = reducer.bucket_of_param(size_t(reducer_unit_first[u.end_param]) - 1) + 1;
  }
  for (size_t k = 1; k < units_.size(); ++k)
    TRIDENT_CHECK(units_[k].first_bucket == units_[k - 1].end_bucket,
                  "ZeRO-3 units '{}' and '{}' share a bucket", units_[k - 1].name, units_[k].name);

  group_of_first_param_.assign(params.size(), -1);
  for (int pass = 0; pass < 2; ++pass)
    for (int chunk = 0; chunk < model.stage().chunks(); ++chunk) {
      std::vector<int> seq;
      for (const std::vector<int>& group : model.param_use_sequence(chunk, ParamPass(pass))) {
        int& g = group_of_first_param_[size_t(group.front())];
        if (g < 0) {
          g = int(group_units_.size());
          std::vector<int> units;
          for (int p : group) {
            const int u = unit_of_param_[size_t(p)];
            if (std::find(units.begin(), units.end(), u) == units.end()) units.push_back(u);
          }
          group_units_.push_back(std::move(units));
        }
        seq.push_back(g);
      }
      sequences_.push_back(std::move(seq));
    }
  // Each group has one place per pass (a pass is one chunk's).
  for (int pass = 0; pass < 2; ++pass) {
    place_[pass].assign(group_units_.size(), Place{});
    const int chunks = model.stage().chunks();
    for (int c = 0; c < chunks; ++c) {
      const int s = pass * chunks + c;
      const std::vector<int>& seq = sequences_[size_t(s)];
      for (size_t k = 0; k < seq.size(); ++k) place_[pass][size_t(seq[k])] = {s, int(k)};
    }
  }
  // Where each unit is last read in each pass (a tied wte: the head's group, after the blocks).
  last_use_.assign(sequences_.size(), std::vector<int>(units_.size(), -1));
  for (size_t q = 0; q < sequences_.size(); ++q)
    for (size_t k = 0; k < sequences_[q].size(); ++k)
      for (int u : group_units_[size_t(sequences_[q][k])]) last_use_[q][size_t(u)] = int(k);
  held_.assign(units_.size(), 0);
  keep_.assign(units_.size(), 0);
  if (const char* fault = std::getenv("TRIDENT_FAULT_STALL_GATHER")) {
    const std::string text = fault;
    const size_t at = text.find('@');
    for (size_t u = 0; u < units_.size() && at != std::string::npos; ++u)
      if (units_[u].name == text.substr(0, at)) stall_unit_ = int(u);
    if (stall_unit_ >= 0) stall_at_ = std::atoi(text.c_str() + at + 1);
  }
  if (options_.log) log_.reserve(16 * units_.size());
}

void UnitGathers::use(ParamPass pass, const std::vector<int>& params) {
  TRIDENT_CHECK(!params.empty(), "ZeRO-3: an empty parameter group");
  const int g = group_of_first_param_[size_t(params.front())];
  TRIDENT_CHECK(g >= 0, "ZeRO-3: parameter {} opens no group the model announced", params.front());
  const Place place = place_[int(pass)][size_t(g)];
  TRIDENT_CHECK(place.sequence >= 0, "ZeRO-3: group of parameter {} is in no {} pass",
                params.front(), pass == ParamPass::kForward ? "forward" : "backward");
  const std::vector<int>& seq = sequences_[size_t(place.sequence)];
  const auto pos = size_t(place.position);
  static const std::vector<int> kNone;
  const std::vector<int>& now = group_units_[size_t(g)];
  const std::vector<int>& next = pos + 1 < seq.size() ? group_units_[size_t(seq[pos + 1])] : kNone;

  std::fill(keep_.begin(), keep_.end(), 0);
  for (int u : now) keep_[size_t(u)] = 1;
  for (int u : next) keep_[size_t(u)] = 1;
  // A unit a later group of this pass reads stays (the tied wte through forward, from the
  // embedding to the head, as FSDP keeps its root): one gather, and no wait at the head.
  const std::vector<int>& last = last_use_[size_t(place.sequence)];
  for (size_t u = 0; u < units_.size(); ++u)
    if (held_[u] && last[u] > int(pos)) keep_[u] = 1;
  if (!options_.per_step) {
    if (options_.reshard_after_forward) {
      for (size_t u = 0; u < units_.size(); ++u)
        if (held_[u] && !keep_[u]) release(int(u), pass, int(pos));
    } else if (pass == ParamPass::kBackward && pos > 0) {
      for (int u : group_units_[size_t(seq[pos - 1])])
        if (held_[size_t(u)] && !keep_[size_t(u)]) release(u, pass, int(pos));
    }
  }
  for (int u : now)
    if (!held_[size_t(u)]) request(u, pos > 0, pass, int(pos));
  for (int u : next)
    if (!held_[size_t(u)]) request(u, false, pass, int(pos));
  for (int u : now) {
    if (options_.log) log_.push_back({LogEntry::kWait, u, pass, int(pos)});
    wait(u);
  }
}

void UnitGathers::request(int unit, bool late, ParamPass pass, int position) {
  const Zero3Unit& u = units_[size_t(unit)];
  if (unit == stall_unit_ && ++stall_count_ == stall_at_)
    std::this_thread::sleep_for(std::chrono::minutes(10));
  reducer_.gather(u.first_bucket, u.end_bucket, u.name, pool_ ? pool_->take(unit) : nullptr);
  held_[size_t(unit)] = 1;
  ++counts_.gathers;
  counts_.late += late ? 1 : 0;
  if (options_.log) log_.push_back({LogEntry::kRequest, unit, pass, position});
}

void UnitGathers::wait(int unit) {
  const Zero3Unit& u = units_[size_t(unit)];
  for (size_t b = u.first_bucket; b < u.end_bucket; ++b) reducer_.wait_gathered(b);
}

void UnitGathers::release(int unit, ParamPass pass, int position) {
  wait(unit);  // a prefetch never used may still be on the wire
  const Zero3Unit& u = units_[size_t(unit)];
  reducer_.release_gathered(u.first_bucket, u.end_bucket);
  if (pool_) pool_->give_back(unit);
  held_[size_t(unit)] = 0;
  if (options_.log) log_.push_back({LogEntry::kRelease, unit, pass, position});
}

void UnitGathers::release_all() {
  for (size_t u = 0; u < units_.size(); ++u)
    if (held_[u]) release(int(u), ParamPass::kForward, -1);
}

void UnitGathers::gather_all() {
  for (size_t u = 0; u < units_.size(); ++u)
    if (!held_[u]) request(int(u), false, ParamPass::kForward, -1);
  for (size_t u = 0; u < units_.size(); ++u) wait(int(u));
}

UnitGathers::Counts UnitGathers::take_counts() {
  const Counts c = counts_;
  counts_ = {};
  return c;
}

}  // namespace trident
