#pragma once
// The shared-memory transport for a group whose ranks all run on one host (internal to runtime/).
// One segment per group: per rank a control line (an arrival counter) and two data buffers used
// alternately, so one synchronisation per exchange is enough (a rank writes buffer k % 2 only
// after every rank has finished reading it two exchanges ago). Waiting spins, then yields; never
// sleeps on the hot path, never forever: HP_TIMEOUT_S applies and a dead peer is noticed; the
// error names the ranks that did not arrive. The segment is unlinked as soon as every rank has
// mapped it, so nothing is left in /dev/shm, whatever happens to the ranks afterwards.
#include <c10/core/ScalarType.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <hyper_parallel/runtime/reduce_op.h>

#include <c10/util/intrusive_ptr.h>

#include <atomic>

#include "../transport.h"

namespace c10d {
class Store;
}

namespace hyper_parallel {

class ShmTransport : public Transport {
 public:
  /// Collective over the group's members (global `ranks`, this process at `rank` in it): every
  /// member creates it with the same `name` (unique per job and group) through `store`.
  static std::unique_ptr<ShmTransport> create(const c10::intrusive_ptr<c10d::Store>& store, const std::string& name,
                                              int64_t rank, const std::vector<int64_t>& ranks,
                                              std::chrono::milliseconds timeout);
  ~ShmTransport() override;

  const char* name() const override { return "shm"; }
  c10::DeviceType device_type() const override { return c10::DeviceType::CPU; }
  /// Sums and averages in rank order, bf16/fp16 in fp32, a NaN wins max/min; no reduce_scatter
  /// (an all_to_all and a local reduction read the same bytes); done when the call returns.
  TransportCapabilities capabilities() const override;
  Completion all_gather(const at::Tensor& in, const at::Tensor& out) override;
  Completion all_reduce(const at::Tensor& buf, ReduceOp op) override;
  Completion all_to_all(const at::Tensor& in, const at::Tensor& out) override;
  Completion all_to_all_v(const at::Tensor& in, const at::Tensor& out, const std::vector<int64_t>& in_splits,
                          const std::vector<int64_t>& out_splits) override;
  Completion broadcast(const at::Tensor& buf, int64_t src) override;
  Completion scatter(const at::Tensor& in, const at::Tensor& out, int64_t src) override;
  Completion barrier() override;

  // The same on host memory (what the Tensor overloads call).

  /// In place over `numel` contiguous elements of `dtype` (floating, integer or byte types; bf16
  /// and fp16 are accumulated in fp32). Every rank gets the same bits: each element is reduced in
  /// rank order 0, 1, ...
  void all_reduce(void* data, int64_t numel, c10::ScalarType dtype, ReduceOp op);
  /// `out` receives every rank's `bytes` bytes of `in`, in rank order.
  void all_gather(const void* in, void* out, size_t bytes);
  /// `in` holds size() blocks of `block` bytes, block j for rank j; `out` receives block `rank`
  /// of every rank, in rank order.
  void all_to_all(const void* in, void* out, size_t block);
  /// Blocks of any size: send[j] bytes of `in` (consecutive blocks) go to rank j, and `out`
  /// receives recv[p] bytes from rank p, in rank order. The ranks first exchange every size, so
  /// a size that disagrees with its peer's is an error on every rank, before any data moves.
  void all_to_all_v(const void* in, void* out, const std::vector<size_t>& send, const std::vector<size_t>& recv,
                    size_t row_bytes);
  void broadcast(void* data, size_t bytes, int64_t src);
  /// `src`'s `in` holds size() blocks of `block` bytes; every rank receives its block in `out`.
  void scatter(const void* in, void* out, size_t block, int64_t src);
  void barrier_now();

  int64_t size() const { return static_cast<int64_t>(ranks_.size()); }

 private:
  ShmTransport() = default;
  // Per rank, at the start of its slice of the segment.
  static constexpr size_t kLabelBytes = 96;  // of a label's text kept for the error (the hash decides)
  struct Control {
    alignas(64) std::atomic<uint64_t> arrived;
    int32_t pid;
    // What each rank is doing, per parity of the exchange that starts a collective: ranks that
    // call different collectives or sizes are told so at its first synchronisation (all of them
    // alike), instead of reading each other's buffers wrongly.
    uint32_t kind[2];
    uint64_t bytes[2];
    // The collective's label (CollectiveLabel): its hash, compared with kind and size, and its
    // text, read only to name every rank's label when they differ.
    uint64_t label_hash[2];
    char label[2][kLabelBytes];
  };
  static_assert(sizeof(std::atomic<uint64_t>) == 8 && std::atomic<uint64_t>::is_always_lock_free,
                "the arrival counters must be lock-free to work across processes");
  static constexpr size_t kControlBytes = 256;
  static_assert(sizeof(Control) <= kControlBytes, "a rank's control line outgrew its slot");
  Control* control(int64_t r) const;
  unsigned char* buffer(int64_t r, uint64_t step) const;
  void exchange_blocks(const void* in, void* out, size_t block, int64_t src, const char* what);
  /// Records what this rank is about to do (checked against every rank at the next sync).
  void begin(uint32_t kind, uint64_t bytes);
  void check_agreement(const char* what);
  /// Publishes this rank's arrival at the next phase and waits for every rank's.
  void sync(const char* what);

  std::string name_;
  int64_t rank_ = 0;
  std::vector<int64_t> ranks_;
  std::vector<int> pids_;
  std::chrono::milliseconds timeout_{0};
  size_t buffer_bytes_ = 0;
  size_t stride_ = 0;  // bytes per rank: control line + 2 buffers
  unsigned char* base_ = nullptr;
  size_t mapped_ = 0;
  uint64_t phase_ = 0;
  uint64_t step_ = 0;
  uint64_t check_step_ = 0;
  bool check_pending_ = false;
  std::mutex mutex_;  // collectives on one group from several threads run one at a time
};


}  // namespace hyper_parallel
