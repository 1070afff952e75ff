#pragma once
// What a Group holds (internal to runtime/): its members, its c10d process group (the rendezvous
// of its transport, and what users reach through c10d_interop.h) and its transport.
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <hyper_parallel/runtime/process_group.h>

#include "transport.h"

namespace hyper_parallel {

struct Group::Impl {
  int64_t rank = 0;
  std::vector<int64_t> ranks;
  std::string device_type;
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  // For naming the ranks that did not arrive when a collective fails (through the job's store).
  std::string prefix;
  std::atomic<uint64_t> seq{0};  // c10d collectives issued on this group by this rank
  std::unique_ptr<Transport> transport;
};

/// The group's transport (the group must be defined).
Transport& transport_of(const Group& group);

/// Waits for `work`, collective `what` issued on `g`; when it fails, raises a c10::Error naming
/// the members that did not reach it (asked through the job's store).
void wait_c10d_work(Group::Impl& g, const char* what, const c10::intrusive_ptr<c10d::Work>& work);

/// The message for collective `what` (#`seq` on `g`) that failed with `cause`: the members that
/// did not arrive, found through the job's store within a short grace period.
std::string failed_collective_report(Group::Impl& g, const char* what, uint64_t seq, const std::string& cause);

/// The job's collective timeout (HP_TIMEOUT_S or InitOptions::timeout).
std::chrono::milliseconds job_timeout();

/// Transports made for a group (gloo_transport.cpp, nccl_transport.cpp).
std::unique_ptr<Transport> make_gloo_transport(Group::Impl& g);
std::unique_ptr<Transport> make_nccl_transport(Group::Impl& g);

}  // namespace hyper_parallel
