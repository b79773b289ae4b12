// model.init_from and `trident export --format safetensors` with transformers' checkpoints:
// a directory (config.json + model.safetensors, or a sharded model.safetensors.index.json), an
// index file, or one .safetensors file (trident/model.h, "Hugging Face weights").
//
// Note [Hugging Face checkpoints]
// The family, the shape and every option come from config.json (Note [config.json keys]); the
// tensors are then checked against what that config needs, every one present with its shape,
// none unknown, none twice, before any is read. A lone GPT-2 .safetensors needs no config.json:
// its shape comes from the tensors and its head count from __metadata__ "n_head" (trident's own
// export writes it). The loader fills what this rank and stage holds through
// ParamInfo::global_index, so any layout loads any file; an untied head stored in a file whose
// config ties it must equal the embedding.
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/hf_checkpoint.h"
#include "model/safetensors_file.h"
#include "trident/check.h"
#include "trident/model.h"

namespace trident {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kIndexName = "model.safetensors.index.json";

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  input_error("model.init_from: {}: {}", where, what);
}

// The name an untied head has, which a file of a tied model may still hold (as a copy).
const char* tied_head_name(Family f) {
  return f == Family::kNeoX ? "embed_out.weight" : "lm_head.weight";
}

struct Stored {
  size_t file = 0;
  const st::Entry* entry = nullptr;
};

// The tensors of a checkpoint, whichever files hold them, and its config.json if any.
struct Checkpoint {
  std::string where;  // the path as given, or the single file
  std::vector<st::File> files;
  std::map<std::string, Stored> tensors;  // by stored name
  std::optional<json> config;
  std::string config_path;
  GPTConfig cfg;
  std::vector<hf::TensorMap> maps;
  std::map<std::string, std::string> stored_as;  // transformers' name → stored name

  // The stored name of transformers' `name`, with or without `prefix` (empty if neither).
  std::string find(const std::string& name, const std::string& prefix) const {
    if (tensors.count(name)) return name;
    if (!prefix.empty() && name.starts_with(prefix) && tensors.count(name.substr(prefix.size())))
      return name.substr(prefix.size());
    return "";
  }
  const st::File& file_of(const std::string& stored) const {
    return files[tensors.at(stored).file];
  }
};

json read_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) input_error("model.init_from: cannot open {}", path);
  try {
    return json::parse(f);
  } catch (const json::exception& e) {
    input_error("model.init_from: {}: not valid JSON: {}", path, e.what());
  }
}

void add_file(Checkpoint& ck, const std::string& path) {
  ck.files.push_back(st::read_header(path));
}

// Opens `path` and reads every header (nothing else yet).
Checkpoint open_checkpoint(const std::string& path) {
  Checkpoint ck;
  ck.where = path;
  std::error_code ec;
  fs::path dir = fs::path(path).parent_path(), index;
  if (fs::is_directory(path, ec)) {
    dir = path;
    if (fs::exists(dir / kIndexName, ec)) index = dir / kIndexName;
    else if (fs::exists(dir / "model.safetensors", ec))
      add_file(ck, (dir / "model.safetensors").string());
    else
      input_error("model.init_from: {}: a directory with neither model.safetensors nor {}", path,
                  kIndexName);
  } else if (fs::path(path).extension() == ".json") {
    index = path;
  } else {
    add_file(ck, path);
  }
  if (!index.empty()) {
    const json j = read_json(index.string());
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object() ||
        j["weight_map"].empty())
      bad(index.string(), "no \"weight_map\" object of tensor names and their files");
    std::map<std::string, size_t> file_index;
    for (const auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
        bad(index.string(), fmt::format("weight_map {}: {} is not a file name beside the index",
                                        name, file.dump()));
      const std::string f = file.get<std::string>();
      if (!file_index.count(f)) {
        file_index[f] = ck.files.size();
        add_file(ck, (index.parent_path() / f).string());
      }
    }
    for (const auto& [name, file] : j["weight_map"].items()) {
      const st::File& f = ck.files[file_index.at(file.get<std::string>())];
      if (!f.entries.count(name))
        bad(index.string(),
            fmt::format("weight_map puts tensor {} in {}, which has no such tensor", name, f.path));
    }
    ck.where = index.string();
  }
  for (size_t i = 0; i < ck.files.size(); ++i)
    for (const auto& [name, e] : ck.files[i].entries)
      if (!ck.tensors.emplace(name, Stored{i, &e}).second)
        bad(ck.files[i].path,
            fmt::format("tensor {} is also in {}", name, ck.files[ck.tensors.at(name).file].path));
  if (ck.files.size() == 1) ck.where = ck.files[0].path;
  if (const fs::path config = dir / "config.json"; fs::exists(config, ec)) {
    ck.config_path = config.string();
    ck.config = read_json(ck.config_path);
  }
  return ck;
}

