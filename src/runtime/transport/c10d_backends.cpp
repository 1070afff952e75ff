// The one place that creates c10d backends, and the only file that includes c10d's
// Gloo (and NCCL) headers. Gloo's headers come from Debian's libgloo-dev (2022), while the Gloo
// inside the 2.x wheel's libtorch is from 2025: this file uses no Gloo type by value (a Device only
// through the shared_ptr libtorch hands out) and is built with hidden visibility, so no inline Gloo
// code or template instantiation of it is exported from our library, where it could take the place
// of libtorch's own (the gloo_symbols test checks the exported symbols).
#include <hyper_parallel/runtime/errors.h>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdlib>

#include "c10d_backends.h"

namespace hyper_parallel {
namespace {

std::shared_ptr<::gloo::transport::Device> gloo_device(const std::string& master_addr) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  if (master_addr == "127.0.0.1" || master_addr == "localhost")
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

// Gloo and NCCL are c10d::Backends behind a c10d::ProcessGroup that routes each device type to
// its backend.
template <typename BackendT>
c10::intrusive_ptr<c10d::ProcessGroup> as_process_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                        int size, c10::intrusive_ptr<BackendT> backend,
                                                        c10::DeviceType device, bool nccl) {
  const auto type = nccl ? c10d::ProcessGroup::BackendType::NCCL : c10d::ProcessGroup::BackendType::GLOO;
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  pg->setDefaultBackend(type);
  pg->setBackend(device, type, c10::intrusive_ptr<c10d::Backend>(std::move(backend)));
  return pg;
}

}  // namespace

c10::intrusive_ptr<c10d::ProcessGroup> make_c10d_process_group(const std::string& backend,
                                                               const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                               int size, std::chrono::milliseconds timeout,
                                                               const std::string& master_addr) {
  if (backend == "gloo") {
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    opts->devices.push_back(gloo_device(master_addr));
    return as_process_group(store, rank, size, c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts),
                            c10::DeviceType::CPU, false);
  }
#ifdef USE_C10D_NCCL
  if (backend == "nccl") {
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    // Later than ours: the NCCL transport's watcher reports a missing rank at `timeout`, before
    // NCCL's watchdog would end the process without naming it.
    opts->timeout = timeout * 2 + std::chrono::milliseconds(60000);
    return as_process_group(store, rank, size, c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts),
                            c10::DeviceType::CUDA, true);
  }
#endif
  HP_CHECK_T(c10::ValueError, false, "hyper_parallel::init_process_group: no collective backend '", backend,
             "' in this libtorch build (available: gloo for cpu",
#ifdef USE_C10D_NCCL
             ", nccl for cuda",
#endif
             ")");
  return {};
}

}  // namespace hyper_parallel
