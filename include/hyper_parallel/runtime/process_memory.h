#pragma once
// What this process holds in memory, as Linux reports it (/proc/self): for loaders and programs
// that report their footprint, and for tests that bound it.
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

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

/// While alive (or until stop()), samples resident_anonymous_bytes() about every millisecond and
/// file_mappings(path_prefix) every 8th time, on a thread of its own, keeping the largest of
/// each: the peak of a load, which /proc keeps for the whole resident set only (VmHWM).
/// e.g. `{ hp::MemoryPeakSampler s(dir + "/"); load(); s.stop(); s.peak_anonymous_bytes(); }`
class MemoryPeakSampler {
 public:
  explicit MemoryPeakSampler(std::string path_prefix = "");
  ~MemoryPeakSampler();
  MemoryPeakSampler(const MemoryPeakSampler&) = delete;
  MemoryPeakSampler& operator=(const MemoryPeakSampler&) = delete;
  void stop();
  int64_t peak_anonymous_bytes() const { return anon_; }
  int64_t peak_file_resident_bytes() const { return mapped_; }

 private:
  std::string prefix_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> anon_{0}, mapped_{0};
  std::thread thread_;
};

}  // namespace hyper_parallel
