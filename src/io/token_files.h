// Private to src/io/dataset.cpp and src/io/indexed_dataset.cpp: the read-only file mapping the
// token readers share, and the entry points of the Megatron indexed reader.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "trident/check.h"
#include "trident/data.h"

namespace trident::io_detail {

// A read-only private mapping of a whole file; unmapped on destruction. Failing to open, stat
// or map the file is bad input naming `what` and the path.
class MappedFile {
 public:
  MappedFile(const std::string& path, const std::string& what) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) input_error("{}: {}: cannot open: {}", what, path, std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      input_error("{}: {}: not a regular file", what, path);
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      int err = errno;
      ::close(fd);
      if (p == MAP_FAILED) input_error("{}: {}: cannot mmap: {}", what, path, std::strerror(err));
      bytes_ = static_cast<const unsigned char*>(p);
    } else {
      ::close(fd);
    }
  }
  ~MappedFile() {
    if (bytes_) ::munmap(const_cast<unsigned char*>(bytes_), size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* bytes() const { return bytes_; }
  size_t size() const { return size_; }
  void advise(int advice) const {
    if (bytes_) ::madvise(const_cast<unsigned char*>(bytes_), size_, advice);
  }

 private:
  const unsigned char* bytes_ = nullptr;
  size_t size_ = 0;
};

// The prefix of a Megatron indexed dataset (PREFIX.idx + PREFIX.bin) if `path` names one, by
// the rules of Note [Naming an indexed dataset] (src/io/indexed_dataset.cpp); nullopt for a
// path that names a trident token file or an llm.c shard.
std::optional<std::string> indexed_prefix(const std::string& path);

// Opens and validates PREFIX.idx and PREFIX.bin; the tokens of all sequences, in order, are the
// dataset's token stream. Throws kBadInput naming `what`, the file, the field and the index.
std::unique_ptr<TokenDataset> open_indexed_dataset(const std::string& prefix, int vocab,
                                                   const std::string& what);

}  // namespace trident::io_detail
