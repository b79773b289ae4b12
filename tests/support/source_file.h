// A file of the source tree for a test that may run on another machine than it was built on:
// tools/gpu-bundle.sh builds test_cuda here and tools/gpu-check.sh runs it on the GPU machine,
// where the repository sits elsewhere and the compiled-in TRIDENT_SOURCE_DIR does not exist.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "trident/check.h"

namespace trident::testing {

// `relative` (e.g. "inputs/gpt-tiny.yaml") under the first of: $TRIDENT_SOURCE_DIR, the
// working directory (gpu-check.sh runs from the repository root), the tree the test was built
// from (`built_in`, the compiled-in TRIDENT_SOURCE_DIR). An Error naming every place tried if
// none has it.
inline std::string source_file(const std::string& relative, const std::string& built_in) {
  std::vector<std::string> roots;
  if (const char* env = std::getenv("TRIDENT_SOURCE_DIR"); env && *env) roots.push_back(env);
  roots.push_back(std::filesystem::current_path().string());
  roots.push_back(built_in);
  std::string tried;
  for (const std::string& root : roots) {
    const std::filesystem::path p = std::filesystem::path(root) / relative;
    std::error_code ec;
    if (std::filesystem::exists(p, ec)) return p.string();
    tried += (tried.empty() ? "" : ", ") + p.string();
  }
  throw Error("test data " + relative + " not found; tried " + tried +
                  " (set TRIDENT_SOURCE_DIR to the repository root)",
              ExitCode::kInternal);
}

#ifdef TRIDENT_SOURCE_DIR
inline std::string source_file(const std::string& relative) {
  return source_file(relative, TRIDENT_SOURCE_DIR);
}
#endif

}  // namespace trident::testing
