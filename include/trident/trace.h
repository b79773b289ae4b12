// Chrome-trace timelines (the JSON "traceEvents" format; open in Perfetto or chrome://tracing).
// One file per rank; each track ("compute", "all-reduce", ...) is a thread row of that rank.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace trident {

class TraceWriter {
 public:
  using Clock = std::chrono::steady_clock;
  // Times are relative to `origin`; `rank` becomes the process id of every event.
  TraceWriter(std::string path, int rank, Clock::time_point origin);
  // A complete event [begin_ms, end_ms] (milliseconds since origin) on `track`.
  void span(const std::string& track, const std::string& name, double begin_ms, double end_ms,
            const std::string& category = "");
  void span(const std::string& track, const std::string& name, Clock::time_point begin,
            Clock::time_point end, const std::string& category = "");
  double ms_since_origin(Clock::time_point t) const;
  Clock::time_point origin() const { return origin_; }
  // Writes the file (atomically: a temporary name, then rename). Called again, it rewrites it.
  void write() const;
  const std::string& path() const { return path_; }

 private:
  struct Event {
    int track;
    std::string name, category;
    double begin_ms, end_ms;
  };
  int track_id(const std::string& track);
  std::string path_;
  int rank_;
  Clock::time_point origin_;
  std::vector<std::string> tracks_;
  std::vector<Event> events_;
};

}  // namespace trident