// The positive integer a metadata value holds ("12" or 12), if any.
std::optional<int> positive_int(const json& v) {
  try {
    const long long n = v.is_string()           ? std::stoll(v.get<std::string>())
                        : v.is_number_integer() ? v.get<long long>()
                                                : 0;
    if (n > 0 && n <= (1 << 20)) return int(n);
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

// The GPT-2 shape the tensors imply (vocab, width, positions, layers; heads from the metadata),
// for a config.json without those keys or a lone file without one.
GPTConfig gpt2_shape(const Checkpoint& ck) {
  const std::string prefix = hf::body_prefix(Family::kGPT2);
  GPTConfig c;
  c.heads = 0;
  const std::string wte = ck.find(prefix + "wte.weight", prefix);
  if (wte.empty())
    bad(ck.where, "no tensor wte.weight (nor transformer.wte.weight): not a GPT-2 state dict; "
                  "a GPT-NeoX or Llama checkpoint needs its config.json beside it");
  const st::Entry& e = *ck.tensors.at(wte).entry;
  if (e.shape.size() != 2 || e.shape[0] < 2 || e.shape[1] < 1 || e.shape[0] > (1 << 30) ||
      e.shape[1] > (1 << 20))
    bad(ck.where,
        fmt::format("tensor {}: shape {} is not [vocab, d_model]", wte, st::shape_text(e.shape)));
  c.vocab = int(e.shape[0]);
  c.channels = int(e.shape[1]);
  const std::string wpe = ck.find(prefix + "wpe.weight", prefix);
  if (wpe.empty()) bad(ck.where, "no tensor wpe.weight (nor transformer.wpe.weight)");
  const st::Entry& p = *ck.tensors.at(wpe).entry;
  if (p.shape.size() != 2 || p.shape[0] < 1 || p.shape[0] > (1 << 24))
    bad(ck.where, fmt::format("tensor {}: shape {} is not [positions, d_model]", wpe,
                              st::shape_text(p.shape)));
  c.max_seq_len = int(p.shape[0]);
  c.layers = 0;  // one more than the largest h.{l}
  for (const auto& [stored, s] : ck.tensors) {
    const std::string name = stored.starts_with(prefix) ? stored.substr(prefix.size()) : stored;
    if (!name.starts_with("h.")) continue;
    const size_t dot = name.find('.', 2);
    const std::string digits = name.substr(2, dot == std::string::npos ? 0 : dot - 2);
    if (digits.empty() || digits.size() > 6 ||
        !std::all_of(digits.begin(), digits.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
      bad(ck.where, fmt::format("tensor {}: not a GPT-2 tensor name (h.<layer>.<name>)", stored));
    c.layers = std::max(c.layers, std::stoi(digits) + 1);
  }
  if (c.layers < 1) bad(ck.where, "no blocks (tensors h.0.*)");
  const json& meta = ck.files[0].metadata;
  if (meta.contains("n_head")) {
    const std::optional<int> heads = positive_int(meta["n_head"]);
    if (!heads)
      bad(ck.files[0].path,
          fmt::format("__metadata__ n_head {} is not a positive integer", meta["n_head"].dump()));
    if (c.channels % *heads != 0)
      bad(ck.files[0].path, fmt::format("__metadata__ n_head = {} does not divide the embedding "
                                        "width {}",
                                        *heads, c.channels));
    c.heads = *heads;
  }
  return c;
}

// The config (family, shape, options) and the full check of the tensors against it.
void resolve(Checkpoint& ck) {
  const std::string type = ck.config && ck.config->is_object() &&
                                   ck.config->contains("model_type") &&
                                   (*ck.config)["model_type"].is_string()
                               ? (*ck.config)["model_type"].get<std::string>()
                               : "";
  GPTConfig shape;
  if (!ck.config || type == "gpt2") {
    shape = gpt2_shape(ck);
    const bool config_heads = ck.config && ck.config->contains("n_head");
    if (shape.heads == 0 && !config_heads)
      bad(ck.where, fmt::format("the number of attention heads is neither in __metadata__ "
                                "(\"n_head\") nor in a config.json beside it{}: put the model's "
                                "config.json there",
                                ck.config ? " (" + ck.config_path + " has no n_head)" : ""));
  }
  if (ck.config) {
    ck.cfg = hf::config_from_json(*ck.config, ck.config_path, shape);
  } else {
    ck.cfg = shape;
    ck.cfg.apply_family(Family::kGPT2);
    ck.cfg.padded_vocab = GPTConfig::pad_vocab(ck.cfg.vocab);
  }
  const GPTConfig& c = ck.cfg;
  const std::string family = hf::display_name(c);
  const std::string prefix = hf::body_prefix(c.family);
  // A config's layer count is checked against the tensors before any per-layer list is built.
  if (size_t(c.layers) > ck.tensors.size())
    bad(ck.where, fmt::format("{} layers need more than the {} tensors the checkpoint has",
                              c.layers, ck.tensors.size()));
  ck.maps = hf::tensor_maps(c);
  std::map<std::string, const hf::TensorMap*> expected;  // transformers' full name → its tensor
  for (const hf::TensorMap& m : ck.maps)
    for (const std::string& n : m.hf) expected[n] = &m;
  std::map<std::string, std::string> seen;  // full name → stored name
  for (const auto& [stored, s] : ck.tensors) {
    const std::string full =
        !expected.count(stored) && expected.count(prefix + stored) ? prefix + stored : stored;
    const std::string bare = full.starts_with(prefix) ? full.substr(prefix.size()) : full;
    const bool tied_copy = c.tied_head && full == tied_head_name(c.family);
    if (!expected.count(full) && !hf::is_buffer(c.family, bare) && !tied_copy)
      bad(ck.file_of(stored).path,
          fmt::format("tensor {}: not a {} parameter trident knows", stored, family));
    if (!seen.emplace(full, stored).second)
      bad(ck.file_of(stored).path, fmt::format("tensors {} and {}: the same {} parameter twice",
                                               seen[full], stored, family));
  }
  const std::string source = ck.config ? ck.config_path : "the file's other tensors";
  for (const hf::TensorMap& m : ck.maps)
    for (size_t i = 0; i < m.hf.size(); ++i) {
      const std::string& name = m.hf[i];
      const std::string stored = ck.find(name, prefix);
      if (stored.empty()) {
        const std::string bare = name.starts_with(prefix) ? name.substr(prefix.size()) : name;
        bad(ck.where,
            fmt::format("no tensor {}{}: {} makes a {} of {} layers, which has it", bare,
                        bare == name ? "" : " (nor " + name + ")", source, family, c.layers));
      }
      const st::Entry& e = *ck.tensors.at(stored).entry;
      if (e.shape != m.hf_shape[i])
        bad(ck.file_of(stored).path,
            fmt::format("tensor {}: shape {}, a {} with d_model {}, vocab {}, {} positions, "
                        "heads {} (kv {}), MLP width {}{} needs {}{}",
                        stored, st::shape_text(e.shape), family, c.channels, c.vocab, c.max_seq_len,
                        c.heads, c.kv_head_count(), c.hidden(),
                        c.has_moe() ? fmt::format(", {} experts", c.moe.experts) : "",
                        st::shape_text(m.hf_shape[i]),
                        m.layout == hf::Layout::kConv1D ? " (Conv1D: [in, out])" : ""));
      ck.stored_as[name] = stored;
    }
}

Checkpoint open_resolved(const std::string& path) {
  Checkpoint ck = open_checkpoint(path);
  resolve(ck);
  return ck;
}

// Transformers' tensors of map `m` read as fp32, in their shapes.
std::vector<std::vector<float>> read_parts(const Checkpoint& ck, const hf::TensorMap& m,
                                           std::vector<std::ifstream>& streams) {
  std::vector<std::vector<float>> parts(m.hf.size());
  for (size_t i = 0; i < m.hf.size(); ++i) {
    const std::string& stored = ck.stored_as.at(m.hf[i]);
    const Stored& s = ck.tensors.at(stored);
    st::read_floats(streams[s.file], ck.files[s.file], stored, *s.entry, parts[i]);
  }
  return parts;
}

// The head stored beside a tied embedding must be the embedding (transformers ties them).
void check_tied_copy(const Checkpoint& ck, const std::vector<float>& wte_rows,
                     std::vector<std::ifstream>& streams) {
  const GPTConfig& c = ck.cfg;
  if (!c.tied_head) return;
  const std::string stored = ck.find(tied_head_name(c.family), "");
  if (stored.empty()) return;
  const Stored& s = ck.tensors.at(stored);
  const std::string embed = ck.maps.front().hf[0];
  if (s.entry->shape != ck.tensors.at(ck.stored_as.at(embed)).entry->shape)
    bad(ck.files[s.file].path,
        fmt::format("tensor {}: shape {}, but the config ties the LM head to {}", stored,
                    st::shape_text(s.entry->shape), embed));
  std::vector<float> file;
  st::read_floats(streams[s.file], ck.files[s.file], stored, *s.entry, file);
  if (std::memcmp(file.data(), wte_rows.data(), file.size() * sizeof(float)) != 0)
    bad(ck.files[s.file].path,
        fmt::format("tensor {} differs from {}: the config (tie_word_embeddings) ties the LM "
                    "head to the token embedding",
                    stored, ck.stored_as.at(embed)));
}

std::vector<std::ifstream> open_streams(const Checkpoint& ck) {
  std::vector<std::ifstream> streams;
  for (const st::File& f : ck.files) streams.emplace_back(f.path, std::ios::binary);
  return streams;
}

// The checkpoint of `cfg` at `path` (and config.json beside it, with_config or for a family
// other than GPT-2), each trident global tensor from global_of(map), asked for once each, in
// transformers' module order. Returns the bytes of the tensor file.
size_t write_hf_checkpoint(
    const GPTConfig& cfg, const std::string& path, bool with_config,
    const std::function<std::vector<float>(const hf::TensorMap&)>& global_of) {
  const json config = hf::json_from_config(cfg);  // refuses a block transformers cannot hold
  const std::vector<hf::TensorMap> maps = hf::tensor_maps(cfg);
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::pair<size_t, size_t>> source;  // (map, part) of each written tensor
  for (size_t i = 0; i < maps.size(); ++i)
    for (size_t k = 0; k < maps[i].hf.size(); ++k) {
      names.push_back(maps[i].hf[k]);
      shapes.push_back(maps[i].hf_shape[k]);
      source.push_back({i, k});
    }
  json metadata = {{"format", "pt"}};
  if (cfg.family == Family::kGPT2) metadata["n_head"] = std::to_string(cfg.heads);
  std::vector<std::vector<float>> parts;
  size_t parts_of = maps.size();
  const size_t bytes = st::write_file(path, metadata, names, shapes, [&](size_t t) {
    const auto [i, k] = source[t];
    if (parts_of != i) {  // each map's parts are made once, when its first is written
      parts = hf::to_hf(maps[i], global_of(maps[i]));
      parts_of = i;
    }
    return std::move(parts[k]);
  });
  // config.json beside the file: what from_pretrained and model.init_from read. A lone GPT-2
  // file carries its head count in __metadata__ and needs none (Note [Hugging Face checkpoints]).
  const fs::path dir = fs::path(path).parent_path();
  if (with_config || cfg.family != Family::kGPT2) {
    const std::string config_path = (dir / "config.json").string();
    std::ofstream f(config_path, std::ios::trunc);
    f << config.dump(2) << "\n";
    f.flush();
    if (!f) input_error("export: cannot write {}: {}", config_path, std::strerror(errno));
  }
  return bytes;
}

}  // namespace

bool is_safetensors(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec))
    return fs::exists(fs::path(path) / kIndexName, ec) ||
           fs::exists(fs::path(path) / "model.safetensors", ec);
  if (fs::path(path).filename().string().ends_with(".safetensors.index.json")) return true;
  return st::is_file(path);
}

GPTConfig read_safetensors_config(const std::string& path) { return open_resolved(path).cfg; }

std::map<std::string, std::vector<float>> read_hf_global_tensors(const std::string& path,
                                                                 GPTConfig* cfg) {
  const Checkpoint ck = open_resolved(path);
  std::vector<std::ifstream> streams = open_streams(ck);
  std::map<std::string, std::vector<float>> out;
  for (const hf::TensorMap& m : ck.maps) {
    const std::vector<std::vector<float>> parts = read_parts(ck, m, streams);
    if (m.trident == "wte") check_tied_copy(ck, parts[0], streams);
    out[m.trident] = hf::to_trident(m, parts);
  }
  if (cfg) *cfg = ck.cfg;
  return out;
}

void load_safetensors_weights(GPT& model, const std::string& path, const ParamWriteFn& write) {
  const Checkpoint ck = open_resolved(path);
  const GPTConfig& f = ck.cfg;
  const GPTConfig& c = model.config();
  if (f.family != c.family || f.layers != c.layers || f.channels != c.channels ||
      f.vocab != c.vocab || f.max_seq_len != c.max_seq_len || f.heads != c.heads ||
      f.kv_head_count() != c.kv_head_count() || f.hidden() != c.hidden() ||
      describe_block(f) != describe_block(c))
    bad(ck.where, fmt::format("a {} of layers={} d_model={} heads={} vocab={} max_seq_len={} "
                              "({}), the model has layers={} d_model={} heads={} vocab={} "
                              "max_seq_len={} ({})",
                              hf::display_name(f), f.layers, f.channels, f.heads, f.vocab,
                              f.max_seq_len, describe_block(f), c.layers, c.channels, c.heads,
                              c.vocab, c.max_seq_len, describe_block(c)));
  std::map<std::string, const hf::TensorMap*> by_trident;
  for (const hf::TensorMap& m : ck.maps) by_trident[m.trident] = &m;
  std::vector<std::ifstream> streams = open_streams(ck);
  std::optional<HostView<float>> host;  // without `write`, the model's buffer
  if (!write) host.emplace(model.backend(), model.params(), model.num_params(), /*load=*/false);
  std::vector<float> piece;
  // What this rank and stage holds, each from the global tensor (Note [Tensor-parallel shards]).
  for (const ParamInfo& p : model.params_info()) {
    const auto it = by_trident.find(p.name);
    TRIDENT_CHECK(it != by_trident.end(), "parameter {} has no Hugging Face tensor", p.name);
    const hf::TensorMap& m = *it->second;
    hf::TensorMap padded = m;  // this run's padding of the vocabulary (tp may pad further)
    padded.global_shape = p.global_shape;
    TRIDENT_CHECK(
        padded.global_shape.size() == m.global_shape.size() &&
            std::equal(p.global_shape.begin() + 1, p.global_shape.end(),
                       m.global_shape.begin() + 1) &&
            (p.global_shape[0] == m.global_shape[0] || p.name == "wte" || p.name == "lmw"),
        "parameter {}: the model's global shape differs from the Hugging Face map's", p.name);
    const std::vector<std::vector<float>> parts = read_parts(ck, m, streams);
    if (p.name == "wte") check_tied_copy(ck, parts[0], streams);
    const std::vector<float> global = hf::to_trident(padded, parts);
    if (write) piece.resize(p.count);
    float* dst = write ? piece.data() : host->data() + p.offset;
    for (size_t i = 0; i < p.count; ++i) dst[i] = global[p.global_index(i)];
    if (write) write(p, piece.data());
  }
  if (host) host->commit();
}

size_t save_safetensors_weights(GPT& model, const std::string& path, bool with_config) {
  const GPTConfig& cfg = model.config();
  const std::vector<ParamInfo>& infos = model.params_info();
  // Every tensor whole on this rank: no tp, no stage, no experts split over ep.
  const bool whole = std::all_of(infos.begin(), infos.end(), [](const ParamInfo& p) {
    size_t n = 1;
    for (int d : p.global_shape) n *= size_t(d);
    return p.count == n;
  });
  TRIDENT_CHECK(model.tensor_parallel().size == 1 && model.stage().has_embedding &&
                    model.stage().has_head && model.stage().first_layer == 0 && whole &&
                    infos.size() == gpt_param_layout(cfg).size(),
                "save_safetensors_weights needs the whole model on this rank");
  HostView<float> host(model.backend(), model.params(), model.num_params(), /*load=*/true);
  return write_hf_checkpoint(cfg, path, with_config, [&](const hf::TensorMap& m) {
    const ParamInfo& p = model.param(m.trident);
    TRIDENT_CHECK(p.global_shape == m.global_shape,
                  "parameter {}: the model's global shape differs from the Hugging Face map's",
                  p.name);
    std::vector<float> global(p.count);
    for (size_t j = 0; j < p.count; ++j) global[p.global_index(j)] = host.data()[p.offset + j];
    return global;
  });
}

size_t save_hf_global_tensors(const GPTConfig& cfg,
                              const std::map<std::string, std::vector<float>>& tensors,
                              const std::string& path, bool with_config) {
  return write_hf_checkpoint(cfg, path, with_config, [&](const hf::TensorMap& m) {
    const auto it = tensors.find(m.trident);
    TRIDENT_CHECK(it != tensors.end(), "no tensor {} to write", m.trident);
    return it->second;
  });
}

}  // namespace trident
