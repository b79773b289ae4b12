// Errors and checks. Every failure becomes a trident::Error carrying one message that names
// the thing that is wrong; the app turns it into a non-zero exit on every rank.
//
// Exit codes: 2 = bad user input (deck, --set, dataset, checkpoint, layout), 1 = anything else.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace trident {

enum class ExitCode : int { kOk = 0, kInternal = 1, kBadInput = 2 };

class Error : public std::runtime_error {
 public:
  Error(std::string msg, ExitCode code) : std::runtime_error(std::move(msg)), code_(code) {}
  ExitCode code() const { return code_; }

 private:
  ExitCode code_;
};

// Bad input from the user: the message must name the file/key and what is allowed.
template <typename... Args>
[[noreturn]] void input_error(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...), ExitCode::kBadInput);
}

[[noreturn]] void internal_error(const char* file, int line, const std::string& what);

}  // namespace trident

// TRIDENT_CHECK(cond, fmt, args...): an internal invariant; the message names file and line.
#define TRIDENT_CHECK(cond, ...)                                                           \
  do {                                                                                     \
    if (!(cond))                                                                           \
      ::trident::internal_error(__FILE__, __LINE__,                                        \
                                "check failed: " #cond ": " + ::fmt::format(__VA_ARGS__)); \
  } while (0)

// TRIDENT_MPI(call): an MPI call that must return MPI_SUCCESS.
#define TRIDENT_MPI(call)                                                                 \
  do {                                                                                    \
    int trident_mpi_rc_ = (call);                                                         \
    if (trident_mpi_rc_ != 0)                                                             \
      ::trident::internal_error(__FILE__, __LINE__,                                       \
                                ::fmt::format("{} returned {}", #call, trident_mpi_rc_)); \
  } while (0)
