#include "trident/trace.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "trident/check.h"

namespace trident {

TraceWriter::TraceWriter(std::string path, int rank, Clock::time_point origin)
    : path_(std::move(path)), rank_(rank), origin_(origin) {}

int TraceWriter::track_id(const std::string& track) {
  for (size_t i = 0; i < tracks_.size(); ++i)
    if (tracks_[i] == track) return int(i);
  tracks_.push_back(track);
  return int(tracks_.size() - 1);
}

double TraceWriter::ms_since_origin(Clock::time_point t) const {
  return std::chrono::duration<double, std::milli>(t - origin_).count();
}

void TraceWriter::span(const std::string& track, const std::string& name, double begin_ms,
                       double end_ms, const std::string& category) {
  events_.push_back({track_id(track), name, category, begin_ms, end_ms});
}

void TraceWriter::span(const std::string& track, const std::string& name, Clock::time_point begin,
                       Clock::time_point end, const std::string& category) {
  span(track, name, ms_since_origin(begin), ms_since_origin(end), category);
}

void TraceWriter::write() const {
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"ph", "M"},
                    {"name", "process_name"},
                    {"pid", rank_},
                    {"args", {{"name", "rank " + std::to_string(rank_)}}}});
  for (size_t t = 0; t < tracks_.size(); ++t) {
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", rank_},
                      {"tid", t},
                      {"args", {{"name", tracks_[t]}}}});
    events.push_back({{"ph", "M"},
                      {"name", "thread_sort_index"},
                      {"pid", rank_},
                      {"tid", t},
                      {"args", {{"sort_index", t}}}});
  }
  for (const Event& e : events_) {
    nlohmann::json j = {
        {"ph", "X"},      {"name", e.name},         {"pid", rank_},
        {"tid", e.track}, {"ts", e.begin_ms * 1e3}, {"dur", (e.end_ms - e.begin_ms) * 1e3}};
    if (!e.category.empty()) j["cat"] = e.category;
    events.push_back(std::move(j));
  }
  const std::string tmp = path_ + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) input_error("log.trace: cannot write {}", tmp);
    out << nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() << '\n';
    TRIDENT_CHECK(bool(out), "write to {} failed", tmp);
  }
  std::filesystem::rename(tmp, path_);
}

}  // namespace trident
