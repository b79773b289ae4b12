// The parameter layout (Note [Parameter layout] in trident/model.h) and the FLOP count.
#include <fmt/format.h>

#include "trident/check.h"
#include "trident/model.h"

namespace trident {

double GPTConfig::matmul_params() const {
  double C = channels, L = layers;
  return 12.0 * L * C * C + C * vocab;
}

double GPTConfig::train_flops_per_token(int T) const {
  return 6.0 * matmul_params() + 12.0 * layers * double(T) * channels;
}

std::vector<ParamInfo> gpt_param_layout(const GPTConfig& cfg) {
  const int C = cfg.channels, L = cfg.layers;
  std::vector<ParamInfo> out;
  size_t offset = 0;
  auto add = [&](std::string name, std::vector<int> shape, bool decay, int layer) {
    size_t count = 1;
    for (int d : shape) count *= size_t(d);
    out.push_back({std::move(name), std::move(shape), offset, count, decay, layer});
    offset += count;
  };
  // Ready order: the LM head's dense wte gradient, the final LayerNorm, blocks last to first
  // (each in its own backward order), the position embedding last.
  add("wte", {cfg.padded_vocab, C}, true, -1);
  add("lnfw", {C}, false, -1);
  add("lnfb", {C}, false, -1);
  for (int l = L - 1; l >= 0; --l) {
    auto n = [l](const char* s) { return fmt::format("h{}.{}", l, s); };
    add(n("fcprojw"), {C, 4 * C}, true, l);
    add(n("fcprojb"), {C}, false, l);
    add(n("fcw"), {4 * C, C}, true, l);
    add(n("fcb"), {4 * C}, false, l);
    add(n("ln2w"), {C}, false, l);
    add(n("ln2b"), {C}, false, l);
    add(n("attprojw"), {C, C}, true, l);
    add(n("attprojb"), {C}, false, l);
    add(n("qkvw"), {3 * C, C}, true, l);
    add(n("qkvb"), {3 * C}, false, l);
    add(n("ln1w"), {C}, false, l);
    add(n("ln1b"), {C}, false, l);
  }
  add("wpe", {cfg.max_seq_len, C}, true, -1);
  return out;
}

}  // namespace trident
