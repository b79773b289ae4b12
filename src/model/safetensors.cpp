// Hugging Face GPT-2 weights as safetensors: `trident export --format safetensors` writes them,
// model.init_from reads them (llmc_checkpoint.cpp hands such a file to this reader).
//
// Note [GPT-2 safetensors]
// Files are transformers' GPT-2 (GPT2LMHeadModel as save_pretrained stores it), so they go to
// and from the Hugging Face tools unchanged; trident converts names, the Conv1D orientation and
// wte's padding at the boundary. Everything is checked against the file before anything is
// read, and each problem is an input_error naming the file and the tensor or field.
//
// The file is an 8-byte little-endian header length N, N bytes of JSON {name: {"dtype",
// "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the raw little-endian
// tensor bytes, offsets counted from the first byte after the header. The names and layout
// differ from trident's (llm.c's) in three ways:
//   - names: h.{l}.attn.c_attn.weight is h{l}.qkvw, ln_f.weight is lnfw, ... (kNames below);
//   - orientation: HF's Conv1D keeps its weight [in, out], the transpose of nn.Linear's and of
//     trident's [out, in], so c_attn, attn.c_proj, c_fc and mlp.c_proj are transposed both ways
//     (the biases and LayerNorms are not);
//   - wte has the real vocabulary's rows, not the padded ones (padded rows load as zero).
// Written: GPT2LMHeadModel's state dict as save_pretrained stores it: every name prefixed
// "transformer.", the LM head tied to wte and so not stored, __metadata__ {"format": "pt"} plus
// "n_head" (the one shape number the tensors do not carry). Read: names with or without the
// prefix (the hub's gpt2 model.safetensors has none), lm_head.weight if present (it must equal
// wte, which trident ties it to), the attention-mask buffers h.{l}.attn.bias/masked_bias of
// older exports ignored; F32, or F16/BF16 widened to fp32. The head count comes from
// __metadata__ "n_head", else from the "n_head" of a config.json beside the file (as the hub
// ships it).
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trident/check.h"
#include "trident/model.h"

