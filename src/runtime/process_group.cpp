// Process-group lifetime and the single place where a c10d backend is chosen for a device.
#include <hyper_parallel/runtime/c10d_interop.h>
#include <hyper_parallel/runtime/errors.h>
#include <hyper_parallel/runtime/launch_env.h>
#include <hyper_parallel/runtime/process_group.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "transport/c10d_backends.h"
#include "group_impl.h"
#include "rank_list.h"
#include "transport/shm/shm_transport.h"

namespace hyper_parallel {


struct GroupAccess {
  static Group::Impl& impl(const Group& g) { return *g.impl_; }
};

Transport& transport_of(const Group& group) {
  TORCH_CHECK(group.defined(), "hyper_parallel::Group: use of an undefined Group");
  return *GroupAccess::impl(group).transport;
}

Transport& peer_transport_of(const Group& group) {
  Group::Impl& g = GroupAccess::impl(group);
  return g.peer_transport ? *g.peer_transport : *g.transport;
}

int64_t Group::rank() const { return impl_->rank; }
int64_t Group::size() const { return static_cast<int64_t>(impl_->ranks.size()); }
const std::vector<int64_t>& Group::ranks() const { return impl_->ranks; }
const std::string& Group::device_type() const { return impl_->device_type; }
std::string Group::backend_name() const { return impl_->pg ? impl_->pg->getBackendName() : std::string("fake"); }
std::string Group::transport() const { return impl_->transport->name(); }

const c10::intrusive_ptr<c10d::ProcessGroup>& c10d_group(const Group& group) {
  TORCH_CHECK(group.defined(), "hyper_parallel::c10d_group: use of an undefined Group");
  require_real_world("c10d_group", "a c10d process group with real peers");
  return GroupAccess::impl(group).pg;
}

namespace {

struct State {
  std::mutex mutex;
  bool initialized = false;
  bool fake = false;  // init_fake_process_group: no store, no peers
  LaunchEnv env;
  std::chrono::milliseconds timeout{300000};
  std::string device_type;
  c10::intrusive_ptr<c10d::Store> store;
  Group world;
  std::map<std::vector<int64_t>, Group> groups;
};

State& state() {
  static State s;
  return s;
}

const State& initialized_state() {
  const State& s = state();
  TORCH_CHECK(s.initialized,
              "hyper_parallel::init_process_group: the process group is not initialized; call "
              "hyper_parallel::init_process_group() first");
  return s;
}

std::string message_of(const std::exception& e) {
  if (auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

// This host: its name and boot id (two containers or network namespaces with their own names are
// different hosts; processes of one host share /dev/shm).
std::string host_identity() {
  char name[256] = {0};
  ::gethostname(name, sizeof name - 1);
  std::string boot;
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char b[64] = {0};
    if (std::fgets(b, sizeof b, f) != nullptr) boot = b;
    std::fclose(f);
  }
  return std::string(name) + "|" + boot;
}

std::string joined_key(int64_t rank) { return "hp/joined/" + std::to_string(rank); }

// Members of `ranks` that never announced themselves in the store.
std::vector<int64_t> missing_ranks(const State& s, const std::vector<int64_t>& ranks) {
  std::vector<int64_t> out;
  for (int64_t r : ranks) {
    try {
      if (!s.store->check({joined_key(r)})) out.push_back(r);
    } catch (const std::exception&) {
      out.push_back(r);
    }
  }
  return out;
}

// HP_TRANSPORT: "auto" (shared memory for CPU ranks on one host, Gloo across hosts, NCCL for
// CUDA), "shm" (shared memory on one host also for CUDA tensors, staged through the host), "gloo"
// (Gloo for every group, CUDA tensors staged) or "nccl".
struct TransportChoice {
  std::string backend;  // the c10d backend: "gloo" or "nccl"
  bool shm_when_local = false;
};

TransportChoice choose_transport(const std::string& device_type) {
  const char* v = std::getenv("HP_TRANSPORT");
  const std::string t = v == nullptr || *v == '\0' ? "auto" : v;
  HP_CHECK_T(c10::ValueError, t == "auto" || t == "shm" || t == "gloo" || t == "nccl", "hyper_parallel::init_process_group: environment variable HP_TRANSPORT='",
             t, "' must be 'auto' (shared memory on one host and Gloo across hosts for cpu, NCCL for cuda), 'shm', ",
             "'gloo' or 'nccl'");
  const bool host = device_type == "cpu";
  HP_CHECK_T(c10::ValueError, !(t == "nccl" && host), "hyper_parallel::init_process_group: HP_TRANSPORT=nccl moves CUDA tensors, but the process group's ",
             "device type is 'cpu'");
  if (t == "gloo") return {"gloo", false};
  if (t == "shm" || (t == "auto" && host)) return {"gloo", true};
  return {device_type == "cuda" ? "nccl" : device_type, false};  // make_c10d_process_group names what exists
}

// The store key where group rank `r` of the group `prefix` names says which collective it has been waiting on longest
// (one per member, made with the group and overwritten since: the keys do not pile up).
std::string stalled_key(const std::string& prefix, int64_t r) { return c10::str("hp/stalled/", prefix, "/", r); }

Group make_group(State& s, const std::vector<int64_t>& ranks, const std::string& prefix) {
  auto impl = std::make_shared<Group::Impl>();
  impl->ranks = ranks;
  impl->device_type = s.device_type;
  impl->rank = -1;
  for (size_t i = 0; i < ranks.size(); ++i)
    if (ranks[i] == s.env.rank) impl->rank = static_cast<int64_t>(i);
  impl->prefix = prefix;
  if (s.fake) {
    impl->transport = make_fake_transport(*impl);
    return Group(std::move(impl));
  }
  auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, s.store);
  // Before the process group's rendezvous: once any member issues a collective, every member's
  // key exists for a stalled collective to read (wait_comparing_when_stalled).
  s.store->set(stalled_key(prefix, impl->rank), std::vector<uint8_t>{});
  const TransportChoice choice = choose_transport(s.device_type);
  try {
    impl->pg = make_c10d_process_group(choice.backend, store, static_cast<int>(impl->rank),
                                       static_cast<int>(ranks.size()), s.timeout, s.env.master_addr);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "hyper_parallel::new_group: creating the process group of ranks [", join_ranks(ranks),
                "] failed on rank ", s.env.rank, " after a timeout of ", s.timeout.count() / 1000.0,
                " s (HP_TIMEOUT_S); ranks that never joined the job: [", join_ranks(missing_ranks(s, ranks)),
                "]. Cause: ", message_of(e));
  }
  // Shared memory when every member is on this host, decided from host identities exchanged
  // through the store (not from environment variables: a sub-group of a multi-host job may well
  // live on one host, and LOCAL_WORLD_SIZE says nothing about it).
  if (choice.shm_when_local && ranks.size() > 1) {
    try {
      const std::string me = host_identity();
      store->set("host/" + std::to_string(impl->rank), std::vector<uint8_t>(me.begin(), me.end()));
      bool local = true;
      for (size_t r = 0; r < ranks.size(); ++r) {
        const auto other = store->get("host/" + std::to_string(r));
        local = local && std::string(other.begin(), other.end()) == me;
      }
      if (local) {
        // The group's rank 0 names the segment, the others take its name: ranks of one host may
        // come from different launchers. hprun names its job (HP_JOB_ID) and removes
        // /dev/shm/hp_<job>_* when the job ends, in case a rank died between creating a segment
        // and the unlink that follows the mapping.
        if (impl->rank == 0) {
          std::random_device rd;
          const char* job = std::getenv("HP_JOB_ID");
          const std::string name = "/hp_" + std::string(job != nullptr ? job : "0") + "_" + std::to_string(rd()) +
                                   std::to_string(rd());
          store->set("shm_name", std::vector<uint8_t>(name.begin(), name.end()));
        }
        const auto name = store->get("shm_name");
        impl->transport = ShmTransport::create(store, std::string(name.begin(), name.end()), impl->rank, ranks, s.timeout);
      }
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "hyper_parallel::new_group: setting up the shared-memory transport of ranks [", join_ranks(ranks),
                  "] failed on rank ", s.env.rank, " (HP_TRANSPORT=gloo avoids it): ", message_of(e));
    }
  }
  if (!impl->transport) impl->transport = choice.backend == "nccl" ? make_nccl_transport(*impl, s.timeout) : make_gloo_transport(*impl);
  // Shared memory moves collectives only: send and recv go through the group's Gloo process group
  // (one host, so loopback), which is already connected.
  if (!impl->transport->capabilities().point_to_point) impl->peer_transport = make_gloo_transport(*impl);
  return Group(std::move(impl));
}

}  // namespace

