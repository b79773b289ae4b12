// Checks of the row-wise kernels against their CPU twins: encoder, layernorm, bias gradient,
// cross-entropy (see kernel_checks.h for the tolerances).
#pragma once

#include <algorithm>
#include <cmath>
#include <random>

#include "bias_grad.h"
#include "crossentropy.h"
#include "encoder.h"
#include "kernel_checks.h"
#include "layernorm.h"
#include "trident/cuda_backend.h"

namespace trident::testing {

inline Errors check_encoder_forward(int B, int T, int C, int vocab, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  const size_t N = size_t(B) * T;
  const std::vector<int32_t> tok = tokens(N, vocab, rng);
  const std::vector<float> wte = random_floats(size_t(vocab) * C, rng);
  const std::vector<float> wpe = random_floats(size_t(T) * C, rng);
  std::vector<float> want(N * C);
  cpu_twin()->encoder_forward(want.data(), tok.data(), wte.data(), wpe.data(), B, T, C);

  DeviceBuffer<float> out(N * C), d_wte(wte), d_wpe(wpe);
  DeviceBuffer<int32_t> d_tok(tok);
  cuda::encoder_forward_cuda(out.get(), d_tok.get(), d_wte.get(), d_wpe.get(), B, T, C, nullptr);
  return {{"out", err_vs(out.download(), want), kFp32Tol}};
}

// Token ids for the encoder checks, uniform over the vocabulary (a small vocabulary makes tokens
// repeat, which is what dwte's sort must handle), or `skewed` as real GPT-2 batches: one token
// (198, "\n") in half the rows, the rest log-uniform over the vocabulary (Zipf-like: a few
// tokens very frequent, most rare), the case the old O(N²) scheme was slow on.
inline std::vector<int32_t> encoder_tokens(size_t N, int vocab, bool skewed, std::mt19937& rng) {
  std::vector<int32_t> tok = tokens(N, vocab, rng);
  if (skewed) {
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (size_t i = 0; i < N; ++i)
      tok[i] = i % 2 == 0
                   ? 198 % vocab
                   : int32_t(std::min<double>(std::pow(double(vocab), u(rng)) - 1, vocab - 1));
  }
  return tok;
}

struct EncoderGrads {
  std::vector<float> dwte, dwpe;
};

// The GPU's encoder backward, accumulating into copies of dwte and dwpe (a null one when
// with_wte / with_wpe is false: it comes back unchanged).
inline EncoderGrads run_encoder_backward_cuda(const std::vector<float>& dwte,
                                              const std::vector<float>& dwpe,
                                              const std::vector<float>& dout,
                                              const std::vector<int32_t>& tok, bool with_wte,
                                              bool with_wpe, int B, int T, int C) {
  DeviceBuffer<float> d_dwte(dwte), d_dwpe(dwpe), d_dout(dout);
  DeviceBuffer<int32_t> d_tok(tok);
  DeviceBuffer<unsigned char> scratch(cuda::encoder_backward_scratch_bytes(B * T));
  cuda::encoder_backward_cuda(with_wte ? d_dwte.get() : nullptr, with_wpe ? d_dwpe.get() : nullptr,
                              scratch.get(), d_dout.get(), d_tok.get(), B, T, C, nullptr);
  return {d_dwte.download(), d_dwpe.download()};
}

inline Errors check_encoder_backward(int B, int T, int C, int vocab, bool with_wte, bool with_wpe,
                                     uint32_t seed = 1, bool skewed = false) {
  std::mt19937 rng(seed);
  const size_t N = size_t(B) * T;
  const std::vector<int32_t> tok = encoder_tokens(N, vocab, skewed, rng);
  const std::vector<float> dout = random_floats(N * C, rng);
  std::vector<float> dwte = random_floats(size_t(vocab) * C, rng);
  std::vector<float> dwpe = random_floats(size_t(T) * C, rng);
  const EncoderGrads got =
      run_encoder_backward_cuda(dwte, dwpe, dout, tok, with_wte, with_wpe, B, T, C);
  cpu_twin()->encoder_backward(with_wte ? dwte.data() : nullptr, with_wpe ? dwpe.data() : nullptr,
                               dout.data(), tok.data(), B, T, C);
  // A null gradient must stay untouched: compare it with its (unchanged) starting values.
  return {{"dwte", err_vs(got.dwte, dwte), kFp32Tol}, {"dwpe", err_vs(got.dwpe, dwpe), kFp32Tol}};
}

// with_bias false: b null, the LayerNorm of model.bias false.
inline Errors check_layernorm_forward(int N, int C, uint32_t seed = 1, bool with_bias = true) {
  std::mt19937 rng(seed);
  // A mean offset from 0, so that a one-pass variance would show its cancellation.
  const std::vector<float> inp = random_floats(size_t(N) * C, rng, -2.0, 3.0);
  const std::vector<float> w = random_floats(C, rng), b = random_floats(C, rng);
  std::vector<float> out(size_t(N) * C), mean(N), rstd(N);
  cpu_twin()->layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(),
                                with_bias ? b.data() : nullptr, N, C);