namespace trident {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kPrefix = "transformer.";
constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // safetensors' own limit on N

// trident's per-block names and GPT-2's, and whether the weight is a transposed Conv1D.
struct BlockName {
  const char* trident;
  const char* hf;
  bool transposed;
};
constexpr BlockName kBlockNames[] = {
    {"ln1w", "ln_1.weight", false},           {"ln1b", "ln_1.bias", false},
    {"qkvw", "attn.c_attn.weight", true},     {"qkvb", "attn.c_attn.bias", false},
    {"attprojw", "attn.c_proj.weight", true}, {"attprojb", "attn.c_proj.bias", false},
    {"ln2w", "ln_2.weight", false},           {"ln2b", "ln_2.bias", false},
    {"fcw", "mlp.c_fc.weight", true},         {"fcb", "mlp.c_fc.bias", false},
    {"fcprojw", "mlp.c_proj.weight", true},   {"fcprojb", "mlp.c_proj.bias", false}};

// One tensor of the file, in GPT-2's naming without the prefix.
struct HfTensor {
  std::string hf_name;       // "h.0.attn.c_attn.weight"
  std::string trident_name;  // "h0.qkvw"
  bool transposed = false;
};

// Every tensor a GPT-2 of `layers` blocks has, in the module order (the order they are written).
std::vector<HfTensor> gpt2_tensors(int layers) {
  std::vector<HfTensor> out = {{"wte.weight", "wte", false}, {"wpe.weight", "wpe", false}};
  for (int l = 0; l < layers; ++l)
    for (const BlockName& b : kBlockNames)
      out.push_back(
          {fmt::format("h.{}.{}", l, b.hf), fmt::format("h{}.{}", l, b.trident), b.transposed});
  out.push_back({"ln_f.weight", "lnfw", false});
  out.push_back({"ln_f.bias", "lnfb", false});
  return out;
}

// The shape GPT-2 gives a tensor of model `cfg` (wte: the real vocabulary).
std::vector<int64_t> hf_shape(const GPTConfig& cfg, const HfTensor& t, const ParamInfo& p) {
  if (t.trident_name == "wte") return {cfg.vocab, cfg.channels};
  std::vector<int64_t> s(p.global_shape.begin(), p.global_shape.end());
  if (t.transposed) std::swap(s[0], s[1]);
  return s;
}

size_t dtype_bytes(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
  const auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

std::string shape_text(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

struct Entry {
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // into the data, after the header
};

// The parsed and checked header: entries by name as stored, where the data starts.
struct Header {
  std::string path;
  std::map<std::string, Entry> entries;
  json metadata = json::object();
  uint64_t data_start = 0, data_bytes = 0;

  // The entry for GPT-2 name `name`, stored with or without the prefix (null if neither).
  const Entry* find(const std::string& name, std::string* stored = nullptr) const {
    for (const std::string& n : {std::string(kPrefix) + name, name}) {
      const auto it = entries.find(n);
      if (it == entries.end()) continue;
      if (stored) *stored = n;
      return &it->second;
    }
    return nullptr;
  }
};

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  input_error("model.init_from: {}: {}", path, what);
}

uint64_t offset_value(const std::string& path, const std::string& name, const json& v) {
  if (!v.is_number_unsigned())
    bad(path, fmt::format("tensor {}: data_offsets must hold two non-negative integers", name));
  return v.get<uint64_t>();
}

Entry parse_entry(const std::string& path, const std::string& name, const json& v) {
  if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
    bad(path, fmt::format("tensor {}: needs \"dtype\", \"shape\" and \"data_offsets\"", name));
  Entry e;
  if (!v["dtype"].is_string()) bad(path, fmt::format("tensor {}: dtype is not a string", name));
  e.dtype = v["dtype"].get<std::string>();
  const size_t item = dtype_bytes(e.dtype);
  if (item == 0) bad(path, fmt::format("tensor {}: unknown dtype \"{}\"", name, e.dtype));
  if (!v["shape"].is_array()) bad(path, fmt::format("tensor {}: shape is not a list", name));
  // The byte count in 128 bits: a shape's product can pass 2^64.
  unsigned __int128 bytes = item;
  for (const json& d : v["shape"]) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t(1) << 40))
      bad(path, fmt::format("tensor {}: shape {} is not a list of sizes", name, v["shape"].dump()));
    e.shape.push_back(int64_t(d.get<uint64_t>()));
    bytes *= d.get<uint64_t>();
    if (bytes > (unsigned __int128)(UINT64_MAX))
      bad(path,
          fmt::format("tensor {}: shape {} is more than 2^64 bytes", name, v["shape"].dump()));
  }
  const json& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2)
    bad(path, fmt::format("tensor {}: data_offsets must be [begin, end]", name));
  e.begin = offset_value(path, name, off[0]);
  e.end = offset_value(path, name, off[1]);
  if (e.end < e.begin)
    bad(path, fmt::format("tensor {}: data_offsets [{}, {}] end before they begin", name, e.begin,
                          e.end));
  if (e.end - e.begin != uint64_t(bytes))
    bad(path, fmt::format("tensor {}: data_offsets [{}, {}] hold {} bytes, its shape {} of {} "
                          "needs {}",
                          name, e.begin, e.end, e.end - e.begin, shape_text(e.shape), e.dtype,
                          uint64_t(bytes)));
  return e;
}

