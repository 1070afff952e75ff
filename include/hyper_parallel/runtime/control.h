#pragma once
// Small control exchanges among a group's ranks (agreement hashes, verdicts, headers, seeds): the
// one way the library's own bookkeeping talks, on the device the group's transport moves, whatever
// device the caller's tensors are on. Not counted by CommDebugMode (they are not the model's
// communication), and not checked by HP_DEBUG_COLLECTIVES.
#include <cstdint>
#include <string>
#include <vector>

#include <hyper_parallel/runtime/process_group.h>

namespace hyper_parallel {

/// Every rank's `values`, in group-rank order. Every rank passes the same number of values.
/// e.g. `control_all_gather(g, {my_hash})[0][0]` is group rank 0's hash.
std::vector<std::vector<int64_t>> control_all_gather(const Group& group, const std::vector<int64_t>& values);

/// Group rank `src`'s `values` on every rank (every rank passes as many).
std::vector<int64_t> control_broadcast(const Group& group, const std::vector<int64_t>& values, int64_t src);

/// Group rank `src`'s `text` on every rank (the others' text is ignored, whatever its length).
std::string control_broadcast_string(const Group& group, const std::string& text, int64_t src);

}  // namespace hyper_parallel
