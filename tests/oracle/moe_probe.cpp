// moe_probe: trident's side of the mixture oracle (tests/oracle/test_moe_oracle.py). Two
// MoeLayers on the CPU backend, sharing one MoeHfTotals: y1 = moe1(x), y2 = moe2(y1), then
// layer 2's backward of dout and layer 1's of layer 2's dx, one slot, no expert parallelism.
// Reads IN/config.txt (key=value: C E k Fe activation router norm_topk capacity_factor
// shared_experts shared_gate aux aux_coeff z_coeff N loss_scale), IN/x.bin and IN/dout.bin
// [N,C], and each layer's tensors IN/l<1|2>.<name>.bin (raw little-endian fp32, trident's
// layout, Note [Expert tensors] in src/model/gpt_layout.cpp): expfcw, expfcprojw, router,
// routerbias (sigmoid), shfcw, shfcprojw, shgate (shared experts; the gate when gated).
// Writes OUT/y1.npy, y2.npy, dy1.npy (layer 2's dx), dx.npy, OUT/l<1|2>.d<name>.npy for every
// weight gradient and OUT/stats.json: each layer's take_stats figures and the hf totals.
// Usage: moe_probe IN OUT
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "model/moe.h"
#include "npy.h"
#include "trident/backend.h"
#include "trident/check.h"
#include "trident/model.h"

namespace {

namespace fs = std::filesystem;
using trident::Activation, trident::MoeAux, trident::MoeRouter;
using trident::testing::write_npy;

std::vector<float> read_f32(const fs::path& path, size_t count) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  TRIDENT_CHECK(bool(in), "cannot open {}", path.string());
  TRIDENT_CHECK(size_t(in.tellg()) == count * 4, "{}: {} bytes, expected {} floats", path.string(),
                size_t(in.tellg()), count);
  in.seekg(0);
  std::vector<float> v(count);
  in.read(reinterpret_cast<char*>(v.data()), std::streamsize(count * 4));
  return v;
}

std::map<std::string, std::string> read_config(const fs::path& path) {
  std::ifstream in(path);
  TRIDENT_CHECK(bool(in), "cannot open {}", path.string());
  std::map<std::string, std::string> kv;
  for (std::string line; std::getline(in, line);) {
    const size_t eq = line.find('=');
    if (line.empty() || eq == std::string::npos) continue;
    kv[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return kv;
}

// One layer's tensors and gradients, each its own vector (empty: the layer has none).
struct LayerTensors {
  // In MoeWeights' order; g[3] stays empty: the choice bias has no gradient (MoeGrads).
  std::vector<float> w[7], g[7];
  static constexpr const char* kNames[7] = {"expfcw", "expfcprojw", "router", "routerbias",
                                            "shfcw",  "shfcprojw",  "shgate"};
  trident::MoeWeights weights() const {
    auto p = [&](int i) { return w[i].empty() ? nullptr : w[i].data(); };
    return {p(0), p(1), p(2), p(3), p(4), p(5), p(6)};
  }
  trident::MoeGrads grads() {
    auto p = [&](int i) { return g[i].empty() ? nullptr : g[i].data(); };
    return {p(0), p(1), p(2), p(4), p(5), p(6)};
  }
};

std::string stats_json(const trident::MoeStats& s) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "{\"aux_loss\": %.17g, \"z_loss\": %.17g, \"dropped\": %lld, \"choices\": %lld, "
                "\"load_max_over_mean\": %.17g, \"layers_seen\": %d}",
                s.aux_loss, s.z_loss, (long long)s.dropped, (long long)s.choices,
                s.load_max_over_mean, s.layers_seen);
  return buf;
}

