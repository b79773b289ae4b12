// Token files: format detection, validation and the memory-mapped reader; write_token_file.
// The byte layouts are described in include/trident/data.h and docs/data-format.md.
#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "token_files.h"
#include "trident/check.h"
#include "trident/data.h"

namespace trident {

static_assert(std::endian::native == std::endian::little,
              "token files are little-endian and are read in place");

namespace {

using io_detail::MappedFile;

constexpr char kTridentMagic[8] = {'T', 'R', 'I', 'D', 'T', 'O', 'K', '\0'};
constexpr uint32_t kTridentVersion = 1;
constexpr size_t kTridentHeaderBytes = 64;

constexpr int32_t kLlmcMagic = 20240520;
constexpr int32_t kLlmcVersion = 1;  // uint16 tokens (GPT-2); llm.c's version 2 is not read
constexpr size_t kLlmcHeaderBytes = 256 * sizeof(int32_t);

template <typename T>
T load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void store(unsigned char* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

const char* tokenizer_name(uint32_t id) {
  switch (id) {
    case 0: return "byte-level";
    case 1: return "GPT-2 BPE";
    case 2: return "other";
    default: return "unknown";
  }
}

// What a header says about the payload.
struct TokenLayout {
  const char* format;  // "trident" | "llm.c"
  size_t header_bytes;
  uint32_t bytes_per_token;
  uint64_t n_tokens;
  uint32_t file_vocab;  // 0 when the format doesn't record it
  uint32_t tokenizer;
};

// The file's first bytes, or input_error when it is shorter than a `kind` header of `bytes`.
const unsigned char* header_bytes(const MappedFile& f, size_t bytes, const char* kind,
                                  const std::string& path, const std::string& what) {
  if (f.size() < bytes)
    input_error("{}: {}: file is {} bytes, shorter than the {}-byte {} header", what, path,
                f.size(), bytes, kind);
  return f.bytes();
}

TokenLayout parse_trident_header(const MappedFile& f, const std::string& path,
                                 const std::string& what) {
  const unsigned char* h = header_bytes(f, kTridentHeaderBytes, "trident", path, what);
  TokenLayout l{"trident",
                kTridentHeaderBytes,
                load<uint32_t>(h + 12),
                load<uint64_t>(h + 16),
                load<uint32_t>(h + 24),
                load<uint32_t>(h + 28)};
  uint32_t version = load<uint32_t>(h + 8);
  if (version != kTridentVersion)
    input_error("{}: {}: trident token file version {} is not supported (expected {})", what, path,
                version, kTridentVersion);
  if (l.bytes_per_token != 2 && l.bytes_per_token != 4)
    input_error("{}: {}: bytes_per_token is {}, must be 2 or 4", what, path, l.bytes_per_token);
  if (l.tokenizer > 2)
    input_error("{}: {}: tokenizer id {} is unknown (0 byte-level, 1 GPT-2 BPE, 2 other)", what,
                path, l.tokenizer);
  for (size_t i = 32; i < kTridentHeaderBytes; ++i)
    if (h[i] != 0)
      input_error("{}: {}: header byte {} is {}, reserved bytes 32..63 must be zero", what, path, i,
                  h[i]);
  return l;
}

TokenLayout parse_llmc_header(const MappedFile& f, const std::string& path,
                              const std::string& what) {
  const unsigned char* h = header_bytes(f, kLlmcHeaderBytes, "llm.c shard", path, what);
  int32_t version = load<int32_t>(h + 4);
  int32_t n = load<int32_t>(h + 8);
  if (version != kLlmcVersion)
    input_error("{}: {}: llm.c shard version {} is not supported (expected {}: uint16 tokens)",
                what, path, version, kLlmcVersion);
  if (n < 0) input_error("{}: {}: llm.c header says {} tokens", what, path, n);
  return TokenLayout{"llm.c", kLlmcHeaderBytes, 2, static_cast<uint64_t>(n), 0, 1};
}

TokenLayout parse_header(const MappedFile& f, const std::string& path, const std::string& what) {
  if (f.size() >= sizeof(kTridentMagic) &&
      std::memcmp(f.bytes(), kTridentMagic, sizeof(kTridentMagic)) == 0)
    return parse_trident_header(f, path, what);
  if (f.size() >= sizeof(int32_t) && load<int32_t>(f.bytes()) == kLlmcMagic)
    return parse_llmc_header(f, path, what);
  if (f.size() < sizeof(kTridentMagic))
    input_error("{}: {}: file is {} bytes, too short for any token file header", what, path,
                f.size());
  std::string first;
  for (size_t i = 0; i < sizeof(kTridentMagic); ++i) first += fmt::format("{:02x}", f.bytes()[i]);
  input_error("{}: {}: bad magic (first bytes {}): neither a trident token file (\"TRIDTOK\\0\") "
              "nor an llm.c shard (int32 {})",
              what, path, first, kLlmcMagic);
}

void check_size(const TokenLayout& l, const MappedFile& f, const std::string& path,
                const std::string& what) {
  uint64_t max_tokens = (UINT64_MAX - l.header_bytes) / l.bytes_per_token;
  if (l.n_tokens > max_tokens)
    input_error("{}: {}: header says {} tokens, more than any file can hold", what, path,
                l.n_tokens);
  uint64_t expected = l.header_bytes + l.n_tokens * l.bytes_per_token;
  if (f.size() != expected)
    input_error("{}: {}: file is {} bytes, expected {} ({}-byte {} header + {} tokens x {} "
                "bytes){}",
                what, path, f.size(), expected, l.header_bytes, l.format, l.n_tokens,
                l.bytes_per_token, f.size() < expected ? ": truncated" : ": trailing bytes");
  if (l.n_tokens < 2)
    input_error("{}: {}: has {} tokens, at least 2 are needed (one input and its target)", what,
                path, l.n_tokens);
}

// Largest token; the loop is a plain max-reduction so the compiler vectorises it.
template <typename T>
uint32_t max_token(const T* p, size_t n) {
  T m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, p[i]);
  return m;
}

template <typename T>
size_t first_at_least(const T* p, size_t n, uint64_t limit) {
  size_t i = 0;
  while (i < n && p[i] < limit) ++i;
  return i;
}

template <typename T>
class MappedTokens final : public TokenDataset {
 public:
  MappedTokens(std::string path, std::unique_ptr<MappedFile> file, TokenLayout layout)
      : path_(std::move(path)), file_(std::move(file)), layout_(layout),
        tokens_(reinterpret_cast<const T*>(file_->bytes() + layout.header_bytes)) {}

