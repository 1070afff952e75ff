#pragma once
// What a Group holds (internal to runtime/): its members, its c10d process group (the rendezvous
// of its transport, and what users reach through c10d_interop.h) and its transport; and what the
// c10d-backed transports (Gloo, NCCL) share.
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <hyper_parallel/runtime/process_group.h>

#include "transport/transport.h"

namespace hyper_parallel {

struct Group::Impl {
  int64_t rank = 0;
  std::vector<int64_t> ranks;
  std::string device_type;
  c10::intrusive_ptr<c10d::ProcessGroup> pg;  // null in a fake world
  // For naming the ranks that did not arrive when a collective fails (through the job's store).
  std::string prefix;
  std::atomic<uint64_t> seq{0};  // c10d collectives issued on this group by this rank (numbered at issue)
  std::unique_ptr<Transport> transport;
  // What carries send/recv when `transport` does not (a shared-memory group: its Gloo process group).
  std::unique_ptr<Transport> peer_transport;
};

/// The group's transport (the group must be defined).
Transport& transport_of(const Group& group);

/// The transport that carries the group's point-to-point transfers.
Transport& peer_transport_of(const Group& group);

/// Waits for `work`, collective `what` issued on `g` as its #`seq` (`++g.seq` when it was
/// issued); when it fails, raises a c10::Error naming the members that did not reach it (asked
/// through the job's store).
/// `label` is the collective's CollectiveLabel at issue ("" when none). `compare_when_stalled`
/// (host transports): a collective still running after half a second compares, through the
/// store, with the peers waiting on the same collective number, and stops at once on every rank
/// when they are in another collective (a host transport would wait for the timeout).
void wait_c10d_work(Group::Impl& g, const char* what, uint64_t seq, const c10::intrusive_ptr<c10d::Work>& work,
                    const std::string& label = "", bool compare_when_stalled = false);

/// Waits for `work`, a point-to-point `what` ("send" or "recv") with group rank `peer` and `tag`;
/// when it fails (the peer died, or the timeout passed), raises a c10::Error naming the peer.
void wait_peer_work(Group::Impl& g, const char* what, int64_t peer, int64_t tag, const c10::intrusive_ptr<c10d::Work>& work);

/// The message for collective `what` (#`seq` on `g`, labelled `label`) that failed with `cause`:
/// the members that did not arrive and what every member that failed too was in, found through
/// the job's store within a short grace period.
std::string failed_collective_report(Group::Impl& g, const char* what, uint64_t seq, const std::string& cause,
                                     const std::string& label = "");

/// Every member's description of its collective #`seq` on `g` (this rank's is `mine`), in group
/// rank order, exchanged through the job's store: for a mismatch every member has detected, when
/// the group's own collectives can no longer be trusted to pair. A member that does not say within
/// a few seconds is described as such.
std::vector<std::string> collective_descriptions(Group::Impl& g, uint64_t seq, const std::string& mine);

/// Transports made for a group (gloo_transport.cpp, nccl_transport.cpp); `timeout` is the job's.
std::unique_ptr<Transport> make_gloo_transport(Group::Impl& g);
std::unique_ptr<Transport> make_nccl_transport(Group::Impl& g, std::chrono::milliseconds timeout);
/// The transport of a fake world's group (fake_transport.cpp): no peers, documented values.
std::unique_ptr<Transport> make_fake_transport(Group::Impl& g);

/// The c10d reduction of `op`.
inline c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return c10d::ReduceOp::SUM;
    case ReduceOp::AVG: return c10d::ReduceOp::AVG;
    case ReduceOp::MAX: return c10d::ReduceOp::MAX;
    case ReduceOp::MIN: return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

/// `t` as c10d's list form of `g` equal pieces: one list of its rows ([g, -1] views).
inline std::vector<std::vector<at::Tensor>> as_row_list(const at::Tensor& t, int64_t g) {
  const at::Tensor rows = t.view({g, -1});
  std::vector<std::vector<at::Tensor>> list(1);
  for (int64_t j = 0; j < g; ++j) list[0].push_back(rows[j]);
  return list;
}

}  // namespace hyper_parallel
