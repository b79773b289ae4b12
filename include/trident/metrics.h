// Metrics as JSON lines: one object per step, flushed as written so a crashed run keeps its log.
#pragma once

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

namespace trident {

class JsonlWriter {
 public:
  // append: continue an existing file (a resumed run) instead of starting it anew.
  explicit JsonlWriter(const std::string& path, bool append = false);
  void write(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace trident
