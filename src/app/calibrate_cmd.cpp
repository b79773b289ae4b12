// `trident plan --calibrate`: measures this machine (src/bench/calibrate.h, Note [Calibration])
// and writes its hardware description (kind: cpu, dtype: fp32; Note [Hardware files] in
// src/plan/hardware.cpp) into the user's hardware directory (Note [User hardware files]) or
// --out. Only rank 0 writes the file.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "app/commands.h"
#include "app/run_setup.h"
#include "bench/calibrate.h"
#include "trident/backend.h"
#include "trident/blas_core.h"
#include "trident/check.h"
#include "trident/comm.h"
#include "trident/peak_check.h"
#include "trident/plan.h"

namespace trident {
namespace {

template <typename... Args>
void progress(bool lead, fmt::format_string<Args...> f, Args&&... args) {
  if (!lead) return;
  std::fputs(("calibrate: " + fmt::format(f, std::forward<Args>(args)...) + "\n").c_str(), stdout);
  std::fflush(stdout);
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  return "unknown CPU";
}

double mem_total_gb() {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("MemTotal:", 0) == 0) return std::stod(line.substr(9)) * 1024 / 1e9;
  input_error("/proc/meminfo: no MemTotal line");
}

// The 1-minute load average: other work on the cores lowers every figure, so the file says it.
std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one;
  return in >> one ? one : "unknown";
}

std::string today() {
  const std::time_t now = std::time(nullptr);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d", std::localtime(&now));
  return text;
}

// --out, else the user's hardware directory (Note [User hardware files]): never the source
// tree's tracked inputs/hardware/.
std::string output_path(const CalibrateArgs& args, const std::string& name) {
  if (!args.out.empty()) return args.out;
  const std::string dir = user_hardware_dir();
  if (dir.empty())
    input_error("trident plan --calibrate: neither TRIDENT_HARDWARE_DIR nor HOME is set; name "
                "the file with --out");
  return (std::filesystem::path(dir) / (name + ".yaml")).string();
}

}  // namespace

