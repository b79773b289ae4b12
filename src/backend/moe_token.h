// One token's routing and its router gradient (Note [Mixture ops] in src/backend/moe_ops.cpp),
// written once for the CPU backend's loop over tokens and the GPU kernel's thread per token
// (kernels/moe.cu): the same expressions on both, so the twin tests compare like with like.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define TRIDENT_HOST_DEVICE __host__ __device__
#else
#define TRIDENT_HOST_DEVICE
#endif

namespace trident::moe_token {

// probs[E], lse, top[k], topw[k] of the token whose logits are l[E] (Backend::moe_route_forward).
TRIDENT_HOST_DEVICE inline void route(float* p, float* lse, int32_t* top, float* topw,
                                      const float* l, const float* bias, int E, int k, bool sigmoid,
                                      bool norm_topk) {
  if (sigmoid) {
    for (int i = 0; i < E; ++i) p[i] = 1.0f / (1.0f + ::expf(-l[i]));
    *lse = 0.0f;
  } else {
    float mx = l[0];
    for (int i = 1; i < E; ++i) mx = l[i] > mx ? l[i] : mx;
    double sum = 0;
    for (int i = 0; i < E; ++i) sum += ::exp(double(l[i] - mx));
    for (int i = 0; i < E; ++i) p[i] = float(::exp(double(l[i] - mx)) / sum);
    *lse = float(double(mx) + ::log(sum));
  }
  double chosen = 0;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    float best_score = 0;
    for (int i = 0; i < E; ++i) {
      bool taken = false;
      for (int q = 0; q < j; ++q) taken = taken || top[q] == i;
      if (taken) continue;
      const float score = sigmoid && bias ? p[i] + bias[i] : p[i];
      if (best < 0 || score > best_score) best = i, best_score = score;  // ties: lower index
    }
    top[j] = best;
    topw[j] = p[best];
    chosen += p[best];
  }
  if (norm_topk)
    for (int j = 0; j < k; ++j) topw[j] = float(double(topw[j]) / chosen);
}

// dl[E] of one token (Backend::moe_route_backward); z its z-loss factor (z2 · lse / N ·
// loss_scale). No array of E: a GPU thread's would be local memory reserved for every resident
// thread. d loss/d pᵢ is the balance term plus the one choice (if any) that picked i, in the
// order the host loops summed them before: aux, then the choice.
TRIDENT_HOST_DEVICE inline void route_backward(float* dl, const float* p, const int32_t* top,
                                               const float* topw, const float* dtopw,
                                               const int32_t* aux_count, double aux_num,
                                               double aux_den, double loss_scale, double z, int E,
                                               int k, bool sigmoid, bool norm_topk) {
  double chosen = 0, dotw = 0;
  if (norm_topk)
    for (int j = 0; j < k; ++j) chosen += p[top[j]], dotw += double(dtopw[j]) * topw[j];
  auto dp = [&](int i) {
    double v = aux_count ? aux_num * aux_count[i] / aux_den * loss_scale : 0.0;
    for (int j = 0; j < k; ++j)
      if (top[j] == i) v += norm_topk ? (double(dtopw[j]) - dotw) / chosen : double(dtopw[j]);
    return v;
  };
  if (sigmoid) {
    for (int i = 0; i < E; ++i) dl[i] = float(dp(i) * p[i] * (1.0 - p[i]));
    return;
  }
  double dot = 0;
  for (int i = 0; i < E; ++i) dot += double(p[i]) * dp(i);
  for (int i = 0; i < E; ++i) dl[i] = float(double(p[i]) * (dp(i) - dot) + z * p[i]);
}

}  // namespace trident::moe_token
