#pragma once
// torch.chunk arithmetic, shared by the collectives and DTensor sharding: a dimension of size n
// split into `parts` pieces of ceil(n / parts), trailing pieces smaller or empty.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace hyper_parallel {

/// Size of piece `index` when `n` is split into `parts` as torch.chunk does.
/// e.g. chunk_size(7, 4, 3) == 1 (pieces 2,2,2,1), chunk_size(2, 4, 3) == 0.
inline int64_t chunk_size(int64_t n, int64_t parts, int64_t index) {
  const int64_t full = (n + parts - 1) / parts;
  const int64_t begin = full * index;
  if (begin >= n) return 0;
  return begin + full <= n ? full : n - begin;
}

/// Offset of piece `index` (clamped to n for empty trailing pieces).
inline int64_t chunk_offset(int64_t n, int64_t parts, int64_t index) {
  const int64_t full = (n + parts - 1) / parts;
  const int64_t begin = full * index;
  return begin < n ? begin : n;
}

/// All piece sizes of torch.chunk(n, parts); always `parts` entries.
inline std::vector<int64_t> chunk_sizes(int64_t n, int64_t parts) {
  std::vector<int64_t> out(static_cast<size_t>(parts));
  for (int64_t i = 0; i < parts; ++i) out[static_cast<size_t>(i)] = chunk_size(n, parts, i);
  return out;
}

}  // namespace hyper_parallel
