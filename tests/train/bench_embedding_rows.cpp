// The tied embedding's row collection at GPT-2 124M shape (vocab 50257 padded to 50304, B 4,
// T 64, accum 1, tp 1), per rank and step, as dp grows (Note [Step row set]):
//   GlobalScan/dp     the reference: read every dp rank's samples (dp·B·T tokens), mark bytes,
//                     scan the vocabulary;
//   LocalUnion/dp     the trainer's: mark this rank's B·T tokens, unite, list the rows. The union
//                     is the real MpiComm call on MPI_COMM_SELF, preceded by the OR of the other
//                     dp−1 ranks' bitmaps (precomputed from their samples) that the reduction's
//                     arithmetic does somewhere; the network's share is a model, printed at
//                     start (it cannot be measured with one process).
//   UnionArithmetic   the emulation's share of LocalUnion: ORing the other dp−1 bitmaps;
//   RowIndex*/dp      TiedEmbedding::sink's token → row lookup for one micro-batch: a binary
//                     search, and the dense index the trainer uses.
// Tokens are uniform over the vocabulary (the most distinct rows per step: the worst case for
// listing and zeroing rows). Validates first: both ways give the same rows at every dp.
// Run: build/tests/bench_train [--benchmark_filter=...]; not part of ctest.
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "train/embedding_rows.h"
#include "train/gpt_stage.h"
#include "trident/check.h"
#include "trident/data.h"

namespace trident {
namespace {

constexpr int kVocab = 50257, kPaddedVocab = 50304, kB = 4, kT = 64, kAccum = 1;

class UniformTokens final : public TokenDataset {
 public:
  explicit UniformTokens(size_t n) : tokens_(n), path_("uniform tokens") {
    std::mt19937_64 rng(1);
    std::uniform_int_distribution<int> pick(0, kVocab - 1);
    for (uint16_t& t : tokens_) t = uint16_t(pick(rng));
  }
  size_t n_tokens() const override { return tokens_.size(); }
  int32_t token(size_t i) const override { return tokens_[i]; }
  const std::string& path() const override { return path_; }
  void read(size_t first, size_t count, int32_t* out) const override {
    std::copy(tokens_.begin() + long(first), tokens_.begin() + long(first + count), out);
  }

 private:
  std::vector<uint16_t> tokens_;  // 2-byte tokens, widened on read, as the token files
  std::string path_;
};

constexpr size_t kDatasetTokens = size_t(1) << 20;  // step 3 at dp 64 reads 4·256·64 tokens

GPTStage::StepInputs step_inputs(int step, int dp, int rank) {
  return {step, kB, kT, kAccum, dp, rank};
}

// The reference: a scan of every dp rank's samples, marking bytes over the vocabulary.
void global_scan(const SampleOrder& order, int step, int dp, std::vector<int32_t>& rows) {
  const uint64_t global_batch = uint64_t(kB) * kAccum * dp;
  std::vector<uint8_t> seen(size_t(kVocab), 0);
  std::vector<int32_t> in(kT), tg(kT);
  for (uint64_t i = 0; i < global_batch; ++i) {
    order.fill(uint64_t(step) * global_batch + i, 1, in.data(), tg.data());
    for (int32_t t : in) seen[size_t(t)] = 1;
  }
  rows.clear();
  for (size_t v = 0; v < size_t(kPaddedVocab) && v < seen.size(); ++v)
    if (seen[v]) rows.push_back(int32_t(v));
}

void mark_rank(StepRowSet& set, const SampleOrder& order, int step, int dp, int rank,
               std::vector<int32_t>& in, std::vector<int32_t>& tg) {
  const GPTStage::StepInputs s = step_inputs(step, dp, rank);
  for (int m = 0; m < kAccum; ++m) {
    order.fill(GPTStage::first_sample(s, m), kB, in.data(), tg.data());
    set.mark(in.data(), in.size());
  }
}

// dp ranks in one process: the other ranks' bitmaps are ORed in (the reduction's arithmetic),
// then the real MPI all-reduce on MPI_COMM_SELF (the call's own cost on one rank).
class EmulatedDpComm final : public Communicator {
 public:
  EmulatedDpComm(int dp, std::vector<std::vector<uint64_t>> others)
      : dp_(dp), others_(std::move(others)), self_(MPI_COMM_SELF, "self") {}
  int rank() const override { return 0; }
  int size() const override { return dp_; }
  const std::string& name() const override { return name_; }
  Work start_all_to_all_v(const void*, const size_t*, void*, const size_t*, ElemType) override {
    return refuse();
  }

