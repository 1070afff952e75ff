#pragma once
// Point-to-point transfers on a Group, as PyTorch's send / recv / isend / irecv /
// batch_isend_irecv: what a pipeline stage hands to the next. Peers are ranks *within* the
// group (PyTorch's group_dst / group_src), as src is for broadcast_. Every transport carries
// them: Gloo and NCCL natively (NCCL batches as one group call), a shared-memory group through
// its Gloo process group, a fake world without communicating (a recv leaves its buffer as it is).
// A CUDA tensor on a host transport is staged through host memory.
#include <ATen/core/Tensor.h>

#include <hyper_parallel/runtime/collectives.h>
#include <hyper_parallel/runtime/process_group.h>

#include <vector>

namespace hyper_parallel {

/// One operation of batch_isend_irecv (PyTorch's P2POp): send `tensor` to group rank `peer` of
/// `group`, or receive into `tensor` from it, matched by `tag` (>= 0). Transfers between one pair
/// with one tag match in the order they are issued; different tags match independently.
/// e.g. `hp::P2POp::irecv(grad, next, pp_group, 7)`
struct P2POp {
  enum class Kind { isend, irecv };
  Kind kind = Kind::isend;
  at::Tensor tensor;
  int64_t peer = 0;
  Group group;
  int64_t tag = 0;
  static P2POp isend(at::Tensor tensor, int64_t peer, Group group, int64_t tag = 0) {
    return {Kind::isend, std::move(tensor), peer, std::move(group), tag};
  }
  static P2POp irecv(at::Tensor tensor, int64_t peer, Group group, int64_t tag = 0) {
    return {Kind::irecv, std::move(tensor), peer, std::move(group), tag};
  }
};

/// Issues every operation of `ops` (one group, at least one op) and returns one Work per op, in
/// order: a recv's wait() fills its tensor and returns it, a send's returns the tensor sent. Ranks
/// that exchange in both directions put both in one batch. A send matches a recv of the same
/// tag, dtype and number of elements (anything else never matches: it is not misread). Waits may
/// come in any order; a peer that exits, or never issues the matching op, makes wait() raise,
/// naming it, within HP_TIMEOUT_S (at once when its process is gone).
/// e.g. `auto w = hp::batch_isend_irecv({hp::P2POp::isend(act, 1, g), hp::P2POp::irecv(grad, 1, g)}); w[1].wait();`
std::vector<Work> batch_isend_irecv(const std::vector<P2POp>& ops);

/// Sends `tensor` to group rank `dst`; wait() completes once the peer has taken it.
Work isend(const at::Tensor& tensor, int64_t dst, const Group& group, int64_t tag = 0);
/// Receives into `tensor` (its shape and dtype say what arrives) from group rank `src`.
Work irecv(const at::Tensor& tensor, int64_t src, const Group& group, int64_t tag = 0);
/// isend(...).wait().
void send(const at::Tensor& tensor, int64_t dst, const Group& group, int64_t tag = 0);
/// irecv(...).wait(): `tensor` holds what `src` sent.
at::Tensor& recv(at::Tensor& tensor, int64_t src, const Group& group, int64_t tag = 0);

}  // namespace hyper_parallel
