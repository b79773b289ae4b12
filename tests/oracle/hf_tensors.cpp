// hf_tensors: what trident's Hugging Face reader takes from a checkpoint, for
// tests/oracle/test_hf_checkpoints.py: read_hf_global_tensors (the loader's conversion, without
// a model) writes
//   OUT/config.json   the GPTConfig it took: every field, and describe_block's line
//   OUT/<name>.f32    every trident global tensor (row-major, little-endian fp32, the
//                     vocabulary padded to a multiple of 128, padded rows zero)
// and, given EXPORT, writes those tensors back with export's writer (save_hf_global_tensors:
// EXPORT/model.safetensors and config.json), the writer checked without a model.
// Usage: hf_tensors CHECKPOINT OUT [EXPORT]. Exits 2 with the reader's message on a bad
// checkpoint.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "trident/check.h"
#include "trident/model.h"

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::cerr << "usage: hf_tensors CHECKPOINT OUT [EXPORT]\n";
    return 2;
  }
  try {
    trident::GPTConfig c;
    const auto tensors = trident::read_hf_global_tensors(argv[1], &c);
    const std::filesystem::path out = argv[2];
    std::filesystem::create_directories(out);
    const nlohmann::json j = {{"family", trident::family_name(c.family)},
                              {"layers", c.layers},
                              {"channels", c.channels},
                              {"heads", c.heads},
                              {"kv_heads", c.kv_head_count()},
                              {"vocab", c.vocab},
                              {"padded_vocab", c.padded_vocab},
                              {"max_seq_len", c.max_seq_len},
                              {"norm", trident::norm_name(c.norm)},
                              {"norm_eps", c.norm_eps},
                              {"position", trident::position_name(c.position)},
                              {"rope_base", c.rope_base},
                              {"rotary_pct", c.rotary_pct},
                              {"rotary_dims", c.rotary_dims()},
                              {"activation", trident::activation_name(c.activation)},
                              {"mlp_hidden", c.hidden()},
                              {"bias", c.bias},
                              {"tied_head", c.tied_head},
                              {"parallel_residual", c.parallel_residual},
                              {"experts", c.moe.experts},
                              {"top_k", c.has_moe() ? c.moe.top_k : 0},
                              {"ffn_width", c.has_moe() ? c.expert_width() : 0},
                              {"moe_layers", c.moe_layers()},
                              {"aux_loss", trident::moe_aux_name(c.moe.aux_loss)},
                              {"describe", trident::describe_block(c)}};
    std::ofstream(out / "config.json") << j.dump(1) << "\n";
    for (const auto& [name, data] : tensors) {
      std::ofstream f(out / (name + ".f32"), std::ios::binary);
      f.write(reinterpret_cast<const char*>(data.data()),
              std::streamsize(data.size() * sizeof(float)));
      TRIDENT_CHECK(bool(f), "write of {} failed", name);
    }
    if (argc == 4) {
      std::filesystem::create_directories(argv[3]);
      const auto file = std::filesystem::path(argv[3]) / "model.safetensors";
      trident::save_hf_global_tensors(c, tensors, file.string(), /*with_config=*/true);
    }
    return 0;
  } catch (const trident::Error& e) {
    std::cerr << e.what() << "\n";
    return int(e.code());
  }
}
