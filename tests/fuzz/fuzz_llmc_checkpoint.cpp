// llm.c GPT-2 checkpoint headers (model.init_from): int32[256], then fp32 tensors whose sizes
// the header's shape fixes. read_llmc_config must refuse any header whose shape does not match
// the file, without building a model for it; a header it accepts must describe a model whose
// tensors fill the file exactly.
#include <filesystem>

#include "fuzz_support.h"
#include "trident/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trident;
  const std::string& path = fuzz::write_input(data, size, ".llmc");
  GPTConfig cfg;
  if (!fuzz::accepts([&] { cfg = read_llmc_config(path); })) return 0;
  // A safetensors header (model/safetensors.cpp) is checked against its own tensor table.
  if (is_safetensors(path)) return 0;
  size_t bytes = 1024;
  for (const ParamInfo& p : gpt_param_layout(cfg)) bytes += p.count * sizeof(float);
  if (bytes != size) fuzz::finding("an accepted header does not match the file size", path);
  return 0;
}
