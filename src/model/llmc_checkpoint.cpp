// llm.c's GPT-2 checkpoint format (version 3): int32[256] header
//   [0] magic 20240326, [1] version 3, [2] maxT, [3] V, [4] L, [5] NH, [6] C, [7] Vp,
// then fp32 tensors, each covering all layers, in this order:
//   wte[Vp,C] wpe[maxT,C] ln1w[L,C] ln1b[L,C] qkvw[L,3C,C] qkvb[L,3C] attprojw[L,C,C]
//   attprojb[L,C] ln2w[L,C] ln2b[L,C] fcw[L,4C,C] fcb[L,4C] fcprojw[L,C,4C] fcprojb[L,C]
//   lnfw[C] lnfb[C]
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "trident/check.h"
#include "trident/model.h"

namespace trident {
namespace {

constexpr int kMagic = 20240326;
constexpr int kVersion = 3;

// One entry per llm.c tensor: the per-layer name (or global name) and whether it repeats per layer.
struct LlmcTensor {
  const char* name;
  bool per_layer;
};
constexpr LlmcTensor kOrder[] = {
    {"wte", false},    {"wpe", false},    {"ln1w", true},     {"ln1b", true},
    {"qkvw", true},    {"qkvb", true},    {"attprojw", true}, {"attprojb", true},
    {"ln2w", true},    {"ln2b", true},    {"fcw", true},      {"fcb", true},
    {"fcprojw", true}, {"fcprojb", true}, {"lnfw", false},    {"lnfb", false}};

std::string pname(const LlmcTensor& t, int l) {
  return t.per_layer ? fmt::format("h{}.{}", l, t.name) : std::string(t.name);
}

}  // namespace

GPTConfig read_llmc_config(const std::string& path) {
  if (is_safetensors(path)) return read_safetensors_config(path);
  std::ifstream f(path, std::ios::binary);
  if (!f) input_error("model.init_from: cannot open {}", path);
  int32_t h[256] = {};
  f.read(reinterpret_cast<char*>(h), sizeof(h));
  if (f.gcount() != sizeof(h))
    input_error("model.init_from: {}: file is {} bytes, shorter than the 1024-byte header", path,
                f.gcount());
  if (h[0] != kMagic)
    input_error("model.init_from: {}: bad magic {} (an llm.c GPT-2 checkpoint has {}; a "
                "safetensors file, a JSON header after its 8-byte length)",
                path, h[0], kMagic);
  if (h[1] != kVersion)
    input_error("model.init_from: {}: version {} not supported (need {}, fp32 with padded vocab)",
                path, h[1], kVersion);
  GPTConfig cfg;
  cfg.max_seq_len = h[2];
  cfg.vocab = h[3];
  cfg.layers = h[4];
  cfg.heads = h[5];
  cfg.channels = h[6];
  cfg.padded_vocab = h[7];
  if (cfg.max_seq_len < 1 || cfg.vocab < 2 || cfg.layers < 1 || cfg.heads < 1 || cfg.channels < 1 ||
      cfg.channels % cfg.heads != 0 || cfg.padded_vocab < cfg.vocab)
    input_error("model.init_from: {}: inconsistent header maxT={} V={} L={} NH={} C={} Vp={}", path,
                h[2], h[3], h[4], h[5], h[6], h[7]);
  // The size the header's shape needs, from the tensor list above, in 128 bits: a header's
  // int32s can ask for more than 2^64 bytes, and must be refused before any per-layer table is
  // built for them (tests/fuzz/regressions/fuzz_llmc_checkpoint/huge_layers: a 2 KB file with
  // L = 3014657 spent over 20 s and 1.6 GB building the layout before the size check).
  using u128 = unsigned __int128;
  const u128 C = u128(cfg.channels), L = u128(cfg.layers);
  const u128 floats =
      u128(cfg.padded_vocab) * C + u128(cfg.max_seq_len) * C + L * (12 * C * C + 13 * C) + 2 * C;
  const u128 expected = 1024 + 4 * floats;
  const auto actual = std::filesystem::file_size(path);
  if (u128(actual) != expected)
    input_error("model.init_from: {}: file is {} bytes, the header's shape needs {}", path, actual,
                expected > u128(UINT64_MAX) ? std::string("more than 2^64")
                                            : std::to_string(uint64_t(expected)));
  size_t layout_bytes = 1024;
  for (const ParamInfo& p : gpt_param_layout(cfg)) layout_bytes += p.count * sizeof(float);
  TRIDENT_CHECK(layout_bytes == actual, "llm.c size formula {} != layout {}", actual, layout_bytes);
  return cfg;
}

void load_llmc_weights(GPT& model, const std::string& path, const ParamWriteFn& write) {
  if (is_safetensors(path)) return load_safetensors_weights(model, path, write);
  const GPTConfig file_cfg = read_llmc_config(path);
  const GPTConfig& cfg = model.config();
  TRIDENT_CHECK(file_cfg.layers == cfg.layers && file_cfg.channels == cfg.channels &&
                    file_cfg.vocab == cfg.vocab && file_cfg.max_seq_len == cfg.max_seq_len,
                "model shape differs from {}", path);
  std::ifstream f(path, std::ios::binary);
  f.seekg(1024);
  std::vector<float> global, piece;
  std::optional<HostView<float>> host;
  if (!write) host.emplace(model.backend(), model.params(), model.num_params(), /*load=*/false);
  // A pipeline stage holds some of the tensors: the others are skipped in the file.
  std::unordered_map<std::string, const ParamInfo*> held;
  for (const ParamInfo& p : model.params_info()) held[p.name] = &p;
  const std::vector<ParamInfo> whole = gpt_param_layout(file_cfg);
  std::unordered_map<std::string, const ParamInfo*> in_file;
  for (const ParamInfo& p : whole) in_file[p.name] = &p;
  for (const LlmcTensor& t : kOrder) {
    for (int l = 0; l < (t.per_layer ? cfg.layers : 1); ++l) {
      const auto it = held.find(pname(t, l));
      if (it == held.end()) {
        f.seekg(std::streamoff(in_file.at(pname(t, l))->count * 4), std::ios::cur);
        continue;
      }
      const ParamInfo& p = *it->second;
      // The file holds the global tensor; wte has the file's padded rows (which may differ
      // from this run's padding, e.g. for tensor parallelism: extra rows are zero).
      const size_t cols = p.global_shape.size() > 1 ? size_t(p.global_shape[1]) : 1;
      const size_t file_rows =
          p.name == "wte" ? size_t(file_cfg.padded_vocab) : size_t(p.global_shape[0]);
      global.assign(file_rows * cols, 0.0f);
      f.read(reinterpret_cast<char*>(global.data()), std::streamsize(global.size() * 4));
      if (!f) input_error("model.init_from: {}: read failed at tensor {}", path, p.name);
      if (write) piece.resize(p.count);
      float* dst = write ? piece.data() : host->data() + p.offset;
      for (size_t i = 0; i < p.count; ++i) {
        const size_t g = p.global_index(i);
        dst[i] = g / cols < file_rows ? global[g] : 0.0f;
      }
      if (write) write(p, piece.data());
    }
  }
  if (host) host->commit();
}

void save_llmc_weights(GPT& model, const std::string& path) {
  const GPTConfig& cfg = model.config();
  TRIDENT_CHECK(model.tensor_parallel().size == 1,
                "save_llmc_weights needs the whole model (tp 1)");
  if (!cfg.is_gpt2_block())
    input_error("llm.c's checkpoint holds GPT-2's block only; this model is {} (export it as "
                "safetensors)",
                describe_block(cfg));
  int32_t h[256] = {};
  h[0] = kMagic;
  h[1] = kVersion;
  h[2] = cfg.max_seq_len;
  h[3] = cfg.vocab;
  h[4] = cfg.layers;
  h[5] = cfg.heads;
  h[6] = cfg.channels;
  h[7] = cfg.padded_vocab;
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) input_error("export: cannot write {}: {}", path, std::strerror(errno));
  f.write(reinterpret_cast<const char*>(h), sizeof(h));
  HostView<float> host(model.backend(), model.params(), model.num_params(), /*load=*/true);
  for (const LlmcTensor& t : kOrder)
    for (int l = 0; l < (t.per_layer ? cfg.layers : 1); ++l) {
      const ParamInfo& p = model.param(pname(t, l));
      f.write(reinterpret_cast<const char*>(host.data() + p.offset), std::streamsize(p.count * 4));
    }
  f.flush();
  if (!f) input_error("export: write failed: {}: {}", path, std::strerror(errno));
}

}  // namespace trident
