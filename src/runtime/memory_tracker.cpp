// MemoryTracker: a counting wrapper around a device's c10 allocator.
#include <hyper_parallel/runtime/errors.h>
#include <hyper_parallel/runtime/memory_tracker.h>

#include <c10/core/Allocator.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <torch/csrc/api/include/torch/version.h>

namespace hyper_parallel {

struct MemoryTracker::State {
  std::mutex mutex;
  int64_t live = 0, peak = 0;
  uint64_t next_id = 0;  // also the number of allocations so far
  // Every allocation and free in order (bytes > 0: allocated, < 0: freed), for the transient peak.
  struct Event {
    uint64_t id;
    int64_t bytes;
  };
  std::vector<Event> events;
  std::unordered_set<uint64_t> alive;
};

namespace {

// UncountedAllocations: this thread's allocations pass through uncounted.
thread_local bool t_uncounted = false;

// The storage a wrapped allocation hands out: the inner allocation, and whom to tell when freed.
struct Block {
  c10::DataPtr inner;
  std::shared_ptr<MemoryTracker::State> state;
  uint64_t id;
  int64_t bytes;
};

void free_block(void* ctx) {
  auto* b = static_cast<Block*>(ctx);
  {
    std::lock_guard<std::mutex> lock(b->state->mutex);
    b->state->live -= b->bytes;
    b->state->alive.erase(b->id);
    b->state->events.push_back({b->id, -b->bytes});
  }
  delete b;  // frees the inner allocation
}

// CPU blocks by their data pointer: a CPU allocation's context must be its data (raw_allocate,
// used by some kernels for scratch space, asserts it), so the block is found by the pointer.
std::mutex g_raw_mutex;
std::unordered_map<void*, Block*> g_raw_blocks;

void free_raw(void* data) {
  Block* b = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_raw_mutex);
    const auto it = g_raw_blocks.find(data);
    if (it == g_raw_blocks.end()) return;
    b = it->second;
    g_raw_blocks.erase(it);
  }
  free_block(b);
}

class CountingAllocator final : public c10::Allocator {
 public:
  c10::Allocator* inner = nullptr;
  std::shared_ptr<MemoryTracker::State> state;
  c10::DeviceType device = c10::DeviceType::CPU;

// libtorch 2.3 made Allocator::allocate non-const and added copy_data.
#define HP_ALLOCATOR_2_3 (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3))
#if HP_ALLOCATOR_2_3
  c10::DataPtr allocate(size_t n) override {
#else
  c10::DataPtr allocate(size_t n) const override {
#endif
    c10::DataPtr got = inner->allocate(n);
    if (t_uncounted && device != c10::DeviceType::CPU) return got;  // (a CPU block must be findable by free_raw)
    void* data = got.get();
    // Nothing allocated (zero bytes): nothing to count, and raw_allocate's callers (LAPACK's
    // work buffers) need the pointer and the context alike.
    if (n == 0) return got;
    const c10::Device where = got.device();
    auto* b = new Block{std::move(got), state, 0, static_cast<int64_t>(n)};
    {
      std::lock_guard<std::mutex> lock(state->mutex);
      b->id = state->next_id++;
      state->live += b->bytes;
      state->peak = std::max(state->peak, state->live);
      state->alive.insert(b->id);
      state->events.push_back({b->id, b->bytes});
    }
    if (device == c10::DeviceType::CPU && data != nullptr) {
      std::lock_guard<std::mutex> lock(g_raw_mutex);
      g_raw_blocks[data] = b;
      return c10::DataPtr(data, data, &free_raw, where);
    }
    return c10::DataPtr(data, b, &free_block, where);
  }
  c10::DeleterFnPtr raw_deleter() const override { return device == c10::DeviceType::CPU ? &free_raw : nullptr; }
#if HP_ALLOCATOR_2_3
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count > 0) std::memcpy(dest, src, count);
  }
#endif
};

// One wrapper per device type; 0: meta, 1: cpu.
CountingAllocator g_allocators[2];
std::mutex g_install;

int device_index_of(const std::string& device_type) {
  HP_CHECK_T(c10::ValueError, device_type == "meta" || device_type == "cpu", "hyper_parallel::MemoryTracker: device_type '",
             device_type, "' is not one it can count: 'meta' or 'cpu' (an accelerator's caching allocator keeps its ",
             "own statistics)");
  return device_type == "meta" ? 0 : 1;
}

// Above any priority libtorch registers with, so the wrapper is what every allocation finds.
constexpr uint8_t kPriority = 255;

}  // namespace

UncountedAllocations::UncountedAllocations() : previous_(t_uncounted) { t_uncounted = true; }
UncountedAllocations::~UncountedAllocations() { t_uncounted = previous_; }

MemoryTracker::MemoryTracker(const std::string& device_type)
    : state_(std::make_shared<State>()), device_index_(device_index_of(device_type)) {
  std::lock_guard<std::mutex> lock(g_install);
  CountingAllocator& a = g_allocators[device_index_];
  HP_CHECK_T(c10::ValueError, a.inner == nullptr, "hyper_parallel::MemoryTracker: another tracker of '", device_type,
             "' is alive; one per device type at a time");
  a.device = device_index_ == 0 ? c10::DeviceType::Meta : c10::DeviceType::CPU;
  a.inner = c10::GetAllocator(a.device);
  a.state = state_;
  c10::SetAllocator(a.device, &a, kPriority);
}

MemoryTracker::~MemoryTracker() {
  std::lock_guard<std::mutex> lock(g_install);
  CountingAllocator& a = g_allocators[device_index_];
  // Storages made by the wrapper and still alive free through free_block (Block keeps the state
  // and the inner allocation), so putting the inner allocator back is safe at any time.
  c10::SetAllocator(a.device, a.inner, kPriority);
  a.inner = nullptr;
  a.state.reset();
}

int64_t MemoryTracker::live_bytes() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->live;
}

int64_t MemoryTracker::peak_bytes() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->peak;
}

int64_t MemoryTracker::allocations() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return static_cast<int64_t>(state_->next_id);
}

int64_t MemoryTracker::transient_peak_bytes() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  int64_t live = 0, peak = 0;
  for (const State::Event& e : state_->events) {
    if (state_->alive.count(e.id) != 0) continue;  // still alive: not transient
    live += e.bytes;
    peak = std::max(peak, live);
  }
  return peak;
}

}  // namespace hyper_parallel
