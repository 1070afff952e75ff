#pragma once
// Whole-file reads and writes for the tests that build, corrupt and compare files.
#include <fstream>
#include <iterator>
#include <string>

namespace hp_test {

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

}  // namespace hp_test