Header read_header(const std::string& path) {
  Header h;
  h.path = path;
  std::ifstream f(path, std::ios::binary);
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (!f || ec)
    input_error("model.init_from: cannot open {}{}", path, ec ? ": " + ec.message() : "");
  unsigned char len[8] = {};
  f.read(reinterpret_cast<char*>(len), 8);
  if (size < 8 || f.gcount() != 8)
    bad(path, fmt::format("file is {} bytes, shorter than the 8-byte header length", size));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | len[i];
  if (n > size - 8)
    bad(path, fmt::format("header length {} runs past the end of the file ({} bytes)", n, size));
  if (n > kMaxHeaderBytes)
    bad(path,
        fmt::format("header length {} is over safetensors' limit of {} bytes", n, kMaxHeaderBytes));
  std::string text(size_t(n), '\0');
  f.read(text.data(), std::streamsize(n));
  if (uint64_t(f.gcount()) != n) bad(path, "read failed in the header");
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    bad(path, fmt::format("header is not valid JSON: {}", e.what()));
  }
  if (!j.is_object()) bad(path, "header is not a JSON object");
  h.data_start = 8 + n;
  h.data_bytes = size - h.data_start;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) bad(path, "__metadata__ is not an object");
      h.metadata = v;
      continue;
    }
    Entry e = parse_entry(path, name, v);
    if (e.end > h.data_bytes)
      bad(path, fmt::format("tensor {}: data_offsets [{}, {}] run past the end of the data "
                            "({} bytes after the header)",
                            name, e.begin, e.end, h.data_bytes));
    h.entries.emplace(name, std::move(e));
  }
  // As safetensors itself requires: the tensors tile the data, no overlap and no gap.
  std::vector<std::pair<uint64_t, const std::string*>> order;
  for (const auto& [name, e] : h.entries)
    if (e.end > e.begin) order.push_back({e.begin, &name});
  std::sort(order.begin(), order.end());
  uint64_t covered = 0;
  for (const auto& [begin, name] : order) {
    if (begin != covered)
      bad(path, fmt::format("tensor {}: data_offsets begin at {}, {} (bytes {}..{} {})", *name,
                            begin, begin < covered ? "inside the tensor before it" : "after a gap",
                            std::min(begin, covered), std::max(begin, covered),
                            begin < covered ? "overlap" : "belong to no tensor"));
    covered = h.entries.at(*name).end;
  }
  if (covered != h.data_bytes)
    bad(path, fmt::format("the tensors cover {} of the {} data bytes (the rest belongs to no "
                          "tensor)",
                          covered, h.data_bytes));
  return h;
}

// The positive integer a metadata or config.json value holds ("12" or 12), if any.
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

int head_count(const Header& h, int channels) {
  std::string source;
  std::optional<int> heads;
  if (h.metadata.contains("n_head")) {
    source = "__metadata__ n_head";
    heads = positive_int(h.metadata["n_head"]);
    if (!heads)
      bad(h.path, fmt::format("__metadata__ n_head {} is not a positive integer",
                              h.metadata["n_head"].dump()));
  } else {
    const fs::path config = fs::path(h.path).parent_path() / "config.json";
    std::error_code ec;
    if (!fs::exists(config, ec))
      bad(h.path, fmt::format("the number of attention heads is neither in __metadata__ "
                              "(\"n_head\") nor in a config.json beside it ({}): put the model's "
                              "config.json there",
                              config.string()));
    source = config.string() + " n_head";
    json c;
    try {
      std::ifstream cf(config);
      c = json::parse(cf);
    } catch (const json::exception& e) {
      input_error("model.init_from: {}: not valid JSON: {}", config.string(), e.what());
    }
    if (!c.is_object() || !c.contains("n_head") || !(heads = positive_int(c["n_head"])))
      input_error("model.init_from: {}: no positive integer \"n_head\"", config.string());
  }
  if (channels % *heads != 0)
    bad(h.path,
        fmt::format("{} = {} does not divide the embedding width {}", source, *heads, channels));
  return *heads;
}

// The names the reader knows besides the GPT-2 tensors: buffers and the tied head.
bool ignored_name(const std::string& name) {
  if (name == "lm_head.weight") return true;
  const std::string tail[] = {".attn.bias", ".attn.masked_bias"};
  for (const std::string& t : tail)
    if (name.size() > t.size() && name.starts_with("h.") &&
        name.compare(name.size() - t.size(), t.size(), t) == 0)
      return true;
  return false;
}

