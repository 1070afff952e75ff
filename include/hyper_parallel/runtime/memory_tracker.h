#pragma once
// Counting the bytes of the tensors a piece of code allocates, on the meta device (a plan: the
// shapes of a run without its memory) or on the CPU (the real run it stands for).
#include <cstdint>
#include <memory>
#include <string>

namespace hyper_parallel {

/// RAII scope that counts every tensor storage allocated on `device_type` ("meta" or "cpu")
/// while it is alive, by wrapping that device's allocator (restored when the scope ends). A meta
/// tensor's storage has a size but no memory: counted the same way, the bytes are those a real
/// run allocates for the same shapes. Views share their base's storage and count nothing. One
/// scope per device type at a time (c10::ValueError otherwise). Process-wide, so autograd's
/// threads count too.
/// e.g. `{ hp::MemoryTracker mem("meta"); loss = model(x).sum(); loss.backward(); mem.transient_peak_bytes(); }`
class MemoryTracker {
 public:
  explicit MemoryTracker(const std::string& device_type);
  ~MemoryTracker();
  MemoryTracker(const MemoryTracker&) = delete;
  MemoryTracker& operator=(const MemoryTracker&) = delete;

  /// Bytes allocated since the scope began and not freed yet (what it leaves behind).
  int64_t live_bytes() const;
  /// The largest live_bytes() so far.
  int64_t peak_bytes() const;
  /// The largest sum, at any moment so far, of the bytes of allocations that were freed again
  /// by now (saved activations, temporaries, communication buffers): what a step needs beyond
  /// what it leaves behind (gradients, new state).
  int64_t transient_peak_bytes() const;
  /// Storages allocated since the scope began.
  int64_t allocations() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
  int device_index_;
};

/// RAII: meta allocations this thread makes while it lives are not counted by a MemoryTracker. For the
/// library's own bookkeeping that a real run does not allocate: the DTensor dispatcher's run of an
/// op on meta tensors of the global shapes (to learn its output shapes) would otherwise count a
/// whole, unsharded tensor in a plan made on meta.
class UncountedAllocations {
 public:
  UncountedAllocations();
  ~UncountedAllocations();
  UncountedAllocations(const UncountedAllocations&) = delete;
  UncountedAllocations& operator=(const UncountedAllocations&) = delete;

 private:
  bool previous_;
};

}  // namespace hyper_parallel
