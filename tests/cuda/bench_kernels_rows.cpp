// Microbenchmarks of the row-wise kernels (encoder, layernorm, bias gradient, cross-entropy) at
// GPT-2-124M sizes: B=8, T=1024 (N = 8192 rows), C = 768, Vp = 50304 (V = 50257). Each validates
// against its CPU twin on a small input first (kernel_checks_rows.h), then reports GB/s of the
// minimal traffic (bytes every implementation must read + write) against the copy ceiling.
#include <benchmark/benchmark.h>

#include <set>

#include "bench_util.h"
#include "kernel_checks_rows.h"

namespace trident::bench {
namespace {

using testing::DeviceBuffer;

constexpr int kB = 8, kT = 1024, kC = 768, kV = 50257, kVp = 50304;
constexpr size_t kN = size_t(kB) * kT;

// Uniformly random tokens: fewer repeats than real text, whose frequent tokens make
// encoder_backward's owning blocks longer (Note [Deterministic dwte] in kernels/encoder.cu).
std::vector<int32_t> random_tokens(size_t n, int vocab) {
  std::mt19937 rng(7);
  return testing::tokens(n, vocab, rng);
}

void BM_encoder_forward(benchmark::State& state) {
  if (!require_gpu(state) || !validate(state, testing::check_encoder_forward(3, 37, 96, 50)))
    return;
  DeviceBuffer<float> out(kN * kC), wte(size_t(kVp) * kC), wpe(size_t(kT) * kC);
  DeviceBuffer<int32_t> tokens(random_tokens(kN, kV));
  wte.zero();
  wpe.zero();
  Stream stream;
  // read N token ids, N rows of wte, T rows of wpe (reused across b); write N rows
  const double bytes = 4.0 * (2.0 * kN * kC + double(kT) * kC + kN);
  time_loop(state, bytes, stream, [&] {
    cuda::encoder_forward_cuda(out.get(), tokens.get(), wte.get(), wpe.get(), kB, kT, kC, stream.s);
  });
}

void BM_encoder_backward(benchmark::State& state) {
  if (!require_gpu(state) ||
      !validate(state, testing::check_encoder_backward(3, 37, 96, 7, true, true)))
    return;
  const std::vector<int32_t> host_tokens = random_tokens(kN, kV);
  const double distinct = double(std::set<int32_t>(host_tokens.begin(), host_tokens.end()).size());
  DeviceBuffer<float> dout(kN * kC), dwte(size_t(kVp) * kC), dwpe(size_t(kT) * kC);
  DeviceBuffer<int32_t> tokens(host_tokens);
  dout.zero();
  dwte.zero();
  dwpe.zero();
  DeviceBuffer<unsigned char> scratch(cuda::encoder_backward_scratch_bytes(kN));
  Stream stream;
  // read dout and the token ids; read + write the distinct dwte rows and all of dwpe
  const double bytes = 4.0 * (double(kN) * kC + kN + 2.0 * distinct * kC + 2.0 * kT * kC);
  time_loop(state, bytes, stream, [&] {
    cuda::encoder_backward_cuda(dwte.get(), dwpe.get(), scratch.get(), dout.get(), tokens.get(), kB,
                                kT, kC, stream.s);
  });
}

void BM_layernorm_forward(benchmark::State& state) {
  if (!require_gpu(state) || !validate(state, testing::check_layernorm_forward(37, 1600))) return;
  DeviceBuffer<float> out(kN * kC), mean(kN), rstd(kN), inp(kN * kC), w(kC), b(kC);
  for (auto* buf : {&inp, &w, &b}) buf->zero();
  Stream stream;
  // read inp, w, b; write out, mean, rstd
  const double bytes = 4.0 * (2.0 * kN * kC + 2.0 * kC + 2.0 * kN);
  time_loop(state, bytes, stream, [&] {
    cuda::layernorm_forward_cuda(out.get(), mean.get(), rstd.get(), inp.get(), w.get(), b.get(),
                                 int(kN), kC, stream.s);
  });
}

void BM_layernorm_backward(benchmark::State& state) {
  if (!require_gpu(state) || !validate(state, testing::check_layernorm_backward(37, 1600))) return;
  DeviceBuffer<float> dinp(kN * kC), dw(kC), db(kC), dout(kN * kC), inp(kN * kC), w(kC), mean(kN),
      rstd(kN), scratch(cuda::layernorm_backward_scratch_floats(int(kN), kC));
  for (auto* buf : {&dw, &db, &dout, &inp, &w, &mean, &rstd}) buf->zero();
  Stream stream;
  // read dout, inp, w, mean, rstd; write dinp; read + write dw, db
  const double bytes = 4.0 * (3.0 * kN * kC + 5.0 * kC + 2.0 * kN);
  time_loop(state, bytes, stream, [&] {
    cuda::layernorm_backward_cuda(dinp.get(), dw.get(), db.get(), scratch.get(), dout.get(),
                                  inp.get(), w.get(), mean.get(), rstd.get(), int(kN), kC,
                                  stream.s);
  });
}

void BM_bias_backward(benchmark::State& state) {
  if (!require_gpu(state) || !validate(state, testing::check_bias_backward(37, 1600))) return;
  const int OC = 4 * kC;  // the MLP's first linear layer
  DeviceBuffer<float> dbias(OC), dout(kN * OC),
      scratch(cuda::bias_backward_scratch_floats(int(kN), OC));
  dbias.zero();
  dout.zero();
  Stream stream;
  // read dout; read + write dbias
  const double bytes = 4.0 * (double(kN) * OC + 2.0 * OC);
  time_loop(state, bytes, stream, [&] {
    cuda::bias_backward_cuda(dbias.get(), scratch.get(), dout.get(), int(kN), OC, stream.s);
  });
}

void BM_crossentropy_forward(benchmark::State& state) {
  if (!require_gpu(state) || !validate(state, testing::check_crossentropy_forward(37, 250, 384)))
    return;
  DeviceBuffer<float> logits(kN * kVp), losses(kN);
  DeviceBuffer<int32_t> targets(random_tokens(kN, kV));
  logits.zero();
  Stream stream;
  // read the V real logits and the targets; write all Vp columns and the losses
  const double bytes = 4.0 * (double(kN) * kV + double(kN) * kVp + 2.0 * kN);
  time_loop(state, bytes, stream, [&] {
    cuda::crossentropy_forward_cuda(losses.get(), logits.get(), targets.get(), int(kN), kV, kVp,
                                    stream.s);
  });
}

void BM_crossentropy_backward(benchmark::State& state) {
  if (!require_gpu(state) || !validate(state, testing::check_crossentropy_backward(37, 250, 384)))
    return;
  DeviceBuffer<float> probs(kN * kVp);
  DeviceBuffer<int32_t> targets(random_tokens(kN, kV));
  probs.zero();
  Stream stream;
  // read the V real probabilities and the targets; write all Vp columns
  const double bytes = 4.0 * (double(kN) * kV + double(kN) * kVp + kN);
  time_loop(state, bytes, stream, [&] {
    cuda::crossentropy_backward_cuda(probs.get(), targets.get(), 1.0f / kN, int(kN), kV, kVp,
                                     stream.s);
  });
}

#define TRIDENT_BENCH(fn) \
  BENCHMARK(fn)->UseManualTime()->Iterations(3)->Unit(benchmark::kMillisecond)
TRIDENT_BENCH(BM_encoder_forward);
TRIDENT_BENCH(BM_encoder_backward);
TRIDENT_BENCH(BM_layernorm_forward);
TRIDENT_BENCH(BM_layernorm_backward);
TRIDENT_BENCH(BM_bias_backward);
TRIDENT_BENCH(BM_crossentropy_forward);
TRIDENT_BENCH(BM_crossentropy_backward);
#undef TRIDENT_BENCH

}  // namespace
}  // namespace trident::bench