// The layer count the names imply: one more than the largest h.{l} (names are checked later).
int layer_count(const Header& h) {
  int layers = 0;
  for (const auto& [stored, e] : h.entries) {
    const std::string name = stored.starts_with(kPrefix) ? stored.substr(strlen(kPrefix)) : stored;
    if (!name.starts_with("h.")) continue;
    const size_t dot = name.find('.', 2);
    const std::string digits = name.substr(2, dot == std::string::npos ? 0 : dot - 2);
    if (digits.empty() || digits.size() > 6 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      bad(h.path, fmt::format("tensor {}: not a GPT-2 tensor name (h.<layer>.<name>)", stored));
    layers = std::max(layers, std::stoi(digits) + 1);
  }
  return layers;
}

// Float widening for F16 and BF16 (exact: every half value is a float).
float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant · 2^-24
    const float f = std::ldexp(float(mant), -24);
    return sign ? -f : f;
  }
  const uint32_t bits =
      exp == 0x1f ? sign | 0x7f800000u | mant << 13 : sign | (exp + 112) << 23 | mant << 13;
  return std::bit_cast<float>(bits);
}

// Reads entry `e` as fp32 into `out` (numel floats).
void read_floats(std::ifstream& f, const Header& h, const std::string& name, const Entry& e,
                 std::vector<float>& out) {
  const size_t item = dtype_bytes(e.dtype), count = (e.end - e.begin) / item;
  if (e.dtype != "F32" && e.dtype != "F16" && e.dtype != "BF16")
    bad(h.path, fmt::format("tensor {}: dtype {} not supported (F32, or F16/BF16, widened)", name,
                            e.dtype));
  std::vector<unsigned char> raw(size_t(e.end - e.begin));
  f.seekg(std::streamoff(h.data_start + e.begin));
  f.read(reinterpret_cast<char*>(raw.data()), std::streamsize(raw.size()));
  if (!f) bad(h.path, fmt::format("tensor {}: read failed", name));
  out.resize(count);
  if (e.dtype == "F32") {
    std::memcpy(out.data(), raw.data(), raw.size());  // little-endian, as the host
    return;
  }
  for (size_t i = 0; i < count; ++i) {
    const uint16_t v = uint16_t(raw[2 * i] | raw[2 * i + 1] << 8);
    out[i] = e.dtype == "BF16" ? std::bit_cast<float>(uint32_t(v) << 16) : half_to_float(v);
  }
}

// [rows, cols] row-major → [cols, rows] row-major.
std::vector<float> transpose(const std::vector<float>& a, size_t rows, size_t cols) {
  std::vector<float> t(a.size());
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c) t[c * rows + r] = a[r * cols + c];
  return t;
}

