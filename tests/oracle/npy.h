// NumPy's .npy writer for the oracles' C++ sides (oracle_grads, moe_probe): what they write,
// numpy.load reads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "trident/check.h"

namespace trident::testing {

// NumPy's .npy format, version 1.0: magic, header length, a Python dict literal padded with
// spaces to a multiple of 64 bytes and ending in '\n', then the raw C-order data.
inline void write_npy(const std::filesystem::path& path, const float* data,
                      const std::vector<int>& shape) {
  std::string dims;
  size_t count = 1;
  for (int d : shape) {
    dims += std::to_string(d) + ",";
    count *= size_t(d);
  }
  if (shape.size() > 1) dims.pop_back();  // (3,) but (3, 4)
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  const size_t preamble = 10;  // magic (6) + version (2) + header length (2)
  header.append(64 - (preamble + header.size() + 1) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  const char magic[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
  out.write(magic, 8);
  const uint16_t len = uint16_t(header.size());
  out.write(reinterpret_cast<const char*>(&len), 2);  // little-endian host (x86-64)
  out.write(header.data(), std::streamsize(header.size()));
  out.write(reinterpret_cast<const char*>(data), std::streamsize(count * sizeof(float)));
  TRIDENT_CHECK(bool(out), "write to {} failed", path.string());
}

}  // namespace trident::testing
