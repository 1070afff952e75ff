#pragma once
// Progress of a long load or save on stderr (internal), as transformers' and vLLM's loaders show
// it: nothing for the first second, then at most one line a second ("files, GB done, GB/s"), and
// a last line when the work ends. Only where `enabled` (the caller passes rank 0's wish).
#include <chrono>
#include <cstdint>
#include <cstdio>

namespace hyper_parallel {
namespace checkpoint_progress {

class Progress {
 public:
  Progress(const char* what, int64_t total_bytes, int64_t total_files, bool enabled)
      : what_(what), total_bytes_(total_bytes), total_files_(total_files), enabled_(enabled), start_(Clock::now()), last_(start_) {}
  ~Progress() {
    if (printed_) print();
  }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  /// `bytes` more done; `files_done` files finished so far.
  void add(int64_t bytes, int64_t files_done) {
    bytes_ += bytes;
    files_ = files_done;
    if (!enabled_) return;
    const auto now = Clock::now();
    if (now - start_ < std::chrono::seconds(1) || now - last_ < std::chrono::seconds(1)) return;
    last_ = now;
    printed_ = true;
    print();
  }

 private:
  using Clock = std::chrono::steady_clock;
  void print() const {
    const double s = std::chrono::duration<double>(Clock::now() - start_).count();
    std::fprintf(stderr, "%s: %lld/%lld files, %.2f/%.2f GB, %.2f GB/s\n", what_, static_cast<long long>(files_),
                 static_cast<long long>(total_files_), static_cast<double>(bytes_) / 1e9, static_cast<double>(total_bytes_) / 1e9,
                 s > 0 ? static_cast<double>(bytes_) / 1e9 / s : 0.0);
    std::fflush(stderr);
  }
  const char* what_;
  int64_t total_bytes_, total_files_;
  bool enabled_;
  Clock::time_point start_, last_;
  int64_t bytes_ = 0, files_ = 0;
  bool printed_ = false;
};

}  // namespace checkpoint_progress
}  // namespace hyper_parallel
