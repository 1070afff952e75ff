// Collective latency per size on the job's world group: median and p99 of single calls, bus
// bandwidth, a memcpy of the same bytes, and (2 ranks on one host) the floor of any shared-memory
// all-reduce on this machine: the data movement alone, with no arithmetic. Each rank copies its
// n bytes into shared memory, one synchronisation, each copies the peer's n freshly written bytes
// out (every all-reduce must bring the peer's n bytes to each rank). That cross-core transfer
// depends on the machine (VM placement), not on the transport. Run on every rank of a job started
// by hprun (hp_bench runs it twice: shared memory, then HP_TRANSPORT=gloo).
#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <hyper_parallel/runtime/collectives.h>
#include <hyper_parallel/runtime/process_group.h>

#include "bench_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define HP_BENCH_RELAX() _mm_pause()
#else
#define HP_BENCH_RELAX() std::atomic_signal_fence(std::memory_order_seq_cst)
#endif

namespace hp = hyper_parallel;

namespace hp_bench {

namespace {

struct Stats {
  double median_us, p99_us;
};

Stats time_calls(const std::function<void()>& fn, int calls) {
  for (int i = 0; i < std::max(3, calls / 10); ++i) fn();
  std::vector<double> t(static_cast<size_t>(calls));
  for (auto& x : t) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    x = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t[std::min(t.size() - 1, t.size() * 99 / 100)]};
}

// The two ranks' shared page of flags and their data areas (one segment, removed once mapped).
class ShmFloor {
 public:
  ShmFloor(const hp::Group& g, size_t max_bytes) : rank_(g.rank()), max_(max_bytes) {
    const char* job = std::getenv("HP_JOB_ID");
    const std::string name = std::string("/hp_") + (job ? job : "nojob") + "_bench_floor";
    mapped_ = 4096 + 4 * max_;
    if (rank_ == 0) {
      const int fd = ::shm_open(name.c_str(), O_CREAT | O_RDWR | O_TRUNC, 0600);
      if (fd >= 0 && ::ftruncate(fd, static_cast<off_t>(mapped_)) == 0) map(fd);
      if (fd >= 0) ::close(fd);
    }
    hp::barrier(g);
    if (rank_ == 1) {
      const int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
      if (fd >= 0) {
        map(fd);
        ::close(fd);
      }
    }
    hp::barrier(g);
    if (rank_ == 0) ::shm_unlink(name.c_str());
  }
  ~ShmFloor() {
    if (base_ != nullptr) ::munmap(base_, mapped_);
  }
  bool ok() const { return base_ != nullptr; }
  // The data movement of one all-reduce of `bytes`: `in` to shared memory, the peer's bytes to
  // `out`. Two areas per rank used alternately, so one synchronisation per call suffices.
  void exchange(const void* in, void* out, size_t bytes) {
    const int64_t k = static_cast<int64_t>(phase_ % 2);
    std::memcpy(data(2 * rank_ + k), in, bytes);
    sync();
    std::memcpy(out, data(2 * (1 - rank_) + k), bytes);
  }
  // The data movement of one all-gather of `bytes` per rank into `out` (2 * bytes): this rank's
  // own piece copied into its place, then exchange() into the peer's place.
  void gather(const void* in, void* out, size_t bytes) {
    auto* o = static_cast<unsigned char*>(out);
    std::memcpy(o + static_cast<size_t>(rank_) * bytes, in, bytes);
    exchange(in, o + static_cast<size_t>(1 - rank_) * bytes, bytes);
  }

 private:
  void map(int fd) {
    void* p = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) base_ = static_cast<unsigned char*>(p);
  }
  std::atomic<uint64_t>* flag(int64_t r) { return reinterpret_cast<std::atomic<uint64_t>*>(base_ + 64 * r); }
  unsigned char* data(int64_t area) { return base_ + 4096 + static_cast<size_t>(area) * max_; }
  void sync() {
    flag(rank_)->store(++phase_, std::memory_order_release);
    while (flag(1 - rank_)->load(std::memory_order_acquire) < phase_) HP_BENCH_RELAX();
  }
  int64_t rank_;
  size_t max_, mapped_ = 0;
  unsigned char* base_ = nullptr;
  uint64_t phase_ = 0;
};

}  // namespace

