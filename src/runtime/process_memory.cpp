// Reading this process's memory figures from /proc/self.
#include <hyper_parallel/runtime/process_memory.h>

#include <cstdio>
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string>

namespace hyper_parallel {

int64_t resident_anonymous_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    long long kib = 0;
    if (std::sscanf(line.c_str(), "RssAnon: %lld kB", &kib) == 1) return static_cast<int64_t>(kib) * 1024;
  }
  return -1;
}

FileMappings file_mappings(const std::string& path_prefix) {
  FileMappings out;
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool ours = false;
  while (std::getline(in, line)) {
    // A mapping's header: "start-end perms offset dev inode [path]"; its fields follow, one a line
    // of "Name: value kB".
    const size_t dash = line.find('-');
    if (dash != std::string::npos && dash > 0 && line.find(':') > dash && std::isxdigit(static_cast<unsigned char>(line[0]))) {
      const size_t slash = line.find('/');
      ours = slash != std::string::npos && line.compare(slash, path_prefix.size(), path_prefix) == 0;
      if (ours) ++out.mappings;
      continue;
    }
    long long kib = 0;
    if (ours && std::sscanf(line.c_str(), "Rss: %lld kB", &kib) == 1) out.resident_bytes += static_cast<int64_t>(kib) * 1024;
  }
  return out;
}

MemoryPeakSampler::MemoryPeakSampler(std::string path_prefix) : prefix_(std::move(path_prefix)) {
  thread_ = std::thread([this] {
    for (int n = 0; !stop_.load(); ++n) {
      anon_ = std::max(anon_.load(), resident_anonymous_bytes());
      if (!prefix_.empty() && n % 8 == 0) mapped_ = std::max(mapped_.load(), file_mappings(prefix_).resident_bytes);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
}

MemoryPeakSampler::~MemoryPeakSampler() { stop(); }

void MemoryPeakSampler::stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  // The last moment counts too (a short load may end between two samples).
  anon_ = std::max(anon_.load(), resident_anonymous_bytes());
}

}  // namespace hyper_parallel
