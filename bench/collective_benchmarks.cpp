// Collective latency per size on the job's world group: median and p99 of single calls, bus
// bandwidth, and a memcpy of the same bytes as the physical bound. Run on every rank of a job
// started by hprun (hp_bench runs it twice: shared memory, then HP_TRANSPORT=gloo).
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <hyper_parallel/runtime/collectives.h>
#include <hyper_parallel/runtime/process_group.h>

#include "bench_util.h"

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

}  // namespace

void run_collective_benchmarks(const std::string& filter) {
  const auto g = hp::world_group();
  const bool want_ar = filter.empty() || std::string("all_reduce_latency").find(filter) != std::string::npos;
  const bool want_ag = filter.empty() || std::string("all_gather_latency").find(filter) != std::string::npos;
  const std::string transport = std::getenv("HP_TRANSPORT") ? std::getenv("HP_TRANSPORT") : "auto";
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
      if (g.rank() == 0)
        std::printf("{\"name\": \"all_reduce_latency\", \"transport\": \"%s\", \"ranks\": %lld, \"bytes\": %lld, "
                    "\"median_us\": %.3g, \"p99_us\": %.3g, \"busbw_GBps\": %.3g, \"memcpy_us\": %.3g}\n",
                    transport.c_str(), static_cast<long long>(g.size()), static_cast<long long>(bytes), s.median_us,
                    s.p99_us, busbw, copy.median_us);
    }
    if (want_ag) {
      at::Tensor piece = at::ones({n / g.size() > 0 ? n / g.size() : 1});  // the output is `bytes`
      hp::barrier(g);
      const Stats s = time_calls([&] { hp::all_gather(piece, 0, g); }, calls);
      if (g.rank() == 0)
        std::printf("{\"name\": \"all_gather_latency\", \"transport\": \"%s\", \"ranks\": %lld, \"output_bytes\": %lld, "
                    "\"median_us\": %.3g, \"p99_us\": %.3g, \"memcpy_us\": %.3g}\n",
                    transport.c_str(), static_cast<long long>(g.size()), static_cast<long long>(piece.numel() * 4 * g.size()),
                    s.median_us, s.p99_us, copy.median_us);
    }
    std::fflush(stdout);
  }
}

}  // namespace hp_bench
