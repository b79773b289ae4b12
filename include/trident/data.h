// Token datasets and the sample order.
//
// Three on-disk formats (docs/data-format.md describes them). A Megatron-LM / GPT-NeoX indexed
// dataset (PREFIX.idx + PREFIX.bin, named by PREFIX, PREFIX.bin or PREFIX.idx:
// Note [Naming an indexed dataset]) is read as the tokens of its sequences in order
// (Note [Megatron indexed dataset] in src/io/indexed_dataset.cpp). Other files are detected by
// their first bytes:
//   - trident tokens: 64-byte header "TRIDTOK\0", u32 version=1, u32 bytes_per_token (2|4),
//     u64 n_tokens, u32 vocab_size, u32 tokenizer (0 byte-level, 1 GPT-2 BPE, 2 other),
//     zeros to byte 64; then n_tokens little-endian unsigned tokens;
//   - llm.c shards: int32[256] header (magic 20240520, version 1, n_tokens), then uint16 tokens.
// Opening checks the magic, the version, the exact file size, that there are at least 2 tokens
// and that every token < vocab, and throws trident::Error(kBadInput) naming the `what` label,
// the file and what is wrong. The payload is memory-mapped read-only; nothing is copied.
//
// Sample j is the window of T+1 tokens starting at token j*T (inputs = first T, targets = last T),
// so S = (n_tokens - 1) / T samples tile the file and neighbouring samples share one token.
// Samples are addressed by a global position g (the g-th sample the run consumes): without
// shuffling g maps to sample g mod S (file order, llm.c's order); with shuffling epoch e = g / S
// uses its own permutation, a Fisher-Yates shuffle driven by mt19937_64 seeded from (seed, e).
// A step's set of samples therefore depends only on the global positions it consumes (the step
// and the global batch), never on how many ranks or readers share them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace trident {

class TokenDataset {
 public:
  // `what` names the dataset in messages (e.g. "data.train"); `vocab` is the model's real vocab.
  static std::unique_ptr<TokenDataset> open(const std::string& path, int vocab,
                                            const std::string& what);
  virtual ~TokenDataset() = default;
  virtual size_t n_tokens() const = 0;
  virtual int32_t token(size_t i) const = 0;
  virtual const std::string& path() const = 0;
  // Copies tokens [first, first + count) into out (widened to int32). The default calls token().
  virtual void read(size_t first, size_t count, int32_t* out) const;
  // One line for the run log: path and token count (files add format and token width).
  virtual std::string describe() const;
};

// Maps global sample positions to samples and copies their windows. Not thread-safe: the
// current epoch's permutation is cached in the object (use one SampleOrder per reader).
class SampleOrder {
 public:
  SampleOrder(const TokenDataset& data, int seq_len, bool shuffle, uint64_t seed);
  size_t num_samples() const { return num_samples_; }
  // The sample index (0..S-1) at global position g.
  size_t sample_at(uint64_t g) const;
  // Fills inputs/targets [B*T] with the samples at global positions g0 .. g0+B-1. With cp > 1
  // only context-parallel rank cp_rank's tokens, [B*T/cp]: of each sample's 2·cp chunks, chunk
  // cp_rank then chunk 2·cp − 1 − cp_rank (Note [Context parallelism] in
  // src/model/cp_attention.h).
  void fill(uint64_t g0, int B, int32_t* inputs, int32_t* targets, int cp = 1,
            int cp_rank = 0) const;

 private:
  const TokenDataset& data_;
  int seq_len_;
  bool shuffle_;
  uint64_t seed_;
  size_t num_samples_;
  mutable uint64_t cached_epoch_ = UINT64_MAX;
  mutable std::vector<uint64_t> perm_;
};

// Writes a trident token file (used by tools and tests): 2-byte tokens when vocab_size <= 65536,
// else 4-byte. Throws kBadInput if a token is outside [0, vocab_size) or the file can't be written.
void write_token_file(const std::string& path, const std::vector<int32_t>& tokens, int vocab_size,
                      int tokenizer);

}  // namespace trident
