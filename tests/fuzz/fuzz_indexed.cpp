// Megatron indexed datasets (Note [Megatron indexed dataset], src/io/indexed_dataset.cpp). The
// first input byte picks the model's vocab (2..257), the next two (big-endian) how many of the
// remaining bytes are the .idx; the rest is the .bin. A dataset that opens must read back
// whole, every token below the vocab, and sample like any other.
#include <algorithm>
#include <fstream>

#include "fuzz_dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trident;
  if (size < 3) return 0;
  const int vocab = 2 + data[0];
  const size_t idx_bytes = std::min<size_t>((size_t(data[1]) << 8) | data[2], size - 3);
  const std::string& idx = fuzz::write_input(data + 3, idx_bytes, ".idx");
  {  // beside it (write_input keeps one path per process)
    const std::string bin = idx.substr(0, idx.size() - 4) + ".bin";
    std::ofstream f(bin, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data + 3 + idx_bytes),
            static_cast<std::streamsize>(size - 3 - idx_bytes));
    if (!f) fuzz::finding("cannot write", bin);
  }
  std::unique_ptr<TokenDataset> ds;
  if (!fuzz::accepts([&] { ds = TokenDataset::open(idx, vocab, "data.train"); })) return 0;
  fuzz::check_reads_back(*ds, vocab, /*shuffle=*/data[0] & 1, /*seed=*/size);
  return 0;
}
