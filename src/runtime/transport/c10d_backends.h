#pragma once
// The c10d process group of one group of ranks (internal to the runtime).
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>

namespace hyper_parallel {

/// A c10d process group of `backend` ("gloo", or "nccl" when libtorch has it) over `store`; a
/// c10::ValueError naming the available ones otherwise. `master_addr` picks
/// Gloo's network device (loopback for a local job) unless GLOO_SOCKET_IFNAME names one.
c10::intrusive_ptr<c10d::ProcessGroup> make_c10d_process_group(const std::string& backend,
                                                               const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                               int size, std::chrono::milliseconds timeout,
                                                               const std::string& master_addr);

}  // namespace hyper_parallel
