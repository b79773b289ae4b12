// A checkpoint snapshot's host copy, timed (docs/perf.md, "Checkpoint snapshot: planner vs
// measured"): BYTES copied from a filled source into a destination touched beforehand (a
// snapshot buffer is allocated once and reused), on 1 and on THREADS threads, each thread
// copying its own contiguous slice with memcpy. Validates the copy, then prints the median of
// REPS runs and every run, in GB/s of bytes copied (GB = 1e9 B, as the planner's hardware files).
//
//   g++ -O2 -std=c++20 -pthread tools/snapshot_copy.cpp -o /tmp/snapshot_copy
//   /tmp/snapshot_copy 1492992000 2 5     # GPT-2 124M: 3 x 124.4 M floats
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

double copy_seconds(char* dst, const char* src, size_t bytes, int threads) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> team;
  for (int t = 0; t < threads; ++t)
    team.emplace_back([=] {
      const size_t lo = bytes * size_t(t) / size_t(threads);
      const size_t hi = bytes * size_t(t + 1) / size_t(threads);
      std::memcpy(dst + lo, src + lo, hi - lo);
    });
  for (std::thread& th : team) th.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const size_t bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1492992000ull;
  const int most = argc > 2 ? std::atoi(argv[2]) : 2;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 5;
  std::vector<char> src(bytes), dst(bytes);
  for (size_t i = 0; i < bytes; ++i) src[i] = char(i * 7 + 3);
  std::memset(dst.data(), 0, bytes);  // pre-touched: no page faults in the timed copies
  for (int threads = 1; threads <= most; threads *= 2) {
    std::vector<double> gbs;
    for (int r = 0; r < reps; ++r) {
      std::memset(dst.data(), 0, 4096);
      const double s = copy_seconds(dst.data(), src.data(), bytes, threads);
      for (size_t i = 0; i < bytes; i += bytes / 1009 + 1)
        if (dst[i] != src[i]) {
          std::fprintf(stderr, "snapshot_copy: byte %zu differs\n", i);
          return 1;
        }
      gbs.push_back(double(bytes) / s / 1e9);
    }
    std::vector<double> sorted = gbs;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2];
    std::printf("%zu bytes, %d thread(s): median %.2f GB/s = %.1f ms per copy; runs:", bytes,
                threads, median, 1e3 * double(bytes) / (median * 1e9));
    for (double g : gbs) std::printf(" %.2f", g);
    std::printf(" GB/s\n");
  }
  return 0;
}
