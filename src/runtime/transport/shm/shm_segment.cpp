// The shared-memory transport's segment: created by the group's rank 0, mapped by every member
// (rendezvous through the store), and unlinked once all have mapped it.
#include "shm_transport.h"

#include "../../rank_list.h"

#include <hyper_parallel/runtime/errors.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace hyper_parallel {
namespace {

constexpr size_t kDefaultBufferBytes = size_t{1} << 20;  // per rank and buffer

}  // namespace

std::unique_ptr<ShmTransport> ShmTransport::create(const c10::intrusive_ptr<c10d::Store>& store,
                                                   const std::string& name, int64_t rank,
                                                   const std::vector<int64_t>& ranks,
                                                   std::chrono::milliseconds timeout) {
  std::unique_ptr<ShmTransport> t(new ShmTransport());
  t->name_ = name;
  t->rank_ = rank;
  t->ranks_ = ranks;
  t->timeout_ = timeout;
  t->buffer_bytes_ = kDefaultBufferBytes;
  if (const char* b = std::getenv("HP_SHM_BUFFER_KIB")) t->buffer_bytes_ = std::max<size_t>(4, std::strtoull(b, nullptr, 10)) << 10;
  t->stride_ = kControlBytes + 2 * t->buffer_bytes_;
  t->mapped_ = t->stride_ * ranks.size();
  const std::string ready = "shm/" + name + "/ready", mapped = "shm/" + name + "/mapped";
  int fd = -1;
  if (rank == 0) {
    fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST) {  // a leftover of a killed job with the same name
      ::shm_unlink(name.c_str());
      fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    }
    TORCH_CHECK(fd >= 0, "hyper_parallel::ShmTransport::create: cannot create the shared-memory segment ", name, ": ", std::strerror(errno));
    if (::ftruncate(fd, static_cast<off_t>(t->mapped_)) != 0) {
      const int err = errno;
      ::close(fd);
      ::shm_unlink(name.c_str());
      TORCH_CHECK(false, "hyper_parallel::ShmTransport::create: cannot size the shared-memory segment ", name, " to ", t->mapped_,
                  " bytes: ", std::strerror(err), " (is /dev/shm large enough? HP_TRANSPORT=gloo avoids it)");
    }
    store->set(ready, std::vector<uint8_t>{1});
  } else {
    store->wait({ready}, timeout);
    fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
    TORCH_CHECK(fd >= 0, "hyper_parallel::ShmTransport::create: cannot open the shared-memory segment ", name, ": ", std::strerror(errno));
  }
  void* p = ::mmap(nullptr, t->mapped_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  TORCH_CHECK(p != MAP_FAILED, "hyper_parallel::ShmTransport::create: cannot map the shared-memory segment ", name, ": ", std::strerror(err));
  t->base_ = static_cast<unsigned char*>(p);
  Control* mine = t->control(rank);
  mine->pid = static_cast<int32_t>(::getpid());
  // Once every rank has mapped it, the name goes: the memory lives as long as a mapping does,
  // and a crash of any rank leaves nothing behind in /dev/shm.
  store->add(mapped, 1);
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (store->add(mapped, 0) < static_cast<int64_t>(ranks.size())) {
    TORCH_CHECK(std::chrono::steady_clock::now() < until, "hyper_parallel::ShmTransport::create: not every rank of [", join_ranks(ranks),
                "] mapped the shared-memory segment within the timeout");
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  ::shm_unlink(name.c_str());  // every rank tries; the first one wins
  for (size_t r = 0; r < ranks.size(); ++r) t->pids_.push_back(t->control(static_cast<int64_t>(r))->pid);
  return t;
}

ShmTransport::~ShmTransport() {
  if (base_ != nullptr) ::munmap(base_, mapped_);
}

ShmTransport::Control* ShmTransport::control(int64_t r) const {
  return reinterpret_cast<Control*>(base_ + static_cast<size_t>(r) * stride_);
}

unsigned char* ShmTransport::buffer(int64_t r, uint64_t step) const {
  return base_ + static_cast<size_t>(r) * stride_ + kControlBytes + (step % 2) * buffer_bytes_;
}

}  // namespace hyper_parallel
