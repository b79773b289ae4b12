// What every fuzz target shares (Note [Fuzz build] in the top CMakeLists.txt).
//
// The contract a target checks: a parser given any bytes either accepts them or throws
// trident::Error with ExitCode::kBadInput, which the app prints as one message and exit 2.
// Anything else is a finding and aborts, so libFuzzer saves the input:
//   - an internal error (a TRIDENT_CHECK on user input prints a source line, not the problem);
//   - any other exception (std::bad_alloc, std::filesystem errors, yaml-cpp's own...);
//   - what the sanitizers catch (out-of-bounds reads, overflow, use after free...).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <limits>
#include <string>
#include <type_traits>

#include "trident/check.h"

namespace trident::fuzz {

// The parsers under test read files: each input is written to one file per process (under
// TMPDIR, default /tmp), rewritten for every input. Returns its path.
inline const std::string& input_file(const char* suffix) {
  static const std::string path = [&] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir && *dir ? dir : "/tmp") + "/trident-fuzz-" + std::to_string(::getpid()) +
           suffix;
  }();
  return path;
}

inline const std::string& write_input(const uint8_t* data, size_t size, const char* suffix) {
  const std::string& path = input_file(suffix);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  f.close();
  if (!f) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
  return path;
}

[[noreturn]] inline void finding(const char* what, const std::string& message) {
  std::fprintf(stderr, "fuzz finding: %s: %s\n", what, message.c_str());
  std::abort();
}

// Runs `parse`; returns true if it accepted the input, false if it refused it as bad input,
// and aborts on anything else (see the contract above).
template <typename F>
bool accepts(F&& parse) {
  try {
    parse();
    return true;
  } catch (const Error& e) {
    if (e.code() != ExitCode::kBadInput) finding("internal error on bad input", e.what());
    return false;
  } catch (const std::exception& e) {
    finding("an exception that is not trident::Error", e.what());
  }
}

// Reads typed values off the front of an input, for targets whose input is a list of edits
// rather than a file. Past the end it returns the smallest allowed value, so every input
// decodes to something.
class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  size_t left() const { return static_cast<size_t>(end_ - p_); }

  template <typename T>
  T take() {
    using U = std::make_unsigned_t<T>;
    U v = 0;
    for (size_t i = 0; i < sizeof(T) && p_ < end_; ++i) v = static_cast<U>((v << 8) | *p_++);
    return static_cast<T>(v);
  }
  // A value in [lo, hi], from as few bytes as the range needs.
  template <typename T>
  T take_int(T lo, T hi) {
    using U = std::make_unsigned_t<T>;
    const U span = static_cast<U>(static_cast<U>(hi) - static_cast<U>(lo));
    U v = 0;
    for (U seen = 0; seen < span && p_ < end_; seen = static_cast<U>((seen << 8) | 0xff))
      v = static_cast<U>((v << 8) | *p_++);
    if (span != std::numeric_limits<U>::max()) v = static_cast<U>(v % (span + 1));
    return static_cast<T>(static_cast<U>(lo) + v);
  }
  bool take_bool() { return take_int<int>(0, 1) == 1; }
  // Up to max bytes, ending early at a '\0' byte (which is consumed).
  std::string take_string(size_t max) {
    std::string s;
    while (s.size() < max && p_ < end_) {
      const char c = static_cast<char>(*p_++);
      if (c == '\0') break;
      s += c;
    }
    return s;
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

}  // namespace trident::fuzz
