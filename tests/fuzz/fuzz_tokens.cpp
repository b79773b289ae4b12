// Token files: trident's 64-byte header and llm.c's 1024-byte shard header, then the payload
// (include/trident/data.h). The first input byte picks the model's vocab (2..257, so both
// "token >= vocab" refusals are reachable); the rest is the file. A file that opens must read
// back whole: every token below the vocab, and every sample window of a short sequence.
#include "fuzz_dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trident;
  if (size < 1) return 0;
  const int vocab = 2 + data[0];
  const std::string& path = fuzz::write_input(data + 1, size - 1, ".bin");
  std::unique_ptr<TokenDataset> ds;
  if (!fuzz::accepts([&] { ds = TokenDataset::open(path, vocab, "data.train"); })) return 0;
  fuzz::check_reads_back(*ds, vocab, /*shuffle=*/data[0] & 1, /*seed=*/size);
  return 0;
}