// The whole GPT-2 check of a parsed header: the shape it implies, every tensor present with its
// shape, nothing unknown. Returns the config (padded vocabulary for one rank).
GPTConfig check_gpt2(const Header& h) {
  std::string stored;
  const Entry* wte = h.find("wte.weight", &stored);
  if (!wte)
    bad(h.path, "no tensor wte.weight (nor transformer.wte.weight): not a GPT-2 state dict");
  if (wte->shape.size() != 2 || wte->shape[0] < 2 || wte->shape[1] < 1 ||
      wte->shape[0] > (1 << 30) || wte->shape[1] > (1 << 20))
    bad(h.path,
        fmt::format("tensor {}: shape {} is not [vocab, d_model]", stored, shape_text(wte->shape)));
  const Entry* wpe = h.find("wpe.weight", &stored);
  if (!wpe) bad(h.path, "no tensor wpe.weight (nor transformer.wpe.weight)");
  if (wpe->shape.size() != 2 || wpe->shape[0] < 1 || wpe->shape[0] > (1 << 24))
    bad(h.path, fmt::format("tensor {}: shape {} is not [positions, d_model]", stored,
                            shape_text(wpe->shape)));
  GPTConfig cfg;
  cfg.vocab = int(wte->shape[0]);
  cfg.channels = int(wte->shape[1]);
  cfg.padded_vocab = GPTConfig::pad_vocab(cfg.vocab);
  cfg.max_seq_len = int(wpe->shape[0]);
  cfg.layers = layer_count(h);
  if (cfg.layers < 1) bad(h.path, "no blocks (tensors h.0.*)");
  // Every block tensor is looked for before any per-layer list is built: a name with a huge
  // layer number and nothing else stops at the first missing tensor.
  for (int l = 0; l < cfg.layers; ++l)
    for (const BlockName& b : kBlockNames)
      if (const std::string name = fmt::format("h.{}.{}", l, b.hf); !h.find(name))
        bad(h.path, fmt::format("no tensor {} (nor {}{}): the file's other tensors make a GPT-2 "
                                "of {} layers",
                                name, kPrefix, name, cfg.layers));
  if (!h.find("ln_f.weight") || !h.find("ln_f.bias"))
    bad(h.path, fmt::format("no tensor ln_f.weight or ln_f.bias (nor with {})", kPrefix));
  const std::vector<HfTensor> tensors = gpt2_tensors(cfg.layers);
  std::map<std::string, const HfTensor*> expected;
  for (const HfTensor& t : tensors) expected[t.hf_name] = &t;
  std::map<std::string, std::string> seen;  // GPT-2 name → stored name
  for (const auto& [name, e] : h.entries) {
    const std::string bare = name.starts_with(kPrefix) ? name.substr(strlen(kPrefix)) : name;
    if (!expected.count(bare) && !ignored_name(bare))
      bad(h.path, fmt::format("tensor {}: not a GPT-2 parameter trident knows", name));
    if (!seen.emplace(bare, name).second)
      bad(h.path,
          fmt::format("tensors {} and {}: the same GPT-2 parameter twice", seen[bare], name));
  }
  cfg.heads = head_count(h, cfg.channels);
  std::map<std::string, const ParamInfo*> by_name;
  const std::vector<ParamInfo> layout = gpt_param_layout(cfg);
  for (const ParamInfo& p : layout) by_name[p.name] = &p;
  for (const HfTensor& t : tensors) {
    const Entry* e = h.find(t.hf_name, &stored);
    const std::vector<int64_t> want = hf_shape(cfg, t, *by_name.at(t.trident_name));
    if (e->shape != want)
      bad(h.path,
          fmt::format("tensor {}: shape {}, a GPT-2 with d_model {}, vocab {}, {} "
                      "positions needs {}{}",
                      stored, shape_text(e->shape), cfg.channels, cfg.vocab, cfg.max_seq_len,
                      shape_text(want), t.transposed ? " (Conv1D: [in, out])" : ""));
  }
  if (const Entry* head = h.find("lm_head.weight", &stored); head && head->shape != wte->shape)
    bad(h.path, fmt::format("tensor {}: shape {}, but trident ties the LM head to wte {}", stored,
                            shape_text(head->shape), shape_text(wte->shape)));
  return cfg;
}

}  // namespace

bool is_safetensors(const std::string& path) {
  if (fs::path(path).extension() == ".safetensors") return true;
  // By content: a JSON object right after a header length that fits the file (an llm.c
  // checkpoint's first 8 bytes, magic and version, make a length of ~1.3e10).
  std::ifstream f(path, std::ios::binary);
  unsigned char head[9] = {};
  f.read(reinterpret_cast<char*>(head), 9);
  if (f.gcount() != 9 || head[8] != '{') return false;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | head[i];
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  return !ec && n >= 2 && n <= size - 8;
}

GPTConfig read_safetensors_config(const std::string& path) { return check_gpt2(read_header(path)); }

