// The fuzz targets as ordinary programs (the normal build, where libFuzzer is absent): every
// file named, or found in a directory named, on the command line is passed to
// LLVMFuzzerTestOneInput once. ctest runs each target over its seeds and regression inputs
// this way, so a bug a fuzzer once found stays fixed in every build (Note [Fuzz build]).
// An input that takes longer than kSecondsPerInput fails, as libFuzzer's -timeout would.
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

namespace {

constexpr unsigned kSecondsPerInput = 10;

extern "C" void on_timeout(int) {
  const char msg[] = "replay: timeout: the input above took longer than 10 s\n";
  (void)!::write(2, msg, sizeof(msg) - 1);
  ::_exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::signal(SIGALRM, on_timeout);
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const fs::path arg = argv[i];
    if (fs::is_directory(arg)) {
      for (const auto& entry : fs::directory_iterator(arg))
        if (entry.is_regular_file()) inputs.push_back(entry.path());
    } else if (fs::is_regular_file(arg)) {
      inputs.push_back(arg);
    } else if (arg.filename() == "" || arg.parent_path().filename() == "regressions") {
      std::printf("replay: %s: none yet\n", argv[i]);  // a target without regression inputs
    } else {
      std::fprintf(stderr, "replay: %s: no such file or directory\n", argv[i]);
      return 1;
    }
  }
  for (const fs::path& p : inputs) {
    std::ifstream f(p, std::ios::binary);
    const std::vector<char> bytes{std::istreambuf_iterator<char>(f), {}};
    std::printf("replay: %s (%zu bytes)\n", p.c_str(), bytes.size());
    std::fflush(stdout);
    ::alarm(kSecondsPerInput);
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    ::alarm(0);
  }
  std::printf("replay: %zu inputs, every one handled\n", inputs.size());
  if (inputs.empty()) return 1;  // a replay that ran nothing checked nothing
  return 0;
}
