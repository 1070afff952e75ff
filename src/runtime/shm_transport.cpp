#include "shm_transport.h"

#include <hyper_parallel/runtime/errors.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <type_traits>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HP_CPU_RELAX() _mm_pause()
#else
#define HP_CPU_RELAX() std::atomic_signal_fence(std::memory_order_seq_cst)
#endif

namespace hyper_parallel {

struct ShmTransport::Control {
  alignas(64) std::atomic<uint64_t> arrived;
  int32_t pid;
  // What each rank is doing, per parity of the exchange that starts a collective: ranks that call
  // different collectives or sizes are told so at its first synchronisation (all of them alike),
  // instead of reading each other's buffers wrongly.
  uint32_t kind[2];
  uint64_t bytes[2];
};
static_assert(sizeof(std::atomic<uint64_t>) == 8 && std::atomic<uint64_t>::is_always_lock_free,
              "the arrival counters must be lock-free to work across processes");

namespace {

constexpr size_t kControlBytes = 128;
constexpr size_t kDefaultBufferBytes = size_t{1} << 20;  // per rank and buffer

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

// How an element is stored and accumulated: most types as themselves; 16-bit floats in fp32.
template <class T, class A = T>
struct Plain {
  using Stored = T;
  using Acc = A;
  static A load(T v) { return static_cast<A>(v); }
  static T store(A a) { return static_cast<T>(a); }
};
// bfloat16 as its bits, converted with shifts so that the loops vectorise (through c10::BFloat16
// they stay scalar); rounding to nearest even and NaN as c10::BFloat16(float) does, bit for bit.
struct BFloat16Bits {
  using Stored = uint16_t;
  using Acc = float;
  static float load(uint16_t b) {
    const uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  static uint16_t store(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return f != f ? uint16_t{0x7FC0} : static_cast<uint16_t>((u + ((u >> 16) & 1) + 0x7FFFu) >> 16);
  }
};

void prefetch(const void* p, size_t bytes) {
#if defined(__SSE__)
  for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(static_cast<const char*>(p) + o, _MM_HINT_T0);
#endif
}

// Inlined into reduce() below, so that each of its target clones compiles them for its CPU.
#define HP_ALWAYS_INLINE inline __attribute__((always_inline))

// Reduced in rank order: `out` may be one of the inputs (the caller's own data is read from its
// buffer, not from shared memory). 16-bit floats accumulate in fp32 and are rounded once.
template <class E, class Op>
HP_ALWAYS_INLINE void reduce_blocked(typename E::Stored* out, const typename E::Stored* const* in, int64_t g, size_t n, Op op) {
  using T = typename E::Stored;
  using A = typename E::Acc;
  if (g == 2) {
    // One pass, in chunks that each ask for the next one's lines first (a loop that spends more
    // instructions per byte, as bf16's conversions do, otherwise keeps too few cache lines in
    // flight). `out` may be x0 or x1, but only element for element (never shifted), which ivdep
    // promises the vectoriser; without it GCC checks for overlap and runs the scalar loop.
    constexpr size_t kChunk = 2048 / sizeof(T);
    for (size_t b = 0; b < n; b += kChunk) {
      const size_t m = std::min(kChunk, n - b);
      if (b + kChunk < n)
        for (int64_t p = 0; p < 2; ++p) prefetch(in[p] + b + kChunk, std::min(kChunk, n - b - kChunk) * sizeof(T));
      const T* x0 = in[0] + b;
      const T* x1 = in[1] + b;
      T* o = out + b;
#pragma GCC ivdep
      for (size_t i = 0; i < m; ++i) o[i] = E::store(op(E::load(x0[i]), E::load(x1[i])));
    }
    return;
  }
  // More ranks: blocks through a local accumulator, which lets the compiler vectorise.
  constexpr size_t kBlock = 512;
  A acc[kBlock];
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t m = std::min(kBlock, n - b);
    // The loops below pause between the inputs' streams: ask for the next block's lines now,
    // or every block waits for the peers' cache lines anew.
    if (b + kBlock < n)
      for (int64_t p = 0; p < g; ++p) prefetch(in[p] + b + kBlock, std::min(kBlock, n - b - kBlock) * sizeof(T));
    const T* __restrict x0 = in[0] + b;
    for (size_t i = 0; i < m; ++i) acc[i] = E::load(x0[i]);
    for (int64_t p = 1; p < g; ++p) {
      const T* __restrict x = in[p] + b;
      for (size_t i = 0; i < m; ++i) acc[i] = op(acc[i], E::load(x[i]));
    }
    T* __restrict o = out + b;
    for (size_t i = 0; i < m; ++i) o[i] = E::store(acc[i]);
  }
}

template <class E>
HP_ALWAYS_INLINE void reduce_typed(void* out, const void* const* in, int64_t g, size_t n, ReduceOp op) {
  using T = typename E::Stored;
  using A = typename E::Acc;
  auto o = static_cast<T*>(out);
  auto i = reinterpret_cast<const T* const*>(in);
  auto run = [&](auto f) { reduce_blocked<E>(o, i, g, n, f); };
  switch (op) {
    case ReduceOp::SUM:
    case ReduceOp::AVG:
      run([](A a, A b) { return static_cast<A>(a + b); });
      break;
    case ReduceOp::MAX:  // a NaN wins, as in torch.maximum
      run([](A a, A b) { return a != a ? a : b != b ? b : (b > a ? b : a); });
      break;
    case ReduceOp::MIN:
      run([](A a, A b) { return a != a ? a : b != b ? b : (b < a ? b : a); });
      break;
  }
}

// The reductions are compiled for the baseline and for AVX2/AVX-512, chosen at load time by the
// CPU: fp32 is bound by the peers' bytes, but converting bf16 is bound by instructions (twice as
// fast with AVX2). Not under AddressSanitizer: its runtime starts after ifunc resolvers run.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("default", "avx2", "arch=skylake-avx512")))
#endif
void reduce(void* out, const void* const* in, int64_t g, size_t n, c10::ScalarType t, ReduceOp op) {
  switch (t) {
    case c10::ScalarType::Float: return reduce_typed<Plain<float>>(out, in, g, n, op);
    case c10::ScalarType::Double: return reduce_typed<Plain<double>>(out, in, g, n, op);
    case c10::ScalarType::Half: return reduce_typed<Plain<c10::Half, float>>(out, in, g, n, op);
    case c10::ScalarType::BFloat16: return reduce_typed<BFloat16Bits>(out, in, g, n, op);
    case c10::ScalarType::Int: return reduce_typed<Plain<int32_t>>(out, in, g, n, op);
    case c10::ScalarType::Long: return reduce_typed<Plain<int64_t>>(out, in, g, n, op);
    case c10::ScalarType::Short: return reduce_typed<Plain<int16_t>>(out, in, g, n, op);
    case c10::ScalarType::Char: return reduce_typed<Plain<int8_t>>(out, in, g, n, op);
    case c10::ScalarType::Byte: return reduce_typed<Plain<uint8_t>>(out, in, g, n, op);
    default:
      HP_CHECK_T(c10::TypeError, false, "hyper_parallel: the shared-memory all_reduce has no reduction for ", t);
  }
}

// Copies bytes another core has just written. Reading them is the cost of every collective here;
// prefetching 2 KiB ahead keeps more cache-line transfers in flight than the hardware prefetcher
// alone (measured: a 256 KiB all_gather 11% faster than memcpy on a 2-core VM).
void copy_from_peer(void* dst, const void* src, size_t n) {
#if defined(__SSE2__)
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  constexpr size_t kAhead = 2048;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    if (i + kAhead < n) _mm_prefetch(reinterpret_cast<const char*>(s + i + kAhead), _MM_HINT_T0);
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  if (i < n) std::memcpy(d + i, s + i, n - i);
#else
  std::memcpy(dst, src, n);
#endif
}

}  // namespace

bool shm_transport_enabled() {
  const char* t = std::getenv("HP_TRANSPORT");
  if (t == nullptr || *t == '\0' || std::strcmp(t, "auto") == 0 || std::strcmp(t, "shm") == 0) return true;
  HP_CHECK_T(c10::ValueError, std::strcmp(t, "gloo") == 0, "environment variable HP_TRANSPORT='", t,
             "' must be 'auto' (shared memory on one host, Gloo across hosts), 'shm' or 'gloo'");
  return false;
}

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
    TORCH_CHECK(fd >= 0, "hyper_parallel: cannot create the shared-memory segment ", name, ": ", std::strerror(errno));
    if (::ftruncate(fd, static_cast<off_t>(t->mapped_)) != 0) {
      const int err = errno;
      ::close(fd);
      ::shm_unlink(name.c_str());
      TORCH_CHECK(false, "hyper_parallel: cannot size the shared-memory segment ", name, " to ", t->mapped_,
                  " bytes: ", std::strerror(err), " (is /dev/shm large enough? HP_TRANSPORT=gloo avoids it)");
    }
    store->set(ready, std::vector<uint8_t>{1});
  } else {
    store->wait({ready}, timeout);
    fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
    TORCH_CHECK(fd >= 0, "hyper_parallel: cannot open the shared-memory segment ", name, ": ", std::strerror(errno));
  }
  void* p = ::mmap(nullptr, t->mapped_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  TORCH_CHECK(p != MAP_FAILED, "hyper_parallel: cannot map the shared-memory segment ", name, ": ", std::strerror(err));
  t->base_ = static_cast<unsigned char*>(p);
  Control* mine = t->control(rank);
  mine->pid = static_cast<int32_t>(::getpid());
  // Once every rank has mapped it, the name goes: the memory lives as long as a mapping does,
  // and a crash of any rank leaves nothing behind in /dev/shm.
  store->add(mapped, 1);
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (store->add(mapped, 0) < static_cast<int64_t>(ranks.size())) {
    TORCH_CHECK(std::chrono::steady_clock::now() < until, "hyper_parallel: not every rank of [", join(ranks),
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

void ShmTransport::begin(uint32_t kind, uint64_t bytes) {
  Control* me = control(rank_);
  me->kind[step_ % 2] = kind;
  me->bytes[step_ % 2] = bytes;
  check_step_ = step_;
  check_pending_ = true;
}

void ShmTransport::check_agreement(const char* what) {
  check_pending_ = false;
  const size_t k = check_step_ % 2;
  const Control* r0 = control(0);
  bool same = true;
  for (int64_t p = 1; p < size(); ++p)
    same = same && control(p)->kind[k] == r0->kind[k] && control(p)->bytes[k] == r0->bytes[k];
  if (same) return;
  static const char* kinds[] = {"?", "all_reduce", "all_gather", "all_to_all", "broadcast", "scatter", "barrier"};
  std::string who;
  for (int64_t p = 0; p < size(); ++p)
    who += (p ? ", rank " : "rank ") + std::to_string(ranks_[static_cast<size_t>(p)]) + ": " +
           kinds[std::min<uint32_t>(control(p)->kind[k] & 0xFF, 6)] + " of " + std::to_string(control(p)->bytes[k]) +
           " bytes" + (control(p)->kind[k] >> 8 ? " (dtype/op code " + std::to_string(control(p)->kind[k] >> 8) + ")" : "");
  TORCH_CHECK(false, "hyper_parallel: shared-memory ", what, " on the group of ranks [", join(ranks_),
              "]: the ranks called different collectives or sizes (", who, ")");
}

void ShmTransport::sync(const char* what) {
  ++phase_;
  control(rank_)->arrived.store(phase_, std::memory_order_release);
  const int64_t g = size();
  for (int64_t p = 0; p < g; ++p) {
    const Control* c = control(p);
    if (c->arrived.load(std::memory_order_acquire) >= phase_) continue;
    // Spin first (a peer is usually a few hundred nanoseconds away), then yield the core; look at
    // the clock and the peers' liveness only now and then.
    uint64_t spins = 0;
    bool long_wait = false;
    std::chrono::steady_clock::time_point start{};
    while (c->arrived.load(std::memory_order_acquire) < phase_) {
      ++spins;
      if (spins < 4096) {
        HP_CPU_RELAX();
        continue;
      }
      // A peer that is milliseconds away is not on the hot path (it computes, or waits for
      // something else): sleep briefly then, so a waiting rank gives its core back.
      if (long_wait) std::this_thread::sleep_for(std::chrono::microseconds(50));
      else std::this_thread::yield();
      if (!long_wait && spins % 1024 != 0) continue;
      const auto now = std::chrono::steady_clock::now();
      if (start == std::chrono::steady_clock::time_point{}) start = now;
      long_wait = now - start > std::chrono::milliseconds(2);
      std::vector<int64_t> late, dead;
      for (int64_t q = 0; q < g; ++q) {
        if (control(q)->arrived.load(std::memory_order_acquire) >= phase_) continue;
        late.push_back(ranks_[static_cast<size_t>(q)]);
        if (::kill(pids_[static_cast<size_t>(q)], 0) != 0 && errno == ESRCH) dead.push_back(ranks_[static_cast<size_t>(q)]);
      }
      TORCH_CHECK(dead.empty(), "hyper_parallel: shared-memory ", what, " on the group of ranks [", join(ranks_),
                  "] failed on rank ", ranks_[static_cast<size_t>(rank_)], ": rank(s) [", join(dead),
                  "] exited without reaching it");
      TORCH_CHECK(now - start < timeout_, "hyper_parallel: shared-memory ", what, " on the group of ranks [",
                  join(ranks_), "] failed on rank ", ranks_[static_cast<size_t>(rank_)], " after ",
                  timeout_.count() / 1000.0, " s (HP_TIMEOUT_S): rank(s) [", join(late),
                  "] did not arrive (stopped, deadlocked or busy elsewhere)");
    }
  }
  if (check_pending_) check_agreement(what);
}

void ShmTransport::all_reduce(void* data, int64_t numel, c10::ScalarType dtype, ReduceOp op) {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t es = c10::elementSize(dtype);
  const size_t per_step = buffer_bytes_ / es;
  const int64_t g = size();
  auto* out = static_cast<unsigned char*>(data);
  std::vector<const void*> in(static_cast<size_t>(g));
  begin(1 | static_cast<uint32_t>(dtype) << 8 | static_cast<uint32_t>(op) << 16, static_cast<uint64_t>(numel) * es);
  for (size_t done = 0; done < static_cast<size_t>(numel); done += per_step) {
    const size_t n = std::min(per_step, static_cast<size_t>(numel) - done);
    const uint64_t step = step_++;
    unsigned char* mine = out + done * es;
    std::memcpy(buffer(rank_, step), mine, n * es);
    sync("all_reduce");
    // This rank's own addend is read from its own buffer, hot in its cache: reading the copy in
    // shared memory, which the peers are reading at the same time, is slower.
    if (g == 2 || n * es <= 16384 || n < static_cast<size_t>(g)) {
      // Every rank reduces everything itself (one synchronisation). Two ranks always do: each
      // reads the peer's n elements once, as the two-phase scheme would, in one pass.
      for (int64_t p = 0; p < g; ++p) in[static_cast<size_t>(p)] = p == rank_ ? mine : buffer(p, step);
      reduce(mine, in.data(), g, n, dtype, op);
      continue;
    }
    // Large, more than two ranks: each rank reduces its share into its own buffer, then everyone
    // copies the shares (each rank reads 2 (g - 1) / g of the data from its peers, not g - 1).
    auto share = [&](int64_t p) { return std::make_pair(n * static_cast<size_t>(p) / g, n * static_cast<size_t>(p + 1) / g); };
    const auto [lo, hi] = share(rank_);
    for (int64_t p = 0; p < g; ++p) in[static_cast<size_t>(p)] = (p == rank_ ? mine : buffer(p, step)) + lo * es;
    reduce(buffer(rank_, step) + lo * es, in.data(), g, hi - lo, dtype, op);
    sync("all_reduce");
    for (int64_t p = 0; p < g; ++p) {
      const auto [a, b] = share(p);
      if (p != rank_) copy_from_peer(mine + a * es, buffer(p, step) + a * es, (b - a) * es);
      else std::memcpy(mine + a * es, buffer(p, step) + a * es, (b - a) * es);
    }
  }
}

void ShmTransport::all_gather(const void* in, void* out, size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  begin(2, bytes);
  const int64_t g = size();
  for (size_t done = 0; done < bytes; done += buffer_bytes_) {
    const size_t n = std::min(buffer_bytes_, bytes - done);
    const uint64_t step = step_++;
    const unsigned char* mine = static_cast<const unsigned char*>(in) + done;
    std::memcpy(buffer(rank_, step), mine, n);
    // This rank's own piece comes from its input (hot in its cache) while the peers catch up.
    std::memcpy(static_cast<unsigned char*>(out) + static_cast<size_t>(rank_) * bytes + done, mine, n);
    sync("all_gather");
    for (int64_t p = 0; p < g; ++p)
      if (p != rank_) copy_from_peer(static_cast<unsigned char*>(out) + static_cast<size_t>(p) * bytes + done, buffer(p, step), n);
  }
}

// all_to_all (src < 0: every rank sends size() blocks and receives one from each) and scatter
// (only `src` sends; each rank receives its block): rounds of at most buffer/size() bytes a block.
void ShmTransport::exchange_blocks(const void* in, void* out, size_t block, int64_t src, const char* what) {
  std::lock_guard<std::mutex> lock(mutex_);
  begin(src < 0 ? 3 : 5 | static_cast<uint32_t>(src) << 8, block);
  const int64_t g = size();
  const size_t per = std::max<size_t>(1, buffer_bytes_ / static_cast<size_t>(g));
  for (size_t done = 0; done < block; done += per) {
    const size_t n = std::min(per, block - done);
    const uint64_t step = step_++;
    if (src < 0 || rank_ == src)
      for (int64_t j = 0; j < g; ++j)
        std::memcpy(buffer(rank_, step) + static_cast<size_t>(j) * n,
                    static_cast<const unsigned char*>(in) + static_cast<size_t>(j) * block + done, n);
    sync(what);
    for (int64_t p = src < 0 ? 0 : src; p < (src < 0 ? g : src + 1); ++p) {
      // A block this rank sends itself is read from its own input, not through shared memory.
      const unsigned char* from = p == rank_ ? static_cast<const unsigned char*>(in) + static_cast<size_t>(rank_) * block + done
                                             : buffer(p, step) + static_cast<size_t>(rank_) * n;
      copy_from_peer(static_cast<unsigned char*>(out) + static_cast<size_t>(src < 0 ? p : 0) * block + done, from, n);
    }
  }
}

void ShmTransport::all_to_all(const void* in, void* out, size_t block) { exchange_blocks(in, out, block, -1, "all_to_all"); }

void ShmTransport::broadcast(void* data, size_t bytes, int64_t src) {
  std::lock_guard<std::mutex> lock(mutex_);
  begin(4 | static_cast<uint32_t>(src) << 8, bytes);
  for (size_t done = 0; done < bytes; done += buffer_bytes_) {
    const size_t n = std::min(buffer_bytes_, bytes - done);
    const uint64_t step = step_++;
    if (rank_ == src) std::memcpy(buffer(rank_, step), static_cast<unsigned char*>(data) + done, n);
    sync("broadcast");
    if (rank_ != src) copy_from_peer(static_cast<unsigned char*>(data) + done, buffer(src, step), n);
  }
}

void ShmTransport::scatter(const void* in, void* out, size_t block, int64_t src) {
  exchange_blocks(in, out, block, src, "scatter");
}

void ShmTransport::barrier() {
  std::lock_guard<std::mutex> lock(mutex_);
  begin(6, 0);
  ++step_;  // keeps the buffer alternation in step with the peers
  sync("barrier");
}

}  // namespace hyper_parallel