  size_t n_tokens() const override { return layout_.n_tokens; }
  int32_t token(size_t i) const override {
    TRIDENT_CHECK(i < layout_.n_tokens, "token {} of {} in {}", i, layout_.n_tokens, path_);
    return static_cast<int32_t>(tokens_[i]);
  }
  const std::string& path() const override { return path_; }
  void read(size_t first, size_t count, int32_t* out) const override {
    TRIDENT_CHECK(first <= layout_.n_tokens && count <= layout_.n_tokens - first,
                  "tokens [{}, {}) of {} in {}", first, first + count, layout_.n_tokens, path_);
    std::copy(tokens_ + first, tokens_ + first + count, out);
  }
  std::string describe() const override {
    std::string vocab = layout_.file_vocab ? fmt::format(", vocab {}", layout_.file_vocab) : "";
    return fmt::format("{}: {} tokens ({} format, {}-byte tokens, {}{})", path_, layout_.n_tokens,
                       layout_.format, layout_.bytes_per_token, tokenizer_name(layout_.tokenizer),
                       vocab);
  }

  // Every token must be below the model's vocab (an embedding row exists) and below the
  // file's own vocab_size (else the header or payload is corrupt).
  void check_tokens(int vocab, const std::string& what) const {
    size_t n = layout_.n_tokens;
    file_->advise(MADV_SEQUENTIAL);
    uint32_t largest = max_token(tokens_, n);
    file_->advise(MADV_NORMAL);
    if (largest >= static_cast<uint32_t>(vocab)) {
      size_t i = first_at_least(tokens_, n, static_cast<uint64_t>(vocab));
      std::string hint = layout_.file_vocab > static_cast<uint32_t>(vocab)
                             ? fmt::format(" (the file's header says vocab_size {}, tokenizer {})",
                                           layout_.file_vocab, tokenizer_name(layout_.tokenizer))
                             : "";
      input_error("{}: {}: token {} at position {} is >= model.vocab {}{}", what, path_,
                  static_cast<uint32_t>(tokens_[i]), i, vocab, hint);
    }
    if (layout_.file_vocab != 0 && largest >= layout_.file_vocab) {
      size_t i = first_at_least(tokens_, n, layout_.file_vocab);
      input_error("{}: {}: token {} at position {} is >= the header's vocab_size {} (corrupt file)",
                  what, path_, static_cast<uint32_t>(tokens_[i]), i, layout_.file_vocab);
    }
  }