std::string failed_collective_report(Group::Impl& g, const char* what, uint64_t seq, const std::string& cause,
                                     const std::string& label) {
  const State& s = state();
  // Every rank of the group that is still alive and stuck in a collective fails too, and says in
  // the store which collective it was in; the ones that never say so within a grace period did
  // not arrive (stopped, deadlocked, dead or busy elsewhere). The store is asked with a short
  // timeout: if rank 0, which serves it, is the one stopped, that is a finding too.
  const std::string key = "hp/arrived/" + g.prefix;
  const std::string doing = c10::str(what, " #", seq, label.empty() ? std::string() : " for " + label);
  std::vector<int64_t> missing;
  std::vector<std::string> each(g.ranks.size());
  std::string store_note;
  try {
    s.store->setTimeout(std::chrono::milliseconds(2000));
    s.store->set(key + std::to_string(g.rank), std::vector<uint8_t>(doing.begin(), doing.end()));
    const auto grace = std::min<std::chrono::milliseconds>(s.timeout, std::chrono::milliseconds(5000));
    const auto until = std::chrono::steady_clock::now() + grace;
    do {
      missing.clear();
      for (size_t r = 0; r < g.ranks.size(); ++r)
        if (!s.store->check({key + std::to_string(r)})) missing.push_back(g.ranks[r]);
      if (missing.empty()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    } while (std::chrono::steady_clock::now() < until);
    for (size_t r = 0; r < g.ranks.size(); ++r)
      if (std::find(missing.begin(), missing.end(), g.ranks[r]) == missing.end()) {  // it said what it was in
        const auto v = s.store->get(key + std::to_string(r));
        each[r] = std::string(v.begin(), v.end());
      }
    // The store lives in global rank 0: when it is a member, it stays until the others that
    // arrived have read it too (a short while), or their reports would lose every rank's part.
    const std::string read = "hp/reported/" + g.prefix;
    s.store->set(read + std::to_string(g.rank), std::vector<uint8_t>{1});
    if (s.env.rank == 0) {
      const auto linger = std::chrono::steady_clock::now() + std::chrono::milliseconds(3000);
      for (size_t r = 0; r < g.ranks.size(); ++r)
        while (!each[r].empty() && !s.store->check({read + std::to_string(r)}) && std::chrono::steady_clock::now() < linger)
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (const std::exception&) {
    store_note = " (the rendezvous store on rank 0 does not answer either: rank 0 is probably the one stopped)";
    if (missing.empty()) missing.push_back(g.ranks[0]);
  }
  std::string arrived;
  bool same = true;
  for (size_t r = 0; r < g.ranks.size(); ++r) {
    if (each[r].empty()) continue;
    arrived += c10::str(arrived.empty() ? "rank " : "; rank ", g.ranks[r], " was in ", each[r]);
    same = same && each[r] == doing;
  }
  const std::string where = c10::str("hyper_parallel: ", doing, " on the group of ranks [", join_ranks(g.ranks), "] failed on rank ",
                                     g.ranks[static_cast<size_t>(g.rank)]);
  const std::string was_in = arrived.empty() ? std::string() : " (" + arrived + ")";
  if (!missing.empty())
    return c10::str(where, " after up to ", s.timeout.count() / 1000.0, " s (HP_TIMEOUT_S): rank(s) [", join_ranks(missing),
                    "] did not arrive (stopped, deadlocked, exited or busy elsewhere)", store_note, was_in, ". Cause: ", cause);
  if (!same)
    return c10::str(where, ": the ranks were in different collectives", was_in,
                    "; every rank must issue the same collectives in the same order. Cause: ", cause);
  return c10::str(where, " although every rank of the group reached it", was_in, ". Cause: ", cause);
}

std::vector<std::string> collective_descriptions(Group::Impl& g, uint64_t seq, const std::string& mine) {
  const State& s = state();
  std::vector<std::string> each(g.ranks.size());
  each[static_cast<size_t>(g.rank)] = mine;
  // Keyed by the collective's number: a later mismatch on the same group reads its own entries.
  const std::string key = c10::str("hp/said/", g.prefix, "/", seq, "/");
  try {
    const c10d::StoreTimeoutGuard short_waits(*s.store, std::chrono::milliseconds(5000));
    s.store->set(key + std::to_string(g.rank), std::vector<uint8_t>(mine.begin(), mine.end()));
    for (size_t r = 0; r < g.ranks.size(); ++r) {
      if (static_cast<int64_t>(r) == g.rank) continue;
      try {
        const auto v = s.store->get(key + std::to_string(r));
        each[r] = std::string(v.begin(), v.end());
      } catch (const std::exception&) {
        each[r] = "(did not say within 5 s)";
      }
    }
  } catch (const std::exception&) {
    for (size_t r = 0; r < g.ranks.size(); ++r)
      if (each[r].empty()) each[r] = "(the rendezvous store on rank 0 does not answer)";
  }
  return each;
}

namespace {

// Whether `work` completed within `slice` (rethrowing its own failure); false while it still runs.
bool completed_within(const c10::intrusive_ptr<c10d::Work>& work, std::chrono::milliseconds slice) {
  try {
    return work->wait(slice);
  } catch (const c10::Error&) {
    if (!work->isCompleted()) return false;  // c10d's "Operation timed out!" of the slice
    throw;
  }
}

// A host collective still running after a slice (its peers compute, or are in another collective,
// which a host transport cannot pair with it): this rank says in its store key what it is in
// ("<number>=<collective>"), and reads every member's key once a slice (one request). A member
// waiting on the same number in another collective stops every such rank at once, each naming
// every rank's, instead of at the timeout. Nothing is asked of the store while collectives complete
// within the slice. Returns what every rank was in when they differ (the collective then still
// runs), else "".
std::string wait_comparing_when_stalled(Group::Impl& g, const char* what, uint64_t seq, const c10::intrusive_ptr<c10d::Work>& work,
                                        const std::string& label) {
  constexpr auto kSlice = std::chrono::milliseconds(500);
  if (completed_within(work, kSlice)) return {};
  const State& s = state();
  const std::string doing = c10::str(what, " #", seq, label.empty() ? std::string() : " for " + label);
  const std::string number = c10::str(seq, "=");
  std::vector<std::string> keys;
  for (size_t r = 0; r < g.ranks.size(); ++r) keys.push_back(stalled_key(g.prefix, static_cast<int64_t>(r)));
  try {
    const std::string mine = number + doing;
    s.store->set(keys[static_cast<size_t>(g.rank)], std::vector<uint8_t>(mine.begin(), mine.end()));
    while (!completed_within(work, kSlice)) {
      const auto said = s.store->multiGet(keys);
      std::vector<std::string> each(g.ranks.size());
      bool differs = false;
      for (size_t r = 0; r < said.size(); ++r) {
        const std::string v(said[r].begin(), said[r].end());
        if (v.compare(0, number.size(), number) != 0) continue;  // waiting on another number, or not at all
        each[r] = v.substr(number.size());
        differs = differs || each[r] != doing;
      }
      if (!differs) continue;
      std::string who;
      for (size_t r = 0; r < g.ranks.size(); ++r)
        who += c10::str(r ? "; rank " : "rank ", g.ranks[r], each[r].empty() ? std::string(" was not waiting on it") : " was in " + each[r]);
      return who;
    }
  } catch (const std::exception&) {
    work->wait();  // no store to compare through: the collective's own timeout decides
  }
  return {};
}

}  // namespace

void wait_c10d_work(Group::Impl& g, const char* what, uint64_t seq, const c10::intrusive_ptr<c10d::Work>& work,
                    const std::string& label, bool compare_when_stalled) {
  std::string differ;
  try {
    if (compare_when_stalled) differ = wait_comparing_when_stalled(g, what, seq, work, label);
    else work->wait();
  } catch (const std::exception& e) {
    TORCH_CHECK(false, failed_collective_report(g, what, seq, message_of(e), label));
  }
  TORCH_CHECK(differ.empty(), "hyper_parallel::", what, ": ", what, " #", seq, label.empty() ? std::string() : " for " + label,
              " on the group of ranks [", join_ranks(g.ranks), "] stopped on rank ", g.ranks[static_cast<size_t>(g.rank)],
              ": the ranks were in different collectives (", differ,
              "); every rank must issue the same collectives in the same order");
}

void wait_peer_work(Group::Impl& g, const char* what, int64_t peer, int64_t tag, const c10::intrusive_ptr<c10d::Work>& work) {
  try {
    work->wait();
  } catch (const std::exception& e) {
    const bool send = std::string(what) == "send";
    TORCH_CHECK(false, "hyper_parallel::", what, ": ", send ? "sending to" : "receiving from", " rank ",
                g.ranks[static_cast<size_t>(peer)], " (tag ", tag, ") on the group of ranks [", join_ranks(g.ranks),
                "] failed on rank ", g.ranks[static_cast<size_t>(g.rank)], " (timeout ", state().timeout.count() / 1000.0,
                " s, HP_TIMEOUT_S): rank ", g.ranks[static_cast<size_t>(peer)],
                " exited, stopped, or never issued the matching ", send ? "recv" : "send",
                " (one of this tag, size and dtype). Cause: ", message_of(e));
  }
}

void wait_collective(const Group& group, const char* what, const c10::intrusive_ptr<c10d::Work>& work) {
  Group::Impl& g = GroupAccess::impl(group);
  wait_c10d_work(g, what, ++g.seq, work);
}

namespace {
// Each local rank on its own accelerator (LOCAL_RANK modulo the devices it sees), before any
// backend touches one: otherwise every rank of a host would use device 0.
void set_local_device(const std::string& device_type, int64_t local_rank) {
  if (device_type == "cpu") return;
  const c10::Device probe(device_type);  // c10 names an unknown type itself
  HP_CHECK_T(c10::ValueError, c10::impl::hasDeviceGuardImpl(probe.type()), "hyper_parallel::init_process_group: device_type '",
             device_type, "' is not available in this libtorch build");
  const auto* guard = c10::impl::getDeviceGuardImpl(probe.type());
  const c10::DeviceIndex count = guard->deviceCount();
  HP_CHECK_T(c10::ValueError, count > 0, "hyper_parallel::init_process_group: device_type '", device_type, "' but no ", device_type,
             " device is visible to rank ", state().env.rank, " (CUDA_VISIBLE_DEVICES?)");
  guard->setDevice(c10::Device(probe.type(), static_cast<c10::DeviceIndex>(local_rank % count)));
}
}  // namespace

namespace {
// The group over every rank of s.env's world; the state is initialized from here on.
void make_world(State& s) {
  std::vector<int64_t> all(static_cast<size_t>(s.env.world_size));
  for (int64_t r = 0; r < s.env.world_size; ++r) all[static_cast<size_t>(r)] = r;
  s.world = make_group(s, all, "hp/world/");
  s.groups[all] = s.world;
  s.initialized = true;
}

// A non-negative integer from environment variable `name`, or nullopt when it is unset.
c10::optional<int64_t> env_count(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return c10::nullopt;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  HP_CHECK_T(c10::ValueError, *end == '\0' && n >= 0, "hyper_parallel::init_process_group: environment variable ", name, "='", v,
             "' must be a non-negative integer");
  return static_cast<int64_t>(n);
}
}  // namespace

void init_fake_process_group(int64_t world_size, int64_t rank, const InitOptions& options) {
  HP_CHECK_T(c10::ValueError, world_size >= 1, "hyper_parallel::init_fake_process_group: world_size ", world_size,
             " must be at least 1");
  HP_CHECK_T(c10::ValueError, rank >= 0 && rank < world_size, "hyper_parallel::init_fake_process_group: rank ", rank,
             " is outside the world of size ", world_size);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  TORCH_CHECK(!s.initialized, "hyper_parallel::init_fake_process_group: init_process_group() was already called");
  // The device type is only a name here: no device is touched, so a plan for GPUs runs anywhere.
  (void)c10::Device(options.device_type);  // c10 names an unknown type itself
  s.env = LaunchEnv{};
  s.env.rank = rank;
  s.env.world_size = world_size;
  s.env.local_rank = 0;
  s.timeout = options.timeout ? *options.timeout : default_timeout();
  s.device_type = options.device_type;
  s.fake = true;
  make_world(s);
}

bool is_fake_world() { return state().initialized && state().fake; }

void require_real_world(const char* what, const char* needs) {
  HP_CHECK_T(c10::NotImplementedError, !is_fake_world(), "hyper_parallel::", what, ": this process is rank ",
             state().env.rank, " of a fake world of ", state().env.world_size,
             " ranks (init_fake_process_group or HP_FAKE_WORLD), which has no peers; ", what, " needs ", needs,
             ". Run it in a real job");
}

void init_process_group(const InitOptions& options) {
  if (const auto fake_world = env_count("HP_FAKE_WORLD")) {
    init_fake_process_group(*fake_world, env_count("HP_FAKE_RANK").value_or(0), options);
    return;
  }
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  TORCH_CHECK(!s.initialized, "hyper_parallel::init_process_group: init_process_group() was already called");
  s.env = read_launch_env();
  s.timeout = options.timeout ? *options.timeout : default_timeout();
  s.device_type = options.device_type;
  set_local_device(s.device_type, s.env.local_rank);

  // Under torchrun the elastic agent already serves MASTER_PORT: every rank joins it as a client.
  const bool join_agent = !s.env.agent_store_prefix.empty();
  c10d::TCPStoreOptions so;
  so.port = static_cast<std::uint16_t>(s.env.master_port);
  so.isServer = s.env.rank == 0 && !join_agent;
  // torch.distributed's env:// rendezvous, started after ours in this process (under hprun),
  // then shares this server instead of failing to bind the same port.
  so.multiTenant = true;
  so.numWorkers = static_cast<size_t>(s.env.world_size);
  // Ranks that never come are found (and named) by the world group's creation below, within
  // one timeout; the store server does not wait for them first.
  so.waitWorkers = false;
  so.timeout = s.timeout;
  {
    // An address that does not resolve would otherwise be retried for the whole timeout.
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int rc = ::getaddrinfo(s.env.master_addr.c_str(), nullptr, &hints, &res);
    if (res != nullptr) ::freeaddrinfo(res);
    HP_CHECK_T(c10::ValueError, rc == 0, "hyper_parallel::init_process_group: MASTER_ADDR '", s.env.master_addr,
               "' does not resolve (", ::gai_strerror(rc), "); set it to the host of rank 0");
  }
  try {
    s.store = c10::make_intrusive<c10d::TCPStore>(s.env.master_addr, so);
  } catch (const std::exception& e) {
    const std::string cause = message_of(e);
    TORCH_CHECK(cause.find("ddress already in use") == std::string::npos, "hyper_parallel::init_process_group: MASTER_PORT ",
                s.env.master_port, " on ", s.env.master_addr, " is already in use (another job, or a process ",
                "left from an earlier one, holds it): rank 0 cannot serve the rendezvous there; choose another ",
                "MASTER_PORT (hprun picks a free one when --master-port is not given)");
    TORCH_CHECK(false, "hyper_parallel::init_process_group: rendezvous at ", s.env.master_addr, ":",
                s.env.master_port, " failed on rank ", s.env.rank, " of ", s.env.world_size,
                " after a timeout of ", s.timeout.count() / 1000.0,
                " s (HP_TIMEOUT_S): rank 0 is unreachable. Cause: ", cause);
  }
  // Every key of this job under its rendezvous id: a rank of another job that reaches this store
  // (the same MASTER_PORT) writes and waits under its own id, never as one of ours.
  if (!s.env.rdzv_id.empty()) s.store = c10::make_intrusive<c10d::PrefixStore>("hp/job/" + s.env.rdzv_id + "/", s.store);
  if (join_agent) s.store = c10::make_intrusive<c10d::PrefixStore>(s.env.agent_store_prefix, s.store);
  s.store->set(joined_key(s.env.rank), std::vector<uint8_t>{1});
  make_world(s);
}

void init_process_group_with_store(const c10::intrusive_ptr<c10d::Store>& store, int64_t rank, int64_t world_size,
                                   const InitOptions& options) {
  HP_CHECK_T(c10::ValueError, store != nullptr, "hyper_parallel::init_process_group_with_store: the store is null");
  HP_CHECK_T(c10::ValueError, world_size >= 1 && rank >= 0 && rank < world_size,
             "hyper_parallel::init_process_group_with_store: rank ", rank, " is not in a world of ", world_size, " ranks");
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  TORCH_CHECK(!s.initialized, "hyper_parallel::init_process_group_with_store: init_process_group() was already called");
  s.env = LaunchEnv{};
  s.env.rank = rank;
  s.env.world_size = world_size;
  s.env.local_rank = env_count("LOCAL_RANK").value_or(rank);
  s.env.launcher = "store";
  s.timeout = options.timeout ? *options.timeout : default_timeout();
  s.device_type = options.device_type;
  set_local_device(s.device_type, s.env.local_rank);
  // Our keys beside the owner's, never among them.
  s.store = c10::make_intrusive<c10d::PrefixStore>("hyper_parallel/", store);
  s.store->set(joined_key(s.env.rank), std::vector<uint8_t>{1});
  make_world(s);
}

void destroy_process_group() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.groups.clear();
  s.world = Group();
  s.store.reset();
  s.initialized = false;
  s.fake = false;
}

bool is_initialized() { return state().initialized; }
int64_t get_rank() { return initialized_state().env.rank; }
int64_t get_world_size() { return initialized_state().env.world_size; }
int64_t get_local_rank() { return initialized_state().env.local_rank; }
Group world_group() { return initialized_state().world; }
std::chrono::milliseconds collective_timeout() { return initialized_state().timeout; }

Group new_group(const std::vector<int64_t>& ranks) {
  initialized_state();
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.groups.find(ranks);
  if (it != s.groups.end()) return it->second;
  HP_CHECK_T(c10::ValueError, !ranks.empty(), "hyper_parallel::new_group: new_group() needs at least one rank");
  bool member = false;
  for (int64_t r : ranks) {
    HP_CHECK_T(c10::ValueError, r >= 0 && r < s.env.world_size, "hyper_parallel::new_group: rank ", r,
               " in new_group([", join_ranks(ranks), "]) is outside the world of size ",
               s.env.world_size);
    member = member || r == s.env.rank;
  }
  HP_CHECK_T(c10::ValueError, member, "hyper_parallel::new_group: rank ", s.env.rank,
             " called new_group([", join_ranks(ranks), "]) but is not a member");
  Group g = make_group(s, ranks, "hp/group/" + join_ranks(ranks) + "/");
  s.groups.emplace(ranks, g);
  return g;
}

}  // namespace hyper_parallel
