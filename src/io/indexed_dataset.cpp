// Megatron-LM / GPT-NeoX indexed datasets (PREFIX.idx + PREFIX.bin) read as a token stream
// (docs/data-format.md). PREFIX.idx, little-endian ("MMIDIDX" version 1, as Megatron's
// indexed_dataset.py writes it):
//     offset 0   9 bytes     magic "MMIDIDX\0\0"
//            9   u64         version, 1
//           17   u8          dtype code of the tokens in .bin (kDtypes below)
//           18   u64         sequence_count S
//           26   u64         document_count D (Megatron writes one entry per document plus one)
//           34   i32[S]      sizes: tokens in sequence i
//      34 + 4S   i64[S]      pointers: byte offset of sequence i in .bin
//     34 + 12S   i64[D]      doc_idx: index of each document's first sequence, then S
// PREFIX.bin: the tokens of every sequence, nothing else.
//
// Note [Megatron indexed dataset]
// The tokens of sequences 0 .. S-1, back to back, are one stream, as Megatron's GPT dataset
// concatenates documents; it is then sampled and shuffled like any token file, so order, resume
// and layout equality are those of every format. No end-of-document token is added. The
// pointers must place the sequences back to back (pointers[i+1] = pointers[i] + sizes[i] x dtype
// bytes, as Megatron's builder writes): then the stream is the mapped .bin itself. doc_idx is
// only checked and used in messages.
#include <algorithm>
#include <bit>
#include <filesystem>
#include <type_traits>

#include "token_files.h"
#include "trident/check.h"
#include "trident/data.h"

namespace trident::io_detail {

static_assert(std::endian::native == std::endian::little,
              "indexed datasets are little-endian and are read in place");

namespace {

constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr uint64_t kIndexVersion = 1;
constexpr size_t kIndexHeaderBytes = 9 + 8 + 1 + 8 + 8;

// Megatron's DType codes, all of them, so an unsupported one is named rather than "unknown".
struct IndexDtype {
  uint8_t code;
  const char* name;
  uint32_t bytes;
  bool is_float;
};
constexpr IndexDtype kDtypes[] = {
    {1, "uint8", 1, false},  {2, "int8", 1, false},   {3, "int16", 2, false},
    {4, "int32", 4, false},  {5, "int64", 8, false},  {6, "float64", 8, true},
    {7, "float32", 4, true}, {8, "uint16", 2, false},
};

template <typename T>
T load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

std::string hex_bytes(const unsigned char* p, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += fmt::format("{}{:02x}", i ? " " : "", p[i]);
  return s;
}

// The validated index: counts, the dtype and where its three tables start in the mapping
// (unaligned, read with load<>).
struct Index {
  const IndexDtype* dtype;
  uint64_t n_seq;
  uint64_t n_doc;
  const unsigned char* sizes;
  const unsigned char* pointers;
  const unsigned char* doc_idx;
  uint64_t n_tokens;  // sum of sizes