  DeviceBuffer<float> d_out(size_t(N) * C), d_mean(N), d_rstd(N), d_inp(inp), d_w(w), d_b(b);
  cuda::layernorm_forward_cuda(d_out.get(), d_mean.get(), d_rstd.get(), d_inp.get(), d_w.get(),
                               with_bias ? d_b.get() : nullptr, N, C, nullptr);
  return {{"out", err_vs(d_out.download(), out), kFp32Tol},
          {"mean", err_vs(d_mean.download(), mean), kFp32Tol},
          {"rstd", err_vs(d_rstd.download(), rstd), kFp32Tol}};
}

// Inputs of layernorm backward: mean and rstd come from the CPU forward, so both sides see the
// same saved values.
struct LayernormBackwardInputs {
  std::vector<float> dout, inp, w, mean, rstd, dw, db;
  LayernormBackwardInputs(int N, int C, uint32_t seed) {
    std::mt19937 rng(seed);
    inp = random_floats(size_t(N) * C, rng, -2.0, 3.0);
    w = random_floats(C, rng);
    const std::vector<float> b = random_floats(C, rng);
    dout = random_floats(size_t(N) * C, rng);
    dw = random_floats(C, rng);
    db = random_floats(C, rng);
    std::vector<float> out(size_t(N) * C);
    mean.resize(N);
    rstd.resize(N);
    cpu_twin()->layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(),
                                  b.data(), N, C);
  }
};

struct LayernormBackwardOutputs {
  std::vector<float> dinp, dw, db;
};

inline LayernormBackwardOutputs run_layernorm_backward_cuda(const LayernormBackwardInputs& in,
                                                            int N, int C) {
  DeviceBuffer<float> dinp(size_t(N) * C), dw(in.dw), db(in.db), dout(in.dout), inp(in.inp),
      w(in.w), mean(in.mean), rstd(in.rstd), scratch(cuda::layernorm_backward_scratch_floats(N, C));
  cuda::layernorm_backward_cuda(dinp.get(), dw.get(), db.get(), scratch.get(), dout.get(),
                                inp.get(), w.get(), mean.get(), rstd.get(), N, C, nullptr);
  return {dinp.download(), dw.download(), db.download()};
}

inline Errors check_layernorm_backward(int N, int C, uint32_t seed = 1) {
  const LayernormBackwardInputs in(N, C, seed);
  LayernormBackwardOutputs want{std::vector<float>(size_t(N) * C), in.dw, in.db};
  cpu_twin()->layernorm_backward(want.dinp.data(), want.dw.data(), want.db.data(), in.dout.data(),
                                 in.inp.data(), in.w.data(), in.mean.data(), in.rstd.data(), N, C);
  const LayernormBackwardOutputs got = run_layernorm_backward_cuda(in, N, C);
  return {{"dinp", err_vs(got.dinp, want.dinp), kFp32Tol},
          {"dw", err_vs(got.dw, want.dw), kFp32Tol},
          {"db", err_vs(got.db, want.db), kFp32Tol}};
}

inline Errors check_bias_backward(int N, int OC, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  const std::vector<float> dout = random_floats(size_t(N) * OC, rng);
  std::vector<float> dbias = random_floats(OC, rng);
  DeviceBuffer<float> d_dbias(dbias), d_dout(dout),
      scratch(cuda::bias_backward_scratch_floats(N, OC));
  // The CPU twin is matmul_backward's dbias part (dinp and dw skipped, so inp, w, C unused).
  cpu_twin()->matmul_backward(nullptr, nullptr, dbias.data(), dout.data(), nullptr, nullptr, N, 1,
                              OC);
  cuda::bias_backward_cuda(d_dbias.get(), scratch.get(), d_dout.get(), N, OC, nullptr);
  return {{"dbias", err_vs(d_dbias.download(), dbias), kFp32Tol}};
}

