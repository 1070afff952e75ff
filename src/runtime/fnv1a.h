#pragma once
// 64-bit FNV-1a over bytes (internal): the cheap hash ranks exchange to tell whether they agree.
#include <cstddef>
#include <cstdint>

namespace hyper_parallel {
namespace detail {

constexpr uint64_t kFnv1aBasis = 1469598103934665603ull;

/// `n` bytes at `data` hashed on from `h` (start from kFnv1aBasis).
inline uint64_t fnv1a(const void* data, size_t n, uint64_t h = kFnv1aBasis) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace detail
}  // namespace hyper_parallel