  int32_t size(uint64_t i) const { return load<int32_t>(sizes + 4 * i); }
  int64_t pointer(uint64_t i) const { return load<int64_t>(pointers + 8 * i); }
  int64_t doc(uint64_t j) const { return load<int64_t>(doc_idx + 8 * j); }
};

// Header, dtype and the idx size against the header's counts.
Index parse_index(const MappedFile& f, const std::string& path, const std::string& what) {
  const unsigned char* h = f.bytes();
  if (f.size() < kIndexHeaderBytes)
    input_error("{}: {}: file is {} bytes, shorter than the {}-byte Megatron index header", what,
                path, f.size(), kIndexHeaderBytes);
  if (std::memcmp(h, kIndexMagic, sizeof(kIndexMagic)) != 0)
    input_error("{}: {}: magic is {}, expected {} (\"MMIDIDX\\0\\0\", a Megatron mmap index)", what,
                path, hex_bytes(h, 9),
                hex_bytes(reinterpret_cast<const unsigned char*>(kIndexMagic), 9));
  const uint64_t version = load<uint64_t>(h + 9);
  if (version != kIndexVersion)
    input_error("{}: {}: version is {}, expected {}", what, path, version, kIndexVersion);
  const uint8_t code = h[17];
  const IndexDtype* dtype = nullptr;
  for (const IndexDtype& d : kDtypes)
    if (d.code == code) dtype = &d;
  if (!dtype)
    input_error("{}: {}: dtype code {} is unknown (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, "
                "6 float64, 7 float32, 8 uint16)",
                what, path, code);
  if (dtype->is_float)
    input_error("{}: {}: dtype code {} is {}: token ids must be integers (uint16 or int32, "
                "or another integer type)",
                what, path, code, dtype->name);
  Index ix{dtype, load<uint64_t>(h + 18), load<uint64_t>(h + 26), nullptr, nullptr, nullptr, 0};

  // 34 + 12 S + 8 D bytes; counts too large for the file are caught before multiplying.
  const size_t size = f.size();
  const bool fits = ix.n_seq <= size / 12 && ix.n_doc <= size / 8;
  const uint64_t expected = kIndexHeaderBytes + 12 * ix.n_seq + 8 * ix.n_doc;
  if (!fits || size != expected) {
    std::string need = fits ? fmt::format("need {} bytes", expected) : "need more bytes";
    std::string hint;
    if (fits && size == expected + ix.n_seq)
      hint = " (one more byte per sequence: a multimodal index with sequence modes, which "
             "trident does not read)";
    input_error("{}: {}: file is {} bytes, but sequence_count {} and document_count {} {} "
                "({}-byte header + {} x 4-byte sizes + {} x 8-byte pointers + {} x 8-byte "
                "doc_idx): {}{}",
                what, path, size, ix.n_seq, ix.n_doc, need, kIndexHeaderBytes, ix.n_seq, ix.n_seq,
                ix.n_doc, fits && size > expected ? "trailing bytes" : "truncated", hint);
  }
  ix.sizes = h + kIndexHeaderBytes;
  ix.pointers = ix.sizes + 4 * ix.n_seq;
  ix.doc_idx = ix.pointers + 8 * ix.n_seq;
  for (uint64_t i = 0; i < ix.n_seq; ++i) {
    if (ix.size(i) < 0)
      input_error("{}: {}: sizes[{}] is {}, a sequence length cannot be negative", what, path, i,
                  ix.size(i));
    ix.n_tokens += static_cast<uint64_t>(ix.size(i));
  }
  return ix;
}

// doc_idx: 0, non-decreasing, within [0, S], ending with S (every sequence in a document).
void check_documents(const Index& ix, const std::string& path, const std::string& what) {
  if (ix.n_doc == 0)
    input_error("{}: {}: document_count is 0; doc_idx needs at least its first entry 0", what,
                path);
  if (ix.doc(0) != 0)
    input_error("{}: {}: doc_idx[0] is {}, expected 0 (the first document starts at sequence 0)",
                what, path, ix.doc(0));
  for (uint64_t j = 1; j < ix.n_doc; ++j) {
    if (ix.doc(j) < ix.doc(j - 1) || static_cast<uint64_t>(ix.doc(j)) > ix.n_seq)
      input_error("{}: {}: doc_idx[{}] is {}, out of order or range (doc_idx[{}] is {}, "
                  "sequence_count {})",
                  what, path, j, ix.doc(j), j - 1, ix.doc(j - 1), ix.n_seq);
  }
  if (static_cast<uint64_t>(ix.doc(ix.n_doc - 1)) != ix.n_seq)
    input_error("{}: {}: doc_idx[{}] is {}, expected sequence_count {} (the end of the last "
                "document)",
                what, path, ix.n_doc - 1, ix.doc(ix.n_doc - 1), ix.n_seq);
}

// The .bin holds exactly the sequences, back to back in order (Note [Megatron indexed dataset]).
void check_bin(const Index& ix, const MappedFile& bin, const std::string& idx_path,
               const std::string& bin_path, const std::string& what) {
  const uint64_t item = ix.dtype->bytes;
  if (ix.n_tokens > bin.size() / item || bin.size() != ix.n_tokens * item)
    input_error("{}: {}: file is {} bytes, but the sizes in {} add up to {} tokens x {} bytes "
                "({}) = {}",
                what, bin_path, bin.size(), idx_path, ix.n_tokens, item, ix.dtype->name,
                ix.n_tokens > UINT64_MAX / item ? std::string("more than any file holds")
                                                : fmt::format("{} bytes", ix.n_tokens * item));
  uint64_t offset = 0;  // where sequence i must start
  for (uint64_t i = 0; i < ix.n_seq; ++i) {
    const int64_t p = ix.pointer(i);
    const uint64_t bytes = static_cast<uint64_t>(ix.size(i)) * item;
    if (p < 0 || static_cast<uint64_t>(p) > bin.size() ||
        bytes > bin.size() - static_cast<uint64_t>(p))
      input_error("{}: {}: pointers[{}] is {}, out of range: sequence {} ({} tokens) must lie "
                  "within {} ({} bytes)",
                  what, idx_path, i, p, i, ix.size(i), bin_path, bin.size());
    if (static_cast<uint64_t>(p) != offset)
      input_error("{}: {}: pointers[{}] is {}, expected {}{}: sequences must be stored back to "
                  "back, in order",
                  what, idx_path, i, p, offset,
                  i == 0 ? ""
                         : fmt::format(" (pointers[{}] + sizes[{}] {} x {} bytes)", i - 1, i - 1,
                                       ix.size(i - 1), item));
    offset += bytes;
  }
}

// Where token position `pos` of the stream lies, for messages: "sequence i, document j".
std::string locate(const Index& ix, uint64_t pos) {
  uint64_t lo = 0, hi = ix.n_seq;  // the last sequence starting at or before pos (not empty)
  while (hi - lo > 1) {
    uint64_t mid = lo + (hi - lo) / 2;
    (static_cast<uint64_t>(ix.pointer(mid)) / ix.dtype->bytes <= pos ? lo : hi) = mid;
  }
  uint64_t d = 0;
  while (d + 1 < ix.n_doc && static_cast<uint64_t>(ix.doc(d + 1)) <= lo) ++d;
  return fmt::format("sequence {}, document {}", lo, d);
}

template <typename T>
class IndexedTokens final : public TokenDataset {
 public:
  IndexedTokens(std::string bin_path, std::unique_ptr<MappedFile> bin, const Index& ix)
      : path_(std::move(bin_path)), bin_(std::move(bin)), n_tokens_(ix.n_tokens), n_seq_(ix.n_seq),
        n_doc_(ix.n_doc - 1), dtype_(ix.dtype->name),
        tokens_(reinterpret_cast<const T*>(bin_->bytes())) {}

