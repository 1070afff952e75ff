#pragma once
// A cheap check that every rank of a group is about to do the same thing (the same plan, the
// same shapes and placements): ranks that disagree would otherwise hang in a collective, abort
// inside the backend, or silently compute different things.
#include <string>

#include <hyper_parallel/runtime/process_group.h>

namespace hyper_parallel {

/// Exchanges a 64-bit hash of `description` across `group` (one all_gather of one integer per
/// rank; a control message, not counted by CommDebugMode). When the hashes differ, every rank
/// raises c10::ValueError naming `what`, the ranks whose description differs from group rank 0's,
/// its own description and every rank's (the first 239 bytes of each, from a second exchange).
/// e.g. `check_agreement(g, "distribute_tensor", "shape [4, 8] placements (Shard(dim=0),)");`
void check_agreement(const Group& group, const std::string& what, const std::string& description);

}  // namespace hyper_parallel
