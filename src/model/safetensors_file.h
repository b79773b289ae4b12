// The safetensors container (model/safetensors.cpp), shared by the Hugging Face readers and
// writers (model/hf_checkpoint.cpp, hf_config.cpp, hf_names.cpp). Private to the model part.
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace trident::st {

struct Entry {
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // into the data, after the header
};

// A parsed and checked header: every entry by its stored name, where the data starts.
struct File {
  std::string path;
  std::map<std::string, Entry> entries;
  nlohmann::json metadata = nlohmann::json::object();
  uint64_t data_start = 0, data_bytes = 0;
};

// Checks the whole header against the file (lengths, JSON, dtypes, shapes against offsets,
// tensors tiling the data); input_error "model.init_from: PATH: ..." on the first problem.
File read_header(const std::string& path);

// Entry `e` of `file` (opened as `f`) as fp32: F32 as is, F16 and BF16 widened exactly;
// input_error naming the tensor for any other dtype.
void read_floats(std::ifstream& f, const File& file, const std::string& name, const Entry& e,
                 std::vector<float>& out);

// A safetensors file: by the .safetensors extension, or by content (a JSON object right after
// a header length that fits the file).
bool is_file(const std::string& path);

std::string shape_text(const std::vector<int64_t>& shape);

// Writes F32 tensors `names` with `shapes`, in that order, each produced by `data(i)` when it is
// written (so only one is in memory at a time); the data starts 8-byte aligned. Returns the
// file's size; input_error "export: ..." when it cannot be written.
size_t write_file(const std::string& path, const nlohmann::json& metadata,
                  const std::vector<std::string>& names,
                  const std::vector<std::vector<int64_t>>& shapes,
                  const std::function<std::vector<float>(size_t)>& data);

}  // namespace trident::st
