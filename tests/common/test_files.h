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

/// A safetensors file's bytes, written here independently of the library's writer: the 8-byte
/// little-endian length, `header` padded with spaces to a multiple of 8, then `data`.
inline std::string safetensors_bytes(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int b = 0; b < 8; ++b) out[static_cast<size_t>(b)] = static_cast<char>((header.size() >> (8 * b)) & 0xff);
  return out + header + data;
}

}  // namespace hp_test