  size_t n_tokens() const override { return n_tokens_; }
  int32_t token(size_t i) const override {
    TRIDENT_CHECK(i < n_tokens_, "token {} of {} in {}", i, n_tokens_, path_);
    return static_cast<int32_t>(tokens_[i]);
  }
  const std::string& path() const override { return path_; }
  void read(size_t first, size_t count, int32_t* out) const override {
    TRIDENT_CHECK(first <= n_tokens_ && count <= n_tokens_ - first, "tokens [{}, {}) of {} in {}",
                  first, first + count, n_tokens_, path_);
    std::transform(tokens_ + first, tokens_ + first + count, out,
                   [](T t) { return static_cast<int32_t>(t); });
  }
  std::string describe() const override {
    return fmt::format("{}: {} tokens (Megatron indexed, {} tokens, {} sequences in {} "
                       "documents)",
                       path_, n_tokens_, dtype_, n_seq_, n_doc_);
  }

  // Every token in [0, vocab): a vectorisable min/max pass, then a search for the first
  // offender only if there is one (as for token files).
  void check_tokens(const Index& ix, int vocab, const std::string& what) const {
    bin_->advise(MADV_SEQUENTIAL);
    T lo = 0, hi = 0;
    for (size_t i = 0; i < n_tokens_; ++i) {
      lo = std::min(lo, tokens_[i]);
      hi = std::max(hi, tokens_[i]);
    }
    bin_->advise(MADV_NORMAL);
    const auto bad = [vocab](T t) {
      if constexpr (std::is_signed_v<T>)
        if (t < 0) return true;
      return static_cast<uint64_t>(t) >= static_cast<uint64_t>(vocab);
    };
    if (!bad(lo) && !bad(hi)) return;
    const size_t i = static_cast<size_t>(std::find_if(tokens_, tokens_ + n_tokens_, bad) - tokens_);
    const int64_t t = static_cast<int64_t>(tokens_[i]);
    input_error("{}: {}: token {} at position {} ({}) is {}", what, path_, t, i, locate(ix, i),
                t < 0 ? "negative" : fmt::format(">= model.vocab {}", vocab));
  }

