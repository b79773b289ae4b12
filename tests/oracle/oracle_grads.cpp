// oracle_grads: trident's side of the PyTorch oracle (tests/oracle/test_torch_oracle.py).
// Loads an llm.c GPT-2 checkpoint with trident's own loader, runs one forward and backward on
// the CPU backend over the given tokens, and writes what the oracle compares:
//   OUT/loss.txt        the mean cross-entropy loss (nats per token), printed to 9 digits
//   OUT/<name>.npy      every parameter's gradient (fp32, trident's name and global shape:
//                       "wte" [Vp,C], "h1.qkvw" [3C,C], ...), and the same for the loaded
//                       weights under OUT/weights/<name>.npy
// Usage: oracle_grads CHECKPOINT TOKENS B T OUT, TOKENS being raw little-endian int32: the B·T
// inputs, then the B·T targets.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "npy.h"
#include "trident/backend.h"
#include "trident/check.h"
#include "trident/model.h"

using trident::testing::write_npy;

int main(int argc, char** argv) {
  if (argc != 6) {
    std::cerr << "usage: oracle_grads CHECKPOINT TOKENS B T OUT\n";
    return 2;
  }
  try {
    const std::string checkpoint = argv[1], tokens_path = argv[2];
    const int B = std::stoi(argv[3]), T = std::stoi(argv[4]);
    const std::filesystem::path out = argv[5];
    const size_t N = size_t(B) * T;

    std::vector<int32_t> tokens(2 * N);
    std::ifstream in(tokens_path, std::ios::binary);
    in.read(reinterpret_cast<char*>(tokens.data()), std::streamsize(tokens.size() * 4));
    TRIDENT_CHECK(in.gcount() == std::streamsize(tokens.size() * 4), "{}: expected {} int32 tokens",
                  tokens_path, tokens.size());

    const trident::GPTConfig cfg = trident::read_llmc_config(checkpoint);
    auto be = trident::make_cpu_backend(1);
    trident::GPT model(cfg, *be, B, T);
    trident::load_llmc_weights(model, checkpoint);
    model.zero_grads();
    const float loss = model.forward(tokens.data(), tokens.data() + N, B, T);
    model.backward(1.0f);

    std::filesystem::create_directories(out / "weights");
    for (const trident::ParamInfo& p : model.params_info()) {
      write_npy(out / (p.name + ".npy"), model.grads() + p.offset, p.shape);
      write_npy(out / "weights" / (p.name + ".npy"), model.params() + p.offset, p.shape);
    }
    std::FILE* f = std::fopen((out / "loss.txt").c_str(), "w");
    TRIDENT_CHECK(f != nullptr, "cannot write {}", (out / "loss.txt").string());
    std::fprintf(f, "%.9g\n", double(loss));
    std::fclose(f);
    return 0;
  } catch (const trident::Error& e) {
    std::cerr << "oracle_grads: " << e.what() << "\n";
    return int(e.code());
  } catch (const std::exception& e) {
    std::cerr << "oracle_grads: " << e.what() << "\n";
    return 1;
  }
}
