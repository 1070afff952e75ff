#pragma once
// What this process holds in memory, as Linux reports it (/proc/self): for loaders and programs
// that report their footprint, and for tests that bound it.
#include <cstdint>
#include <string>

namespace hyper_parallel {

/// Anonymous resident memory of this process (RssAnon in /proc/self/status), in bytes: tensors,
/// heaps and stacks, but not pages of mapped files. -1 where /proc is not available.
int64_t resident_anonymous_bytes();

/// This process's mappings of files whose path starts with `path_prefix` (/proc/self/smaps).
struct FileMappings {
  int64_t mappings = 0;        // how many
  int64_t resident_bytes = 0;  // their pages in this process's resident set (Rss)
};
/// e.g. `hp::file_mappings("/data/Qwen3-8B/").resident_bytes`
FileMappings file_mappings(const std::string& path_prefix);

}  // namespace hyper_parallel
