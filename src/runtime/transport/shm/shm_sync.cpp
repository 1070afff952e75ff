// The shared-memory transport's synchronisation: arrival counters, the check that every rank
// runs the same collective, and the liveness of the peers (timeouts, dead processes).
#include "shm_transport.h"

#include "../../rank_list.h"

#include <hyper_parallel/runtime/collective_label.h>
#include <hyper_parallel/runtime/errors.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include <signal.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HP_CPU_RELAX() _mm_pause()
#else
#define HP_CPU_RELAX() std::atomic_signal_fence(std::memory_order_seq_cst)
#endif

namespace hyper_parallel {

void ShmTransport::begin(uint32_t kind, uint64_t bytes) {
  Control* me = control(rank_);
  me->kind[step_ % 2] = kind;
  me->bytes[step_ % 2] = bytes;
  me->label_hash[step_ % 2] = current_collective_label_hash();
  if (me->label_hash[step_ % 2] != 0) {
    const std::string& text = current_collective_label();
    const size_t n = std::min(text.size(), kLabelBytes - 1);
    std::memcpy(me->label[step_ % 2], text.data(), n);
    me->label[step_ % 2][n] = '\0';
  }
  check_step_ = step_;
  check_pending_ = true;
}

void ShmTransport::check_agreement(const char* what) {
  check_pending_ = false;
  const size_t k = check_step_ % 2;
  const Control* r0 = control(0);
  bool same = true;
  for (int64_t p = 1; p < size(); ++p)
    same = same && control(p)->kind[k] == r0->kind[k] && control(p)->bytes[k] == r0->bytes[k] &&
           control(p)->label_hash[k] == r0->label_hash[k];
  if (same) return;
  static const char* kinds[] = {"?", "all_reduce", "all_gather", "all_to_all", "broadcast", "scatter", "barrier", "all_to_all_single"};
  std::string who;
  for (int64_t p = 0; p < size(); ++p)
    who += (p ? ", rank " : "rank ") + std::to_string(ranks_[static_cast<size_t>(p)]) + ": " +
           kinds[std::min<uint32_t>(control(p)->kind[k] & 0xFF, 7)] + " of " + std::to_string(control(p)->bytes[k]) +
           " bytes" + (control(p)->kind[k] >> 8 ? " (dtype/op code " + std::to_string(control(p)->kind[k] >> 8) + ")" : "") +
           (control(p)->label_hash[k] != 0 ? std::string(" for ") + control(p)->label[k] : std::string(" (unlabelled)"));
  TORCH_CHECK(false, "hyper_parallel::", what, ": the shared-memory transport on the group of ranks [", join_ranks(ranks_),
              "]: the ranks called different collectives, sizes or owners (", who,
              "); every rank must issue the same collectives in the same order");
}

void ShmTransport::sync(const char* what) {
  ++phase_;
  control(rank_)->arrived.store(phase_, std::memory_order_release);
  const int64_t g = size();
  for (int64_t p = 0; p < g; ++p) {
    const Control* c = control(p);
    if (c->arrived.load(std::memory_order_acquire) >= phase_) continue;
    // Spin first (a peer is usually a few hundred nanoseconds away), then yield the core; look at
    // the clock and the peers' liveness only now and then.
    uint64_t spins = 0;
    bool long_wait = false;
    std::chrono::steady_clock::time_point start{};
    while (c->arrived.load(std::memory_order_acquire) < phase_) {
      ++spins;
      if (spins < 4096) {
        HP_CPU_RELAX();
        continue;
      }
      // A peer that is milliseconds away is not on the hot path (it computes, or waits for
      // something else): sleep briefly then, so a waiting rank gives its core back.
      if (long_wait) std::this_thread::sleep_for(std::chrono::microseconds(50));
      else std::this_thread::yield();
      if (!long_wait && spins % 1024 != 0) continue;
      const auto now = std::chrono::steady_clock::now();
      if (start == std::chrono::steady_clock::time_point{}) start = now;
      long_wait = now - start > std::chrono::milliseconds(2);
      std::vector<int64_t> late, dead;
      for (int64_t q = 0; q < g; ++q) {
        if (control(q)->arrived.load(std::memory_order_acquire) >= phase_) continue;
        late.push_back(ranks_[static_cast<size_t>(q)]);
        if (::kill(pids_[static_cast<size_t>(q)], 0) != 0 && errno == ESRCH) dead.push_back(ranks_[static_cast<size_t>(q)]);
      }
      TORCH_CHECK(dead.empty(), "hyper_parallel::", what, ": the shared-memory transport on the group of ranks [", join_ranks(ranks_),
                  "] failed on rank ", ranks_[static_cast<size_t>(rank_)], ": rank(s) [", join_ranks(dead),
                  "] exited without reaching it");
      TORCH_CHECK(now - start < timeout_, "hyper_parallel::", what, ": the shared-memory transport on the group of ranks [",
                  join_ranks(ranks_), "] failed on rank ", ranks_[static_cast<size_t>(rank_)], " after ",
                  timeout_.count() / 1000.0, " s (HP_TIMEOUT_S): rank(s) [", join_ranks(late),
                  "] did not arrive (stopped, deadlocked or busy elsewhere)");
    }
  }
  if (check_pending_) check_agreement(what);
}

}  // namespace hyper_parallel
