// Microbenchmarks of the model families' kernels (RMSNorm, RoPE, SwiGLU, exact GELU) at the
// Llama-1B deck's sizes (inputs/llama-1b.yaml): B=4, T=2048 (N = 8192 rows), C = 2048, 32 query
// heads and 8 kv heads of 64, SwiGLU width F = 8192. Each validates against its CPU twin on a
// small input first (kernel_checks_families.h), then reports GB/s of the minimal traffic (bytes
// every implementation must read + write) against the copy ceiling.
#include <benchmark/benchmark.h>

#include "bench_util.h"
#include "kernel_checks_families.h"

namespace trident::bench {
namespace {

using testing::DeviceBuffer;

constexpr int kB = 4, kT = 2048, kC = 2048, kNH = 32, kKVH = 8, kHS = 64, kF = 8192;
constexpr size_t kN = size_t(kB) * kT;

void BM_rmsnorm_forward(benchmark::State& state) {
  if (!require_gpu(state) || !validate(state, testing::check_rmsnorm_forward(37, 1600, 1e-5f)))
    return;
  DeviceBuffer<float> out(kN * kC), rstd(kN), inp(kN * kC), w(kC);
  inp.zero();
  w.zero();
  Stream stream;
  // read inp, w; write out, rstd
  const double bytes = 4.0 * (2.0 * kN * kC + kC + kN);
  time_loop(state, bytes, stream, [&] {
    cuda::rmsnorm_forward_cuda(out.get(), rstd.get(), inp.get(), w.get(), int(kN), kC, 1e-5f,
                               stream.s);
  });
}

void BM_rmsnorm_backward(benchmark::State& state) {
  if (!require_gpu(state) || !validate(state, testing::check_rmsnorm_backward(37, 1600))) return;
  DeviceBuffer<float> dinp(kN * kC), dw(kC), dout(kN * kC), inp(kN * kC), w(kC), rstd(kN),
      scratch(cuda::rmsnorm_backward_scratch_floats(int(kN), kC));
  for (auto* buf : {&dw, &dout, &inp, &w, &rstd}) buf->zero();
  Stream stream;
  // read dout, inp, w, rstd; write dinp; read + write dw
  const double bytes = 4.0 * (3.0 * kN * kC + 3.0 * kC + kN);
  time_loop(state, bytes, stream, [&] {
    cuda::rmsnorm_backward_cuda(dinp.get(), dw.get(), scratch.get(), dout.get(), inp.get(), w.get(),
                                rstd.get(), int(kN), kC, stream.s);
  });
}

// Full rotary (Llama): every q and k value is read and written once; v is not touched.
void BM_rope_forward(benchmark::State& state) {
  if (!require_gpu(state) || !validate(state, testing::check_rope(false, 2, 17, 4, 2, 64, 64)))
    return;
  DeviceBuffer<float> qkv(kN * (kNH + 2 * kKVH) * kHS), cos(size_t(kT) * kHS / 2),
      sin(size_t(kT) * kHS / 2);
  for (auto* buf : {&qkv, &cos, &sin}) buf->zero();
  Stream stream;
  // read + write the q and k heads; read the tables (once per position)
  const double bytes = 4.0 * (2.0 * kN * (kNH + kKVH) * kHS + double(kT) * kHS);
  time_loop(state, bytes, stream, [&] {
    cuda::rope_forward_cuda(qkv.get(), cos.get(), sin.get(), int(kN), kT, kNH, kKVH, kHS, kHS,
                            stream.s);
  });
}

void BM_swiglu_forward(benchmark::State& state) {
  if (!require_gpu(state) || !validate(state, testing::check_swiglu(false, 7, 37, 8.0))) return;
  DeviceBuffer<float> out(kN * kF), inp(kN * 2 * kF);
  inp.zero();
  Stream stream;
  // read gate | up; write out
  const double bytes = 4.0 * 3.0 * kN * kF;
  time_loop(state, bytes, stream,
            [&] { cuda::swiglu_forward_cuda(out.get(), inp.get(), int(kN), kF, stream.s); });
}

void BM_swiglu_backward(benchmark::State& state) {
  if (!require_gpu(state) || !validate(state, testing::check_swiglu(true, 7, 37, 8.0))) return;
  DeviceBuffer<float> dinp(kN * 2 * kF), inp(kN * 2 * kF), dout(kN * kF);
  inp.zero();
  dout.zero();
  Stream stream;
  // read gate | up and dout; write d gate | d up
  const double bytes = 4.0 * 5.0 * kN * kF;
  time_loop(state, bytes, stream, [&] {
    cuda::swiglu_backward_cuda(dinp.get(), inp.get(), dout.get(), int(kN), kF, stream.s);
  });
}

// NeoX's MLP activation at this width: 4·C values per row.
void BM_gelu_erf_backward(benchmark::State& state) {
  if (!require_gpu(state) || !validate(state, testing::check_gelu_erf(true, 1001, 0))) return;
  const size_t n = kN * 4 * kC;
  DeviceBuffer<float> dinp(n), inp(n), dout(n);
  inp.zero();
  dout.zero();
  Stream stream;
  // read inp, dout; write dinp
  const double bytes = 4.0 * 3.0 * double(n);
  time_loop(state, bytes, stream,
            [&] { cuda::gelu_erf_backward_cuda(dinp.get(), inp.get(), dout.get(), n, stream.s); });
}

#define TRIDENT_BENCH(fn) \
  BENCHMARK(fn)->UseManualTime()->Iterations(3)->Unit(benchmark::kMillisecond)
TRIDENT_BENCH(BM_rmsnorm_forward);
TRIDENT_BENCH(BM_rmsnorm_backward);
TRIDENT_BENCH(BM_rope_forward);
TRIDENT_BENCH(BM_swiglu_forward);
TRIDENT_BENCH(BM_swiglu_backward);
TRIDENT_BENCH(BM_gelu_erf_backward);
#undef TRIDENT_BENCH

}  // namespace
}  // namespace trident::bench