 private:
  std::string path_;
  std::unique_ptr<MappedFile> file_;
  TokenLayout layout_;
  const T* tokens_;
};

template <typename T>
std::unique_ptr<TokenDataset> make_dataset(const std::string& path,
                                           std::unique_ptr<MappedFile> file,
                                           const TokenLayout& layout, int vocab,
                                           const std::string& what) {
  auto data = std::make_unique<MappedTokens<T>>(path, std::move(file), layout);
  data->check_tokens(vocab, what);
  return data;
}

}  // namespace

void TokenDataset::read(size_t first, size_t count, int32_t* out) const {
  for (size_t i = 0; i < count; ++i) out[i] = token(first + i);
}

std::string TokenDataset::describe() const {
  return fmt::format("{}: {} tokens", path(), n_tokens());
}

std::unique_ptr<TokenDataset> TokenDataset::open(const std::string& path, int vocab,
                                                 const std::string& what) {
  if (vocab <= 0) input_error("{}: {}: model.vocab is {}, must be positive", what, path, vocab);
  if (auto prefix = io_detail::indexed_prefix(path))
    return io_detail::open_indexed_dataset(*prefix, vocab, what);
  auto file = std::make_unique<MappedFile>(path, what);
  TokenLayout layout = parse_header(*file, path, what);
  check_size(layout, *file, path, what);
  if (layout.bytes_per_token == 2)
    return make_dataset<uint16_t>(path, std::move(file), layout, vocab, what);
  return make_dataset<uint32_t>(path, std::move(file), layout, vocab, what);
}

void write_token_file(const std::string& path, const std::vector<int32_t>& tokens, int vocab_size,
                      int tokenizer) {
  if (vocab_size <= 0) input_error("{}: vocab_size {} must be positive", path, vocab_size);
  if (tokenizer < 0 || tokenizer > 2)
    input_error("{}: tokenizer id {} is unknown (0 byte-level, 1 GPT-2 BPE, 2 other)", path,
                tokenizer);
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab_size)
      input_error("{}: token {} at position {} is outside [0, vocab_size {})", path, tokens[i], i,
                  vocab_size);
  const uint32_t bytes_per_token = vocab_size <= 65536 ? 2 : 4;

  unsigned char header[kTridentHeaderBytes] = {};
  std::memcpy(header, kTridentMagic, sizeof(kTridentMagic));
  store<uint32_t>(header + 8, kTridentVersion);
  store<uint32_t>(header + 12, bytes_per_token);
  store<uint64_t>(header + 16, tokens.size());
  store<uint32_t>(header + 24, static_cast<uint32_t>(vocab_size));
  store<uint32_t>(header + 28, static_cast<uint32_t>(tokenizer));

  std::vector<unsigned char> payload(tokens.size() * bytes_per_token);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (bytes_per_token == 2)
      store<uint16_t>(payload.data() + 2 * i, static_cast<uint16_t>(tokens[i]));
    else store<uint32_t>(payload.data() + 4 * i, static_cast<uint32_t>(tokens[i]));
  }

  // Write beside the target and rename, so a reader never sees a half-written file.
  std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) input_error("{}: cannot write (via {}): {}", path, tmp, std::strerror(errno));
  bool ok = std::fwrite(header, 1, sizeof(header), f) == sizeof(header) &&
            std::fwrite(payload.data(), 1, payload.size(), f) == payload.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    std::remove(tmp.c_str());
    input_error("{}: cannot write: {}", path, std::strerror(err));
  }
}

}  // namespace trident