 protected:
  Work start_all_reduce_op(void* data, size_t count, ElemType type, ReduceOp op,
                           std::string_view label) override {
    TRIDENT_CHECK(op == ReduceOp::kBitOr && type == ElemType::kInt64, "OR of int64 only");
    auto* w = static_cast<uint64_t*>(data);
    for (const std::vector<uint64_t>& o : others_)
      for (size_t k = 0; k < count; ++k) w[k] |= o[k];
    return self_.all_reduce(static_cast<int64_t*>(data), count, op, label);
  }
  Work start_all_reduce(void*, size_t, ElemType) override { return refuse(); }
  Work start_reduce_scatter(const void*, void*, size_t, ElemType) override { return refuse(); }
  Work start_all_gather(const void*, void*, size_t, ElemType) override { return refuse(); }
  Work start_broadcast(void*, size_t, ElemType, int) override { return refuse(); }
  Work start_send(const void*, size_t, ElemType, int, int) override { return refuse(); }
  Work start_recv(void*, size_t, ElemType, int, int) override { return refuse(); }

 private:
  static Work refuse() { internal_error(__FILE__, __LINE__, "not used by the benchmark"); }
  int dp_;
  std::vector<std::vector<uint64_t>> others_;
  MpiComm self_;
  std::string name_ = "emulated dp";
};

// Ranks 1..dp−1's bitmaps for `step`, as their unite would send them (row r: bit r % 64 of
// word r / 64, StepRowSet's layout).
std::vector<std::vector<uint64_t>> other_ranks_bits(const SampleOrder& order, int step, int dp) {
  std::vector<std::vector<uint64_t>> out;
  std::vector<int32_t> in(size_t(kB) * kT), tg(in.size());
  for (int r = 1; r < dp; ++r) {
    std::vector<uint64_t> bits((size_t(kPaddedVocab) + 63) / 64, 0);
    const GPTStage::StepInputs s = step_inputs(step, dp, r);
    for (int m = 0; m < kAccum; ++m) {
      order.fill(GPTStage::first_sample(s, m), kB, in.data(), tg.data());
      for (int32_t t : in) bits[size_t(t) >> 6] |= uint64_t(1) << (t & 63);
    }
    out.push_back(std::move(bits));
  }
  return out;
}

void BM_GlobalScan(benchmark::State& state) {
  const int dp = int(state.range(0));
  const UniformTokens data(kDatasetTokens);
  SampleOrder order(data, kT, false, 0);
  std::vector<int32_t> rows;
  for (auto _ : state) {
    global_scan(order, 3, dp, rows);
    benchmark::DoNotOptimize(rows.data());
  }
  state.counters["rows"] = double(rows.size());
}

void BM_LocalUnion(benchmark::State& state) {
  const int dp = int(state.range(0));
  const UniformTokens data(kDatasetTokens);
  SampleOrder order(data, kT, false, 0);
  EmulatedDpComm comm(dp, other_ranks_bits(order, 3, dp));
  StepRowSet set(0, kPaddedVocab);
  std::vector<int32_t> in(size_t(kB) * kT), tg(in.size());
  for (auto _ : state) {
    set.clear();
    mark_rank(set, order, 3, dp, 0, in, tg);
    set.unite(comm);
    benchmark::DoNotOptimize(set.rows().data());
  }
  state.counters["rows"] = double(set.rows().size());
}

// The share of LocalUnion that the emulation adds: ORing dp−1 bitmaps into one. A real
// all-reduce spreads this over the ranks (recursive doubling: log2(dp) ORs per rank, not dp−1).
void BM_UnionArithmetic(benchmark::State& state) {
  const int dp = int(state.range(0));
  const UniformTokens data(kDatasetTokens);
  SampleOrder order(data, kT, false, 0);
  const std::vector<std::vector<uint64_t>> others = other_ranks_bits(order, 3, dp);
  std::vector<uint64_t> mine(others[0].size(), 0);
  for (auto _ : state) {
    for (const std::vector<uint64_t>& o : others)
      for (size_t k = 0; k < mine.size(); ++k) mine[k] |= o[k];
    benchmark::DoNotOptimize(mine.data());
  }
}

// TiedEmbedding::sink for one micro-batch of rank 0, against the dp-wide row set.
void row_index_setup(int dp, StepRowSet& set, std::vector<int32_t>& tokens) {
  const UniformTokens data(kDatasetTokens);
  SampleOrder order(data, kT, false, 0);
  EmulatedDpComm comm(dp, other_ranks_bits(order, 3, dp));
  std::vector<int32_t> tg(size_t(kB) * kT);
  tokens.resize(tg.size());
  set.clear();
  mark_rank(set, order, 3, dp, 0, tokens, tg);
  set.unite(comm);
}

void BM_RowIndexBinarySearch(benchmark::State& state) {
  StepRowSet set(0, kPaddedVocab);
  std::vector<int32_t> in, out(size_t(kB) * kT);
  row_index_setup(int(state.range(0)), set, in);
  const std::vector<int32_t>& rows = set.rows();
  for (auto _ : state) {
    for (size_t i = 0; i < in.size(); ++i) {
      auto it = std::lower_bound(rows.begin(), rows.end(), in[i]);
      out[i] = it != rows.end() && *it == in[i] ? int32_t(it - rows.begin()) : -1;
    }
    benchmark::DoNotOptimize(out.data());
  }
}

void BM_RowIndexDense(benchmark::State& state) {
  StepRowSet set(0, kPaddedVocab);
  std::vector<int32_t> in, out(size_t(kB) * kT);
  row_index_setup(int(state.range(0)), set, in);
  for (auto _ : state) {
    for (size_t i = 0; i < in.size(); ++i) out[i] = set.index_of(in[i]);
    benchmark::DoNotOptimize(out.data());
  }
}

BENCHMARK(BM_GlobalScan)->Arg(2)->Arg(8)->Arg(64)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LocalUnion)->Arg(2)->Arg(8)->Arg(64)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_UnionArithmetic)->Arg(64)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RowIndexBinarySearch)->Arg(64)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RowIndexDense)->Arg(64)->Unit(benchmark::kMicrosecond);