void run_collective_benchmarks(const std::string& filter) {
  const auto g = hp::world_group();
  const bool want_ar = filter.empty() || std::string("all_reduce_latency").find(filter) != std::string::npos;
  const bool want_ag = filter.empty() || std::string("all_gather_latency").find(filter) != std::string::npos;
  const std::string transport = std::getenv("HP_TRANSPORT") ? std::getenv("HP_TRANSPORT") : "auto";
  // The floor is measured in the shared-memory run only (it needs no transport of ours).
  std::unique_ptr<ShmFloor> floor;
  if ((want_ar || want_ag) && transport == "auto" && g.size() == 2) floor = std::make_unique<ShmFloor>(g, size_t{16} << 20);
  for (int64_t bytes : {int64_t{4}, int64_t{4} << 10, int64_t{64} << 10, int64_t{256} << 10, int64_t{1} << 20, int64_t{16} << 20}) {
    const int calls = bytes <= (256 << 10) ? 2000 : bytes <= (1 << 20) ? 400 : 40;
    const int64_t n = bytes / 4;
    at::Tensor x = at::ones({n});
    at::Tensor src = at::ones({n}), dst = at::empty({n});
    hp::barrier(g);
    const Stats copy = time_calls([&] { std::memcpy(dst.data_ptr(), src.data_ptr(), static_cast<size_t>(bytes)); }, calls);
    if (want_ar) {
      hp::barrier(g);
      const Stats s = time_calls([&] { hp::all_reduce_(x, hp::ReduceOp::SUM, g); }, calls);
      // Bus bandwidth as nccl-tests define it: 2 (g - 1) / g bytes move per byte reduced.
      const double busbw = 2.0 * (g.size() - 1) / g.size() * static_cast<double>(bytes) / (s.median_us * 1e3);
      double floor_us = -1;
      if (floor && floor->ok()) {
        hp::barrier(g);
        floor_us = time_calls([&] { floor->exchange(src.data_ptr(), dst.data_ptr(), static_cast<size_t>(bytes)); }, calls).median_us;
      }
      if (g.rank() == 0)
        std::printf("{\"name\": \"all_reduce_latency\", \"transport\": \"%s\", \"ranks\": %lld, \"bytes\": %lld, "
                    "\"median_us\": %.3g, \"p99_us\": %.3g, \"busbw_GBps\": %.3g, \"memcpy_us\": %.3g, \"shm_floor_us\": %.3g}\n",
                    transport.c_str(), static_cast<long long>(g.size()), static_cast<long long>(bytes), s.median_us,
                    s.p99_us, busbw, copy.median_us, floor_us);
    }
    if (want_ag) {
      at::Tensor piece = at::ones({n / g.size() > 0 ? n / g.size() : 1});  // the output is `bytes`
      hp::barrier(g);
      const Stats s = time_calls([&] { hp::all_gather(piece, 0, g); }, calls);
      // The all-gather's own floor: each rank's piece in and into its place, the peer's out.
      double floor_us = -1;
      if (floor && floor->ok()) {
        at::Tensor gathered = at::empty({2 * piece.numel()});
        hp::barrier(g);
        const size_t piece_bytes = static_cast<size_t>(piece.numel() * 4);
        floor_us = time_calls([&] { floor->gather(piece.data_ptr(), gathered.data_ptr(), piece_bytes); }, calls).median_us;
      }
      if (g.rank() == 0)
        std::printf("{\"name\": \"all_gather_latency\", \"transport\": \"%s\", \"ranks\": %lld, \"output_bytes\": %lld, "
                    "\"median_us\": %.3g, \"p99_us\": %.3g, \"memcpy_us\": %.3g, \"shm_floor_us\": %.3g}\n",
                    transport.c_str(), static_cast<long long>(g.size()), static_cast<long long>(piece.numel() * 4 * g.size()),
                    s.median_us, s.p99_us, copy.median_us, floor_us);
    }
    std::fflush(stdout);
  }
}

}  // namespace hp_bench