void load_safetensors_weights(GPT& model, const std::string& path) {
  const Header h = read_header(path);
  const GPTConfig file_cfg = check_gpt2(h);
  const GPTConfig& cfg = model.config();
  if (file_cfg.layers != cfg.layers || file_cfg.channels != cfg.channels ||
      file_cfg.vocab != cfg.vocab || file_cfg.max_seq_len != cfg.max_seq_len ||
      file_cfg.heads != cfg.heads)
    bad(path, fmt::format("a GPT-2 of layers={} d_model={} heads={} vocab={} max_seq_len={}, "
                          "the model has layers={} d_model={} heads={} vocab={} max_seq_len={}",
                          file_cfg.layers, file_cfg.channels, file_cfg.heads, file_cfg.vocab,
                          file_cfg.max_seq_len, cfg.layers, cfg.channels, cfg.heads, cfg.vocab,
                          cfg.max_seq_len));
  std::map<std::string, const HfTensor*> by_trident;
  const std::vector<HfTensor> tensors = gpt2_tensors(cfg.layers);
  for (const HfTensor& t : tensors) by_trident[t.trident_name] = &t;
  std::ifstream f(path, std::ios::binary);
  HostView<float> host(model.backend(), model.params(), model.num_params(), /*load=*/false);
  std::vector<float> file, wte_file;
  // What this rank and stage holds, each from the global tensor (Note [Tensor-parallel shards]).
  for (const ParamInfo& p : model.params_info()) {
    const HfTensor& t = *by_trident.at(p.name);
    std::string stored;
    const Entry& e = *h.find(t.hf_name, &stored);
    read_floats(f, h, stored, e, file);
    if (t.transposed) file = transpose(file, size_t(e.shape[0]), size_t(e.shape[1]));
    const size_t cols = p.global_shape.size() > 1 ? size_t(p.global_shape[1]) : 1;
    const size_t rows = size_t(e.shape[t.transposed ? 1 : 0]);  // wte: the real vocabulary
    float* dst = host.data() + p.offset;
    for (size_t i = 0; i < p.count; ++i) {
      const size_t g = p.global_index(i);
      dst[i] = g / cols < rows ? file[g] : 0.0f;
    }
    if (p.name == "wte") wte_file = file;
  }
  std::string stored;
  if (const Entry* head = h.find("lm_head.weight", &stored); head && !wte_file.empty()) {
    read_floats(f, h, stored, *head, file);
    if (std::memcmp(file.data(), wte_file.data(), file.size() * sizeof(float)) != 0)
      bad(path, fmt::format("tensor {} differs from wte.weight: trident ties the LM head to the "
                            "token embedding",
                            stored));
  }
  host.commit();
}

size_t save_safetensors_weights(GPT& model, const std::string& path) {
  const GPTConfig& cfg = model.config();
  TRIDENT_CHECK(model.tensor_parallel().size == 1 && model.stage().has_embedding &&
                    model.stage().has_head && model.stage().first_layer == 0 &&
                    model.params_info().size() == gpt_param_layout(cfg).size(),
                "save_safetensors_weights needs the whole model on this rank");
  const std::vector<HfTensor> tensors = gpt2_tensors(cfg.layers);
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}, {"n_head", std::to_string(cfg.heads)}};
  uint64_t offset = 0;
  for (const HfTensor& t : tensors) {
    const std::vector<int64_t> shape = hf_shape(cfg, t, model.param(t.trident_name));
    uint64_t bytes = sizeof(float);
    for (int64_t d : shape) bytes *= uint64_t(d);
    header[kPrefix + t.hf_name] = {
        {"dtype", "F32"}, {"shape", shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) input_error("export: cannot write {}: {}", path, std::strerror(errno));
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
  f.write(reinterpret_cast<const char*>(len), 8);
  f.write(text.data(), std::streamsize(text.size()));
  HostView<float> host(model.backend(), model.params(), model.num_params(), /*load=*/true);
  for (const HfTensor& t : tensors) {
    const ParamInfo& p = model.param(t.trident_name);
    const float* src = host.data() + p.offset;
    if (t.transposed) {
      const std::vector<float> out =
          transpose(std::vector<float>(src, src + p.count), size_t(p.shape[0]), size_t(p.shape[1]));
      f.write(reinterpret_cast<const char*>(out.data()), std::streamsize(out.size() * 4));
    } else {
      const size_t count = p.name == "wte" ? size_t(cfg.vocab) * cfg.channels : p.count;
      f.write(reinterpret_cast<const char*>(src), std::streamsize(count * 4));
    }
  }
  f.flush();
  if (!f) input_error("export: write failed: {}: {}", path, std::strerror(errno));
  return 8 + text.size() + offset;
}

}  // namespace trident