// Logits in [-4, 4]; the padded columns hold random values too, which must not matter.
inline Errors check_crossentropy_forward(int N, int V, int Vp, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  std::vector<float> probs = random_floats(size_t(N) * Vp, rng, -4.0, 4.0);
  const std::vector<int32_t> targets = tokens(N, V, rng);
  DeviceBuffer<float> d_probs(probs), d_losses(N);
  DeviceBuffer<int32_t> d_targets(targets);
  std::vector<float> losses(N);
  cpu_twin()->crossentropy_forward(losses.data(), probs.data(), targets.data(), N, V, Vp);
  cuda::crossentropy_forward_cuda(d_losses.get(), d_probs.get(), d_targets.get(), N, V, Vp,
                                  nullptr);
  return {{"probs", err_vs(d_probs.download(), probs), kFp32Tol},
          {"losses", err_vs(d_losses.download(), losses), kFp32Tol}};
}

inline Errors check_crossentropy_backward(int N, int V, int Vp, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  std::vector<float> probs = random_floats(size_t(N) * Vp, rng, -4.0, 4.0);
  const std::vector<int32_t> targets = tokens(N, V, rng);
  std::vector<float> losses(N);
  const std::unique_ptr<Backend> cpu = cpu_twin();
  cpu->crossentropy_forward(losses.data(), probs.data(), targets.data(), N, V, Vp);
  const float dloss = 0.37f;
  // The device copy's padded columns hold NaN, so they fail unless the kernel writes its zeros.
  std::vector<float> device_probs = probs;
  for (int n = 0; n < N; ++n)
    for (int v = V; v < Vp; ++v) device_probs[size_t(n) * Vp + v] = nans(1)[0];
  DeviceBuffer<float> d_probs(device_probs);
  DeviceBuffer<int32_t> d_targets(targets);
  cpu->crossentropy_backward(probs.data(), targets.data(), dloss, N, V, Vp);
  cuda::crossentropy_backward_cuda(d_probs.get(), d_targets.get(), dloss, N, V, Vp, nullptr);
  return {{"dlogits", err_vs(d_probs.download(), probs), kFp32Tol}};
}

// The CUDA backend's linear layer (cuBLASLt, bf16 inputs, fp32 accumulation) against the CPU
// twin: out = inp·wᵀ + bias; dinp = dout·w (assign); dw += doutᵀ·inp; dbias += Σ dout. The
// outputs start poisoned, the accumulated gradients from random values.
inline Errors check_matmul(Backend& gpu, int N, int C, int OC, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  const std::vector<float> inp = random_floats(size_t(N) * C, rng);
  const std::vector<float> w = random_floats(size_t(OC) * C, rng);
  const std::vector<float> bias = random_floats(OC, rng);
  const std::vector<float> dout = random_floats(size_t(N) * OC, rng);
  std::vector<float> dw = random_floats(size_t(OC) * C, rng), dbias = random_floats(OC, rng);
  DeviceBuffer<float> d_inp(inp), d_w(w), d_bias(bias), d_dout(dout), d_dw(dw), d_dbias(dbias),
      d_out(size_t(N) * OC), d_dinp(size_t(N) * C);
  std::vector<float> out(size_t(N) * OC), dinp(size_t(N) * C);
  const std::unique_ptr<Backend> cpu = cpu_twin();
  cpu->matmul_forward(out.data(), inp.data(), w.data(), bias.data(), N, C, OC);
  cpu->matmul_backward(dinp.data(), dw.data(), dbias.data(), dout.data(), inp.data(), w.data(), N,
                       C, OC);
  gpu.matmul_forward(d_out.get(), d_inp.get(), d_w.get(), d_bias.get(), N, C, OC);
  gpu.matmul_backward(d_dinp.get(), d_dw.get(), d_dbias.get(), d_dout.get(), d_inp.get(), d_w.get(),
                      N, C, OC);
  gpu.synchronize();
  return {{"out", err_vs(d_out.download(), out), kBf16Tol},
          {"dinp", err_vs(d_dinp.download(), dinp), kBf16Tol},
          {"dw", err_vs(d_dw.download(), dw), kBf16Tol},
          {"dbias", err_vs(d_dbias.download(), dbias), kFp32Tol}};
}

}  // namespace trident::testing
