// The safetensors container: reading and checking a header, reading a tensor as fp32 (F16 and
// BF16 widened), writing F32 tensors. What the tensors mean is model/hf_checkpoint.cpp's.
//
// Note [safetensors container]
// A file is an 8-byte little-endian header length N, N bytes of JSON {name: {"dtype", "shape",
// "data_offsets": [begin, end]}, "__metadata__": {...}}, then the raw little-endian tensor
// bytes, offsets counted from the first byte after the header. The whole header is checked
// against the file before any tensor is read (as safetensors itself does: the tensors tile the
// data), so a bad file is one input_error naming the file and the field, never a crash.
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/safetensors_file.h"
#include "trident/check.h"
#include "trident/model.h"

namespace trident {
namespace st {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // safetensors' own limit on N

size_t dtype_bytes(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
  const auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

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

File read_header_checked(const std::string& path) {
  File h;
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
void read_floats_of(std::ifstream& f, const File& h, const std::string& name, const Entry& e,
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

}  // namespace

std::string shape_text(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

File read_header(const std::string& path) { return read_header_checked(path); }

void read_floats(std::ifstream& f, const File& file, const std::string& name, const Entry& e,
                 std::vector<float>& out) {
  read_floats_of(f, file, name, e, out);
}

size_t write_file(const std::string& path, const json& metadata,
                  const std::vector<std::string>& names,
                  const std::vector<std::vector<int64_t>>& shapes,
                  const std::function<std::vector<float>(size_t)>& data) {
  json header = json::object();
  header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    uint64_t bytes = sizeof(float);
    for (int64_t d : shapes[i]) bytes *= uint64_t(d);
    header[names[i]] = {
        {"dtype", "F32"}, {"shape", shapes[i]}, {"data_offsets", {offset, offset + bytes}}};
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
  for (size_t i = 0; i < names.size(); ++i) {
    const std::vector<float> t = data(i);
    uint64_t count = 1;
    for (int64_t d : shapes[i]) count *= uint64_t(d);
    TRIDENT_CHECK(t.size() == count, "tensor {}: {} values for shape {}", names[i], t.size(),
                  shape_text(shapes[i]));
    f.write(reinterpret_cast<const char*>(t.data()), std::streamsize(t.size() * sizeof(float)));
  }
  f.flush();
  if (!f) input_error("export: write failed: {}: {}", path, std::strerror(errno));
  return 8 + text.size() + offset;
}

// By the .safetensors extension, or a JSON object after a length that fits the file.
bool is_file(const std::string& path) {
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

}  // namespace st

}  // namespace trident
