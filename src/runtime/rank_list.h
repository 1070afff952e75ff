#pragma once
// "0,1,3": how runtime/ names the ranks of a group in its messages (internal).
#include <cstdint>
#include <string>
#include <vector>

namespace hyper_parallel {

inline std::string join_ranks(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

}  // namespace hyper_parallel