// Both ways give the same rows, in the same order.
bool validate() {
  const UniformTokens data(kDatasetTokens);
  SampleOrder order(data, kT, false, 0);
  for (int dp : {2, 8, 64}) {
    std::vector<int32_t> old_rows;
    global_scan(order, 3, dp, old_rows);
    EmulatedDpComm comm(dp, other_ranks_bits(order, 3, dp));
    StepRowSet set(0, kPaddedVocab);
    std::vector<int32_t> in(size_t(kB) * kT), tg(in.size());
    set.clear();
    mark_rank(set, order, 3, dp, 0, in, tg);
    set.unite(comm);
    if (set.rows() != old_rows) {
      std::fprintf(stderr, "dp %d: the union's %zu rows differ from the global scan's %zu\n", dp,
                   set.rows().size(), old_rows.size());
      return false;
    }
    std::printf("validated dp %d: %zu rows, the same as the global scan\n", dp, old_rows.size());
  }
  return true;
}

// The network's share of the union at dp ranks, for a message of `bytes`: recursive doubling
// (what MPI picks for small messages), log2(dp)·(latency + bytes/bandwidth), and the ring
// model of comm.emulate_gbps (emulated_link_seconds), 2(dp−1)·latency + 2(dp−1)/dp·bytes/bw.
void print_network_model(size_t bytes) {
  std::printf("union message: %zu bytes (one bit per row of %d)\n", bytes, kPaddedVocab);
  struct Link {
    const char* name;
    double latency_us, gbps;
  };
  for (const Link& l : {Link{"InfiniBand-class, 2 us, 100 Gbit/s", 2.0, 100.0},
                        Link{"Ethernet-class, 20 us, 10 Gbit/s", 20.0, 10.0}}) {
    const int dp = 64;
    const double bw = l.gbps * 1e9 / 8;
    const double rd_us = std::log2(double(dp)) * (l.latency_us + double(bytes) / bw * 1e6);
    const double ring_us =
        emulated_link_seconds(LinkOp::kAllReduce, bytes, dp, l.gbps, l.latency_us) * 1e6;
    std::printf("network model at dp %d on %s: %.1f us recursive doubling, %.1f us ring\n", dp,
                l.name, rd_us, ring_us);
  }
}

}  // namespace
}  // namespace trident

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  benchmark::Initialize(&argc, argv);
  if (!trident::validate()) {
    MPI_Finalize();
    return 1;
  }
  trident::print_network_model(((trident::kPaddedVocab + 63) / 64) * sizeof(uint64_t));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  MPI_Finalize();
  return 0;
}
