#pragma once
// Collectives on a Group, device-agnostic and autograd-free (the DTensor layer wraps them in
// autograd functions). Each records itself in active CommDebugModes when it is issued. The plain
// calls complete before they return (on CUDA: their result is ordered on the current stream);
// the *_async ones return a Work whose wait() completes them. A tensor on another device than the
// group's transport moves (a CUDA tensor on a shared-memory or Gloo group) is staged through host
// memory; one that cannot be staged (a CPU tensor on an NCCL group, a meta tensor) is refused.
// Uneven shards follow torch.chunk: a dim of size n split over g ranks gives ceil(n/g) to the
// leading ranks and less (or nothing) to the trailing ones.
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <hyper_parallel/runtime/process_group.h>
#include <hyper_parallel/runtime/reduce_op.h>

#include <functional>
#include <vector>

namespace hyper_parallel {

/// An issued collective, as c10d's Work: wait() completes it and returns its result. On the
/// host transports a collective runs on the transport's own threads (Gloo) or within the call
/// itself (shared memory: nothing is left for wait()); on NCCL, wait() orders the current stream
/// after it without blocking the host. Collectives on one group complete in the order they were
/// issued on every rank, so handles may be waited for in any order. A Work that is destroyed
/// unwaited completes its collective first.
/// e.g. `hp::Work w = hp::all_gather_async(x, 0, g); y = f(z); at::Tensor full = w.wait();`
class Work {
 public:
  Work() = default;
  /// A collective whose completion `finish` runs (once) and whose result it returns.
  explicit Work(std::function<at::Tensor()> finish) : finish_(std::move(finish)) {}
  /// Already complete.
  static Work completed(at::Tensor result);
  Work(Work&& o) noexcept;
  Work& operator=(Work&& o) noexcept;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  ~Work();

  /// Completes the collective (the first call) and returns its result.
  at::Tensor wait();
  /// Whether wait() has nothing left to do.
  bool is_completed() const { return !finish_; }

 private:
  // Completes a collective nobody waited for; a failure becomes a warning (`event` says why).
  void complete_unwaited(const char* event) noexcept;
  std::function<at::Tensor()> finish_;
  at::Tensor result_;
};

/// Concatenates every rank's `local` along `dim`. `full_size` is the size of the result along
/// `dim`; when the shards are uneven (torch.chunk of full_size) it must be given, otherwise all
/// shards are taken to be as large as this rank's.
/// e.g. rank r holds rows of torch.chunk(x, g)[r]: `all_gather(local, 0, g, x.size(0))` == x.
at::Tensor all_gather(const at::Tensor& local, int64_t dim, const Group& group,
                      c10::optional<int64_t> full_size = c10::nullopt);

/// all_gather, returning at once; wait() gives the gathered tensor.
Work all_gather_async(const at::Tensor& local, int64_t dim, const Group& group,
                      c10::optional<int64_t> full_size = c10::nullopt);

/// Reduces `tensor` across the group in place and returns it.
at::Tensor& all_reduce_(at::Tensor& tensor, ReduceOp op, const Group& group);
/// all_reduce_, returning at once; `tensor` holds the result after wait(), which returns it.
Work all_reduce_async(at::Tensor& tensor, ReduceOp op, const Group& group);
/// Out-of-place all_reduce; `tensor` is left untouched.
at::Tensor all_reduce(const at::Tensor& tensor, ReduceOp op, const Group& group);

/// Reduces `input` (same shape on every rank) and returns this rank's torch.chunk piece along
/// `dim`. Native on NCCL; elsewhere one all-to-all plus a local reduction (as many bytes);
/// counted as one "reduce_scatter" either way.
at::Tensor reduce_scatter(const at::Tensor& input, ReduceOp op, int64_t dim, const Group& group);
/// reduce_scatter, returning at once; wait() gives this rank's piece.
Work reduce_scatter_async(const at::Tensor& input, ReduceOp op, int64_t dim, const Group& group);

/// Splits `local` along `split_dim` into group-size torch.chunk pieces, sends piece j to rank j,
/// and concatenates what arrives along `concat_dim` in rank order. `concat_full_size` is the
/// size of the result along concat_dim when the peers' pieces are uneven.
at::Tensor all_to_all(const at::Tensor& local, int64_t split_dim, int64_t concat_dim,
                      const Group& group, c10::optional<int64_t> concat_full_size = c10::nullopt);

/// PyTorch's all_to_all_single with split sizes, along dim 0: rows
/// [sum(input_split_sizes[0..j)), +input_split_sizes[j]) of `input` go to group rank j, and the
/// result holds output_split_sizes[p] rows from each rank p, in rank order (its other dims are
/// `input`'s). A split may be 0, and a rank may send or receive nothing; every rank takes part.
/// Empty split lists mean equal splits (the size of dim 0 divided by the group size). Each rank's
/// output_split_sizes[p] must be what rank p sends it (usually exchanged first with an even
/// all_to_all of the counts); the shared-memory transport checks that on every rank, the others
/// with HP_DEBUG_COLLECTIVES=1. c10::ValueError on lists of the wrong length, negative sizes, or
/// input splits that do not add up to dim 0. In a fake world, a meta tensor gives the result's
/// shape; a real one, what this rank sends itself from every rank.
/// e.g. `at::Tensor got = hp::all_to_all_single(tokens, recv_counts, send_counts, ep_group);`
at::Tensor all_to_all_single(const at::Tensor& input, const std::vector<int64_t>& output_split_sizes,
                             const std::vector<int64_t>& input_split_sizes, const Group& group);
/// all_to_all_single, returning at once; wait() gives the received rows.
Work all_to_all_single_async(const at::Tensor& input, const std::vector<int64_t>& output_split_sizes,
                             const std::vector<int64_t>& input_split_sizes, const Group& group);

/// Overwrites `tensor` on every rank with group rank `src`'s values.
at::Tensor& broadcast_(at::Tensor& tensor, int64_t src, const Group& group);

/// Group rank `src` splits `full` along `dim` (torch.chunk); every rank returns its piece.
/// Every rank passes a tensor of the full shape and dtype; only `src`'s values are read.
at::Tensor scatter(const at::Tensor& full, int64_t dim, int64_t src, const Group& group);

/// Waits until every rank of the group arrives.
void barrier(const Group& group);

}  // namespace hyper_parallel