std::string list_json(const std::vector<double>& v) {
  std::string out = "[";
  char buf[32];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s%.17g", i ? ", " : "", v[i]);
    out += buf;
  }
  return out + "]";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: moe_probe IN OUT\n";
    return 2;
  }
  try {
    const fs::path in = argv[1], out = argv[2];
    auto kv = read_config(in / "config.txt");
    auto get = [&](const std::string& key) {
      TRIDENT_CHECK(kv.count(key) == 1, "config.txt: no {}", key);
      return kv[key];
    };
    trident::GPTConfig cfg;
    cfg.layers = 2;
    cfg.heads = 1;
    cfg.bias = false;
    cfg.channels = std::stoi(get("C"));
    cfg.mlp_hidden = std::stoi(get("Fe"));
    trident::MoeConfig& m = cfg.moe;
    m.experts = std::stoi(get("E"));
    m.top_k = std::stoi(get("k"));
    m.ffn_width = cfg.mlp_hidden;
    const std::string act = get("activation"), router = get("router"), aux = get("aux");
    TRIDENT_CHECK(act == "swiglu" || act == "gelu_tanh" || act == "gelu_erf", "activation {}", act);
    cfg.activation = act == "swiglu"      ? Activation::kSwiGLU
                     : act == "gelu_tanh" ? Activation::kGeluTanh
                                          : Activation::kGeluErf;
    TRIDENT_CHECK(router == "softmax" || router == "sigmoid", "router {}", router);
    m.router = router == "softmax" ? MoeRouter::kSoftmax : MoeRouter::kSigmoid;
    m.norm_topk = get("norm_topk") == "1";
    m.capacity_factor = std::stof(get("capacity_factor"));
    m.shared_experts = std::stoi(get("shared_experts"));
    m.shared_gate = get("shared_gate") == "1";
    TRIDENT_CHECK(aux == "none" || aux == "switch" || aux == "hf", "aux {}", aux);
    m.aux_loss = aux == "none" ? MoeAux::kNone : aux == "switch" ? MoeAux::kSwitch : MoeAux::kHF;
    m.aux_coeff = std::stof(get("aux_coeff"));
    m.z_coeff = std::stof(get("z_coeff"));
    const int N = std::stoi(get("N"));
    const float loss_scale = std::stof(get("loss_scale"));
    trident::check_model_config(cfg);

    const size_t C = size_t(cfg.channels), E = size_t(m.experts), Fe = size_t(cfg.expert_width());
    const size_t fcr = size_t(cfg.fc_rows_of(int(Fe))), Fs = size_t(cfg.shared_width());
    const size_t fcs = size_t(cfg.fc_rows_of(int(Fs)));
    const size_t bias = m.router == MoeRouter::kSigmoid ? E : 0, gate = m.shared_gate ? C : 0;
    const size_t sizes[7] = {E * fcr * C, E * C * Fe, E * C, bias, fcs * C, C * Fs, gate};
    const std::vector<int> shapes[7] = {
        {int(E * fcr), int(C)}, {int(E * C), int(Fe)}, {int(E), int(C)}, {int(E)},
        {int(fcs), int(C)},     {int(C), int(Fs)},     {1, int(C)}};
    LayerTensors layers[2];
    for (int l = 0; l < 2; ++l)
      for (int i = 0; i < 7; ++i) {
        if (sizes[i] == 0) continue;
        const std::string name = "l" + std::to_string(l + 1) + "." + LayerTensors::kNames[i];
        layers[l].w[i] = read_f32(in / (name + ".bin"), sizes[i]);
        if (i != 3) layers[l].g[i].assign(sizes[i], 0.0f);  // not routerbias
      }
    const std::vector<float> x = read_f32(in / "x.bin", size_t(N) * C);
    const std::vector<float> dout = read_f32(in / "dout.bin", size_t(N) * C);

    auto be = trident::make_cpu_backend(1);
    trident::MoeHfTotals hf;
    hf.count.assign(E, 0.0);
    hf.psum.assign(E, 0.0);
    hf.layers.assign(1, 0);
    hf.count_device = trident::BackendBuffer<int32_t>(*be, E);
    trident::MoeLayer moe1(cfg, *be, 0, 1, N, trident::ExpertParallel{}, &hf);
    trident::MoeLayer moe2(cfg, *be, 1, 1, N, trident::ExpertParallel{}, &hf);
    // NaN in every assigned output: a row the layer leaves unwritten shows.
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> y1(size_t(N) * C, nan), y2(y1), dy1(y1), dx(y1);
    moe1.forward(0, y1.data(), x.data(), layers[0].weights(), N, true);
    moe2.forward(0, y2.data(), y1.data(), layers[1].weights(), N, true);
    moe2.backward(0, dy1.data(), dout.data(), y1.data(), layers[1].weights(), layers[1].grads(), N,
                  loss_scale);
    moe1.backward(0, dx.data(), dy1.data(), x.data(), layers[0].weights(), layers[0].grads(), N,
                  loss_scale);

    fs::create_directories(out);
    const std::vector<int> nc = {N, int(C)};
    write_npy(out / "y1.npy", y1.data(), nc);
    write_npy(out / "y2.npy", y2.data(), nc);
    write_npy(out / "dy1.npy", dy1.data(), nc);
    write_npy(out / "dx.npy", dx.data(), nc);
    for (int l = 0; l < 2; ++l)
      for (int i = 0; i < 7; ++i) {
        if (layers[l].g[i].empty()) continue;
        const std::string name = "l" + std::to_string(l + 1) + ".d" + LayerTensors::kNames[i];
        write_npy(out / (name + ".npy"), layers[l].g[i].data(), shapes[i]);
      }
    // transformers' form as GPT::moe_end_forward totals it: the layer reports none itself.
    double hf_sum = 0;
    for (size_t i = 0; i < E; ++i) hf_sum += hf.count[i] * hf.psum[i];
    const double LN = double(hf.layers[0]) * N;
    const double hf_aux = LN > 0 ? double(m.aux_coeff) * double(E) * hf_sum / (LN * LN) : 0.0;
    trident::MoeStats s1, s2;
    moe1.take_stats(s1);
    moe2.take_stats(s2);
    std::ofstream js(out / "stats.json");
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", hf_aux);
    js << "{\"l1\": " << stats_json(s1) << ",\n \"l2\": " << stats_json(s2)
       << ",\n \"hf\": {\"count\": " << list_json(hf.count) << ", \"psum\": " << list_json(hf.psum)
       << ", \"layers\": " << hf.layers[0] << ", \"aux\": " << buf << "}}\n";
    TRIDENT_CHECK(bool(js), "write to {} failed", (out / "stats.json").string());
    return 0;
  } catch (const trident::Error& e) {
    std::cerr << "moe_probe: " << e.what() << "\n";
    return int(e.code());
  } catch (const std::exception& e) {
    std::cerr << "moe_probe: " << e.what() << "\n";
    return 1;
  }
}
