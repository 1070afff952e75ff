#pragma once
// What a collective is for, beyond its kind and size: "fully_shard 'layers.0': all_gather of its
// parameters". Ranks whose collectives pair up under different labels (one rank gathers a group
// another rank never called) are stopped at that collective, on every rank, and every rank's
// error names every rank's label: two collectives of one kind and size from different owners
// never silently exchange data.
//
// The host transports compare every collective's label (no label is a label too) with its kind
// and size, at no extra exchange: the shared-memory transport in its control block, Gloo in a
// header every collective's data carries. On device transports (NCCL) the check would synchronise
// the host with the device and is not made; there a label only appears in the timeout report,
// with what every rank was doing.
#include <cstdint>
#include <string>

namespace hyper_parallel {

/// RAII: the collectives this thread issues while it lives carry `label` (nests; the innermost
/// wins). The label must be the same text on every rank that takes part.
/// e.g. `CollectiveLabel label("fully_shard 'b': all_gather of its parameters");`
class CollectiveLabel {
 public:
  explicit CollectiveLabel(std::string label);
  ~CollectiveLabel();
  CollectiveLabel(const CollectiveLabel&) = delete;
  CollectiveLabel& operator=(const CollectiveLabel&) = delete;

 private:
  std::string previous_;
  uint64_t previous_hash_ = 0;
};

/// This thread's current label ("" when none).
const std::string& current_collective_label();
/// Its 64-bit hash (0 when none).
uint64_t current_collective_label_hash();

}  // namespace hyper_parallel
