#pragma once
// One transport per device behind one interface (internal to runtime/). collectives.cpp is the
// device-agnostic front: it checks the arguments, counts the call in CommDebugMode, pads uneven
// pieces, lays out blocks and stages tensors of another device; a transport only moves contiguous
// buffers of its own device. What a transport cannot do natively it says in its capabilities, and
// the front emulates that the same way for every transport that lacks it, so every transport
// gives the same values. Quirks of one library (Gloo's missing dtypes) stay in its transport.
#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#include <functional>
#include <vector>

#include <hyper_parallel/runtime/reduce_op.h>

namespace hyper_parallel {

/// Finishes a collective a transport issued: waits for it (on a device transport, orders the
/// caller's current stream after it) and runs what must follow. Empty when the call itself
/// completed the collective.
using Completion = std::function<void()>;

/// What a transport does natively.
struct TransportCapabilities {
  bool reduce_scatter = false;  ///< reduce_scatter(); otherwise all_to_all plus a local reduction
  bool average = false;         ///< ReduceOp::AVG; otherwise a sum, then a division
  bool reduce_16bit = false;    ///< adds bf16 and fp16 itself; otherwise they are reduced in fp32
  bool nan_max_min = false;     ///< max/min let a NaN win (torch.maximum); otherwise NaN flags travel along
  bool asynchronous = false;    ///< a collective may still run when the call returns
  /// No peers (a fake world): every rank is taken to hold this rank's tensors, so a scatter's
  /// source data is handed over on every rank.
  bool simulated = false;
  /// send() and recv(); otherwise the group's c10d process group carries them (Gloo).
  bool point_to_point = false;
  /// Compares every collective's label (CollectiveLabel) across the ranks itself, for free.
  bool checks_labels = false;
};

/// One transfer of a batch of point-to-point operations: `buf` (contiguous, on the transport's
/// device) goes to group rank `peer` (send) or is filled from it (recv). `tag` is the caller's;
/// `match` (< 2^31) is what the transport matches on where it has tags: the tag mixed with the
/// byte count and dtype, so that a recv never takes a message of another size (Gloo would).
struct PeerTransfer {
  bool send = true;
  at::Tensor buf;
  int64_t peer = 0;
  int64_t tag = 0;
  int64_t match = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  /// "shm", "gloo", "nccl".
  virtual const char* name() const = 0;
  /// Where the buffers it moves live.
  virtual c10::DeviceType device_type() const = 0;
  virtual TransportCapabilities capabilities() const = 0;

  // Every buffer is contiguous, non-empty, on device_type(), of the same dtype and size on every
  // rank. Booleans arrive as bytes (max for or, min for and).

  /// `out` (size() * in.numel() elements) receives every rank's `in`, in rank order.
  virtual Completion all_gather(const at::Tensor& in, const at::Tensor& out) = 0;
  /// Reduces `buf` in place; AVG only when capabilities().average.
  virtual Completion all_reduce(const at::Tensor& buf, ReduceOp op) = 0;
  /// `in` holds size() blocks; `out` (one block) receives the reduction of block `rank` of every
  /// rank. Called only when capabilities().reduce_scatter.
  virtual Completion reduce_scatter(const at::Tensor& in, const at::Tensor& out, ReduceOp op) {
    TORCH_INTERNAL_ASSERT(false, "the ", name(), " transport has no native reduce_scatter (the front emulates it)");
  }
  /// `in` holds size() blocks, block j for rank j; `out` receives block `rank` of every rank, in
  /// rank order.
  virtual Completion all_to_all(const at::Tensor& in, const at::Tensor& out) = 0;
  /// Variable blocks: `in` and `out` are [rows, row] (the same row on every rank); rows
  /// [sum(in_splits[0..j)), +in_splits[j]) of `in` go to rank j, and `out` receives out_splits[p]
  /// rows from rank p, in rank order. Either may have no rows on a rank; every rank takes part.
  virtual Completion all_to_all_v(const at::Tensor& in, const at::Tensor& out, const std::vector<int64_t>& in_splits,
                                  const std::vector<int64_t>& out_splits) = 0;
  virtual Completion broadcast(const at::Tensor& buf, int64_t src) = 0;
  /// `src`'s `in` holds size() blocks (undefined on the other ranks); every rank receives its
  /// block in `out`.
  virtual Completion scatter(const at::Tensor& in, const at::Tensor& out, int64_t src) = 0;
  virtual Completion barrier() = 0;
  /// Issues every transfer of `ops` (with NCCL, as one group call, so that two ranks that both
  /// send first do not wait on each other) and returns one Completion per transfer, in order.
  /// Transfers between one pair with one tag are matched in the order they were issued. Called
  /// only when capabilities().point_to_point.
  virtual std::vector<Completion> peer_transfers(const std::vector<PeerTransfer>& ops) {
    TORCH_INTERNAL_ASSERT(false, "the ", name(), " transport has no point-to-point transfers (the group's Gloo process group carries them)");
  }
};

}  // namespace hyper_parallel
