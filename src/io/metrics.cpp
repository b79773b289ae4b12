#include "trident/metrics.h"

#include "trident/check.h"

namespace trident {

JsonlWriter::JsonlWriter(const std::string& path, bool append)
    : path_(path), out_(path, append ? std::ios::app : std::ios::trunc) {
  if (!out_) input_error("log.jsonl: cannot open {} for writing", path);
}

void JsonlWriter::write(const nlohmann::json& record) {
  out_ << record.dump() << '\n';
  out_.flush();
  TRIDENT_CHECK(bool(out_), "write to {} failed", path_);
}

}  // namespace trident