int run_calibrate(const CalibrateArgs& args, const BlasCoreCheck& blas) {
  using namespace calibration;
  MPI_Comm world = MPI_COMM_WORLD;
  int rank = 0, size = 1;
  TRIDENT_MPI(MPI_Comm_rank(world, &rank));
  TRIDENT_MPI(MPI_Comm_size(world, &size));
  const bool lead = rank == 0;
  const std::string name = args.name.empty() ? "this-machine" : args.name;
  std::string path;
  const int cores = int(sysconf(_SC_NPROCESSORS_ONLN));
  const int threads = args.threads > 0 ? args.threads : cores;
  setup_step([&] {
    if (name.find('/') != std::string::npos)
      input_error("--name {}: a description's name cannot contain '/'", name);
    path = output_path(args, name);
    const auto dir = std::filesystem::absolute(path).parent_path();
    if (!lead) return;
    std::error_code ec;
    if (args.out.empty() && !std::filesystem::create_directories(dir, ec) && ec)
      input_error("trident plan --calibrate: cannot create {}: {} (set TRIDENT_HARDWARE_DIR or "
                  "pass --out)",
                  dir.string(), ec.message());
    if (!std::filesystem::is_directory(dir))
      input_error("--out {}: directory {} does not exist", path, dir.string());
  });

  const std::string load = load_average();
  // mpirun's binding of this rank: the overlap figure is measured inside it, as a training
  // rank's compute and communication threads run.
  const int bound = allowed_cores();
  progress(lead,
           "{}, {} cores online, {} rank(s), {} thread(s) for memory; OpenBLAS core {}; "
           "load average {} before measuring",
           cpu_model(), cores, size, threads, blas.chosen.empty() ? "unknown" : blas.chosen, load);
  Hardware hw;
  hw.name = name;
  hw.kind = "cpu";
  hw.dtype = "fp32";
  hw.devices_per_node = cores;
  hw.memory_gb = round_sig(mem_total_gb());

  std::unique_ptr<Backend> single = make_cpu_backend(1);
  if (lead) {
    validate_matmul(*single);
    measure_compute(*single, cores, hw, [&](int round, const ComputeRound& r) {
      progress(lead,
               "round {}/{}: linear layers {:.1f} .. {:.1f} GFLOP/s (d = 32 .. 1024), "
               "elementwise {:.2f} GB/s, AdamW {:.2f} GB/s, small GPT {:.1f} ms on 1 thread, "
               "{:.1f} ms on {}",
               round + 1, kComputeRounds, r.gemm.front().tflops * 1e3, r.gemm.back().tflops * 1e3,
               r.elementwise_gbytes_per_s, r.optimizer_gbytes_per_s, 1e3 * r.small_gpt_s,
               1e3 * r.small_gpt_all_threads_s, cores);
    });
    for (const GemmPoint& p : hw.gemm)
      progress(lead,
               "linear layer [{}, {}] -> {}, forward and backward, 1 thread: {:.1f} "
               "GFLOP/s (median of {} rounds)",
               p.min_dim, 2 * p.min_dim, 8 * p.min_dim, p.tflops * 1e3, kComputeRounds);
    progress(lead,
             "medians: elementwise {:.2f} GB/s, AdamW {:.2f} GB/s at 32 B per parameter, "
             "compute_efficiency {:.2f}, thread_scaling {:.2f}",
             hw.elementwise_gbytes_per_s, hw.optimizer_gbytes_per_s, hw.compute_efficiency,
             hw.thread_scaling);
    const size_t n = size_t(8) << 20;  // 64 MiB of doubles per array
    {
      AllCoresWhileAlive widen(cores);
      hw.memory_gbytes_per_s = round_sig(measure_triad(threads, n));
    }
    progress(lead, "memory triad, {} threads, 3 x 64 MiB: {:.2f} GB/s (best of 10)", threads,
             hw.memory_gbytes_per_s);
  }
  quiet_barrier(world);

  std::vector<std::string> notes;
  std::unique_ptr<MpiComm> comm;
  if (size >= 2) {
    comm = MpiComm::duplicate(world, "calibrate");
    hw.intra_node = measure_link(*comm, world, size_t(64) << 20, 5);
    progress(lead,
             "link: MpiComm ring all-reduce, {} ranks: busbw {:.3f} GB/s, latency {:.1f} us "
             "per hop",
             size, hw.intra_node.gbytes_per_s, hw.intra_node.latency_us);
    notes.push_back(fmt::format(
        "intra_node: MpiComm ring all-reduce (MPI_Iallreduce, libnbc ring) over {} ranks on this "
        "node; busbw from 64 MiB with the latency taken out; latency = one-float all-reduce / "
        "2(n-1); slowest rank, best of 5",
        size));
  } else {
    const double copy = measure_copy(size_t(64) << 20);
    hw.intra_node = {round_sig(copy / 2), 1.0};
    progress(lead,
             "link: one rank, no peer: intra_node estimated as half of one thread's "
             "memcpy ({:.2f} GB/s), latency assumed 1 us; run under mpirun -n 2 to measure it",
             copy);
    notes.push_back("intra_node: NOT measured (one rank): half of one thread's memcpy rate "
                    "(a shared-memory transport copies each byte twice), latency 1 us assumed; "
                    "calibrate under mpirun -n 2 to measure it");
  }

  if (size >= 2 && args.emulate_gbps > 0) {
    auto emulated = MpiComm::duplicate(world, "calibrate-emulated");
    emulated->set_emulated_link(args.emulate_gbps, args.emulate_latency_us);
    // About 50 ms of wire time per operation: long enough to time, short enough to repeat.
    const double bytes = args.emulate_gbps * 1e9 / 8 * 0.05 * size / (2.0 * (size - 1));
    const size_t large = std::clamp<size_t>(size_t(bytes) / 4096 * 4096, 1u << 20, 64u << 20);
    hw.inter_node = measure_link(*emulated, world, large, 3);
    progress(lead,
             "emulated link ({} Gbit/s, {} us): busbw {:.4f} GB/s, latency {:.1f} us per "
             "hop",
             args.emulate_gbps, args.emulate_latency_us, hw.inter_node.gbytes_per_s,
             hw.inter_node.latency_us);
    notes.push_back(fmt::format(
        "inter_node: the same all-reduce through MpiComm's emulated link (--emulate-gbps {} "
        "--emulate-latency-us {}), {} MiB",
        args.emulate_gbps, args.emulate_latency_us, large >> 20));
  } else {
    hw.inter_node = hw.intra_node;
    notes.push_back(size >= 2 && args.emulate_gbps <= 0
                        ? "inter_node: a copy of intra_node (one node, no --emulate-gbps)"
                        : "inter_node: a copy of intra_node (one rank: no link to emulate)");
  }

  const OverlapRates overlap = measure_overlap(*single, comm.get(), world);
  hw.overlap_slowdown = round_sig(overlap.slowdown());
  progress(lead,
           "overlap: gemm 512x512x512, 1 thread: {:.1f} GFLOP/s alone, {:.1f} GFLOP/s with "
           "{}: slowdown {:.3f}",
           overlap.alone / 1e9, overlap.with_comm / 1e9,
           comm ? "this rank's communication thread running all-reduces"
                : "a thread copying 16 MiB buffers (one rank)",
           hw.overlap_slowdown);
  notes.push_back(fmt::format("thread_scaling: the small GPT's forward + backward on {} threads "
                              "in one process against ({} x) its 1-thread time, medians (a "
                              "large GEMM alone scaled 0.7-0.9; whole steps scale less)",
                              cores, cores));
  if (size >= 2) {
    const double alone = overlap.alone > 0 ? overlap.alone : 1;  // rank 0's is the one written
    hw.core_scaling = round_sig(measure_core_scaling(*single, world, size, alone));
    progress(lead,
             "cores: {} ranks computing 512x512x512 GEMMs at once get {:.2f} of one "
             "alone each",
             size, hw.core_scaling);
    notes.push_back(fmt::format(
        "core_scaling: the mean single-thread 512^3 GEMM rate of {} ranks computing at once / "
        "rank 0's rate alone, best of 2 windows of 0.4 s",
        size));
  } else {
    notes.push_back("core_scaling: NOT measured (one rank): 1 assumed; calibrate under mpirun "
                    "-n <cores> to measure it");
  }
  notes.push_back(fmt::format(
      "overlap_slowdown: 1 - (single-thread 512^3 GEMM rate while {}) / (rate alone), best of 2 "
      "windows of 0.4 s each, inside rank 0's binding ({} core(s) allowed), as a training rank "
      "runs",
      comm ? "rank 0's communication thread runs 16 MiB all-reduces"
           : "a thread copies 16 MiB buffers (one rank, no peer)",
      bound));

  setup_step([&] {
    if (!lead) return;
    const CpuPeakBounds bounds = cpu_gemm_peak_bounds(blas.fp32_lanes, 1, cores, 1);
    const PeakVerdict verdict = judge_peak(hw.peak_tflops * 1e12, bounds);
    if (verdict == PeakVerdict::kImpossible)
      throw Error(peak_problem_message(hw.peak_tflops * 1e12, bounds, verdict,
                                       isa_name(blas.cpu_isa), blas.chosen),
                  ExitCode::kInternal);
    hw.sources.push_back(fmt::format("measured by trident plan --calibrate on {}, {}, {} thread(s) "
                                     "for memory, {} rank(s), OpenBLAS core {}, load average {} "
                                     "before measuring (other work lowers every figure)",
                                     today(), cpu_model(), threads, size, blas.chosen, load));
    hw.sources.push_back("gemm: a linear layer [4d, d] -> 4d, forward and backward "
                         "(CpuBackend::matmul_forward, matmul_backward), 1 thread, runs of >= 20 "
                         "ms, median run; peak_tflops = best point");
    hw.sources.push_back("compute_efficiency: the per-op terms' forward + backward of a small "
                         "GPT (4 layers, d_model 512, 8 heads, vocabulary 8192, 4 x 128 tokens) / "
                         "its time through trident's GPT on 1 thread, median of 5");
    hw.sources.push_back("optimizer_gbytes_per_s: CpuBackend adamw_update over 16 Mi parameters, "
                         "1 thread, 32 B per parameter, median of 5");
    hw.sources.push_back("elementwise_gbytes_per_s: CpuBackend layernorm_forward, gelu_forward, "
                         "gelu_backward over [1024, 768] and [1024, 3072], 1 thread, median of 7");
    hw.sources.push_back(fmt::format("memory_gbytes_per_s: STREAM triad, {} threads, 3 x 64 MiB "
                                     "double arrays, 24 bytes per element, best of 10",
                                     threads));
    hw.sources.push_back("memory_gb: /proc/meminfo MemTotal");
    for (const std::string& note : notes) hw.sources.push_back(note);
    hw.sources.push_back("attention_tflops: 0 (the CPU backend's attention runs as loops over "
                         "memory, not a fused kernel)");
    if (verdict == PeakVerdict::kImplausiblyLow) {
      const std::string why = peak_problem_message(hw.peak_tflops * 1e12, bounds, verdict,
                                                   isa_name(blas.cpu_isa), blas.chosen);
      progress(lead, "warning: {}", why);
      hw.sources.push_back("warning: " + why);
    }
    const std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp);
      out << hardware_to_yaml(hw);
      if (!out.flush()) input_error("--out {}: cannot write {}", path, tmp);
    }
    std::filesystem::rename(tmp, path);
    load_hardware(path);  // reads back: the file is valid
    progress(lead, "wrote {}", path);
    if (args.out.empty()) {  // found by name from now on; say when it hides a shipped one
      const std::string shipped = find_in_tree("inputs/hardware/" + name + ".yaml");
      progress(lead, "`trident plan --hardware {}` reads it{}", name,
               shipped.empty() ? "" : fmt::format(" (it shadows the shipped {})", shipped));
    }
  });
  return 0;
}

}  // namespace trident
