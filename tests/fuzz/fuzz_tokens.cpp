// Token files: trident's 64-byte header and llm.c's 1024-byte shard header, then the payload
// (include/trident/data.h). The first input byte picks the model's vocab (2..257, so both
// "token >= vocab" refusals are reachable); the rest is the file. A file that opens must read
// back whole: every token below the vocab, and every sample window of a short sequence.
#include <vector>

#include "fuzz_support.h"
#include "trident/data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trident;
  if (size < 1) return 0;
  const int vocab = 2 + data[0];
  const std::string& path = fuzz::write_input(data + 1, size - 1, ".bin");
  std::unique_ptr<TokenDataset> ds;
  if (!fuzz::accepts([&] { ds = TokenDataset::open(path, vocab, "data.train"); })) return 0;
  std::vector<int32_t> tokens(ds->n_tokens());
  ds->read(0, tokens.size(), tokens.data());
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab)
      fuzz::finding("an accepted file has a token outside the vocab", ds->describe());
  const int seq_len = 1 + static_cast<int>(tokens.size() % 7);
  if (tokens.size() >= static_cast<size_t>(seq_len) + 1) {
    SampleOrder order(*ds, seq_len, /*shuffle=*/data[0] & 1, /*seed=*/size);
    std::vector<int32_t> in(seq_len), target(seq_len);
    for (size_t g = 0; g < 2 * order.num_samples(); ++g) order.fill(g, 1, in.data(), target.data());
  }
  (void)ds->describe();
  return 0;
}