 private:
  std::string path_;
  std::unique_ptr<MappedFile> bin_;
  size_t n_tokens_;
  uint64_t n_seq_, n_doc_;
  const char* dtype_;
  const T* tokens_;
};

template <typename T>
std::unique_ptr<TokenDataset> make_indexed(const std::string& bin_path,
                                           std::unique_ptr<MappedFile> bin, const Index& ix,
                                           int vocab, const std::string& what) {
  auto data = std::make_unique<IndexedTokens<T>>(bin_path, std::move(bin), ix);
  data->check_tokens(ix, vocab, what);
  return data;
}

bool exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() > tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

// Note [Naming an indexed dataset]
// data.train / data.valid name an indexed dataset by PREFIX.idx; by PREFIX.bin when PREFIX.idx
// exists beside it (a .bin alone is a trident token file or an llm.c shard, which have no .idx);
// or by PREFIX, Megatron's own way (--data-path), when no file PREFIX exists but PREFIX.idx or
// PREFIX.bin does (the missing one of the pair is then reported). Any spelling Megatron users
// type works, and no existing token file changes meaning.
std::optional<std::string> indexed_prefix(const std::string& path) {
  if (ends_with(path, ".idx")) return path.substr(0, path.size() - 4);
  if (ends_with(path, ".bin")) {
    std::string prefix = path.substr(0, path.size() - 4);
    if (exists(prefix + ".idx")) return prefix;
    return std::nullopt;
  }
  if (!exists(path) && (exists(path + ".idx") || exists(path + ".bin"))) return path;
  return std::nullopt;
}

std::unique_ptr<TokenDataset> open_indexed_dataset(const std::string& prefix, int vocab,
                                                   const std::string& what) {
  const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
  MappedFile idx(idx_path, what);
  const Index ix = parse_index(idx, idx_path, what);
  check_documents(ix, idx_path, what);
  auto bin = std::make_unique<MappedFile>(bin_path, what);
  check_bin(ix, *bin, idx_path, bin_path, what);
  if (ix.n_tokens < 2)
    input_error("{}: {}: has {} tokens, at least 2 are needed (one input and its target)", what,
                bin_path, ix.n_tokens);
  switch (ix.dtype->code) {
    case 1: return make_indexed<uint8_t>(bin_path, std::move(bin), ix, vocab, what);
    case 2: return make_indexed<int8_t>(bin_path, std::move(bin), ix, vocab, what);
    case 3: return make_indexed<int16_t>(bin_path, std::move(bin), ix, vocab, what);
    case 4: return make_indexed<int32_t>(bin_path, std::move(bin), ix, vocab, what);
    case 5: return make_indexed<int64_t>(bin_path, std::move(bin), ix, vocab, what);
    case 8: return make_indexed<uint16_t>(bin_path, std::move(bin), ix, vocab, what);
    default: break;
  }
  input_error("{}: {}: dtype code {} has no reader", what, idx_path, ix.dtype->code);
}

}  // namespace trident::io_detail
