// Microbenchmarks of the flat-buffer kernels (GELU, add, bf16 casts, AdamW, Σx²) at
// GPT-2-124M sizes: B=8, T=1024 (N = 8192 rows), C = 768, 124M parameters. Each validates
// against its CPU twin on a small input first (kernel_checks_flat.h), then reports GB/s of the
// minimal traffic (bytes every implementation must read + write) against the copy ceiling.
#include <benchmark/benchmark.h>

#include "bench_util.h"
#include "kernel_checks_flat.h"

namespace trident::bench {
namespace {

using testing::DeviceBuffer;

constexpr size_t kRows = 8192, kChannels = 768;
constexpr size_t kMlp = kRows * 4 * kChannels;  // the MLP's hidden activation
constexpr size_t kParams = 124439808;           // GPT-2 124M

void BM_gelu_forward(benchmark::State& state) {
  if (!require_gpu(state) || !validate(state, testing::check_gelu_forward(4099, 0))) return;
  DeviceBuffer<float> inp(kMlp), out(kMlp);
  inp.zero();
  Stream stream;
  // read inp, write out
  time_loop(state, 8.0 * kMlp, stream,
            [&] { cuda::gelu_forward_cuda(out.get(), inp.get(), kMlp, stream.s); });
}

void BM_gelu_backward(benchmark::State& state) {
  if (!require_gpu(state) || !validate(state, testing::check_gelu_backward(4099, 0))) return;
  DeviceBuffer<float> inp(kMlp), dout(kMlp), dinp(kMlp);
  inp.zero();
  dout.zero();
  Stream stream;
  // read inp, dout; write dinp
  time_loop(state, 12.0 * kMlp, stream,
            [&] { cuda::gelu_backward_cuda(dinp.get(), inp.get(), dout.get(), kMlp, stream.s); });
}

void BM_add(benchmark::State& state) {
  if (!require_gpu(state) || !validate(state, testing::check_add(4099, 0, 1))) return;
  const size_t n = kRows * kChannels;  // the residual stream
  DeviceBuffer<float> a(n), b(n);
  a.zero();
  b.zero();
  Stream stream;
  // read a, b; write out (= a)
  time_loop(state, 12.0 * n, stream,
            [&] { cuda::add_cuda(a.get(), a.get(), b.get(), n, stream.s); });
}

void BM_cast_f32_to_bf16(benchmark::State& state) {
  if (!require_gpu(state) || !validate(state, testing::check_cast_f32_to_bf16(4099, 0))) return;
  DeviceBuffer<float> in(kParams);
  DeviceBuffer<cuda::bf16> out(kParams);
  in.zero();
  Stream stream;
  // read 4 bytes, write 2 bytes per value
  time_loop(state, 6.0 * kParams, stream,
            [&] { cuda::cast_f32_to_bf16_cuda(out.get(), in.get(), kParams, stream.s); });
}

void BM_cast_bf16_to_f32(benchmark::State& state) {
  if (!require_gpu(state) || !validate(state, testing::check_cast_bf16_to_f32(4099, 0, 0.5f)))
    return;
  DeviceBuffer<cuda::bf16> in(kParams);
  DeviceBuffer<float> out(kParams);
  in.zero();
  Stream stream;
  // read 2 bytes, write 4 bytes per value
  time_loop(state, 6.0 * kParams, stream,
            [&] { cuda::cast_bf16_to_f32_cuda(out.get(), in.get(), 0.5f, kParams, stream.s); });
}

void BM_adamw_update(benchmark::State& state) {
  if (!require_gpu(state) || !validate(state, testing::check_adamw(4099, 0, true))) return;
  DeviceBuffer<float> p(kParams), m(kParams), v(kParams), g(kParams);
  DeviceBuffer<cuda::bf16> p16(kParams);
  for (auto* buf : {&p, &m, &v, &g}) buf->zero();
  Stream stream;
  // read p, m, v, g (16 B); write p, m, v (12 B) and the bf16 copy (2 B)
  time_loop(state, 30.0 * kParams, stream, [&] {
    cuda::adamw_update_cuda(p.get(), m.get(), v.get(), g.get(), kParams, 1e-4f, 0.9f, 0.95f, 1e-8f,
                            0.1f, 10, 1.0f, p16.get(), stream.s);
  });
}

void BM_sum_squares(benchmark::State& state) {
  if (!require_gpu(state) || !validate(state, testing::check_sum_squares(1000003, 0))) return;
  DeviceBuffer<float> x(kParams);
  DeviceBuffer<double> result(1), scratch(cuda::sum_squares_scratch_doubles());
  x.zero();
  Stream stream;
  // read x (the partial sums are negligible)
  time_loop(state, 4.0 * kParams, stream, [&] {
    cuda::sum_squares_cuda(result.get(), scratch.get(), x.get(), kParams, stream.s);
  });
}

#define TRIDENT_BENCH(fn) \
  BENCHMARK(fn)->UseManualTime()->Iterations(3)->Unit(benchmark::kMillisecond)
TRIDENT_BENCH(BM_gelu_forward);
TRIDENT_BENCH(BM_gelu_backward);
TRIDENT_BENCH(BM_add);
TRIDENT_BENCH(BM_cast_f32_to_bf16);
TRIDENT_BENCH(BM_cast_bf16_to_f32);
TRIDENT_BENCH(BM_adamw_update);
TRIDENT_BENCH(BM_sum_squares);
#undef TRIDENT_BENCH

}  // namespace
}  // namespace trident::bench
