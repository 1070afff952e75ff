#pragma once
// A cheap check that every rank of a group is about to do the same thing (the same plan, the
// same shapes and placements): ranks that disagree would otherwise hang in a collective, abort
// inside the backend, or silently compute different things.
#include <string>
#include <vector>

#include <hyper_parallel/runtime/process_group.h>

namespace hyper_parallel {

/// Exchanges a 64-bit hash of `description` across `group` (one all_gather of one integer per
/// rank; a control message, not counted by CommDebugMode). When the hashes differ, every rank
/// raises c10::ValueError naming `what`, the ranks whose description differs from group rank 0's,
/// its own description and every rank's (the first 239 bytes of each, from a second exchange).
/// e.g. `check_agreement(g, "distribute_tensor", "shape [4, 8] placements (Shard(dim=0),)");`
void check_agreement(const Group& group, const std::string& what, const std::string& description);

/// Every rank's verdict on a step, so that nobody goes on (commits, loads, applies the next
/// entry) alone: every rank's `code` (0: fine) and, when some rank's is not 0, the first such
/// group rank and its message (up to 2 KiB), on every rank. One control all_gather, plus a
/// broadcast only when some rank failed.
struct Verdicts {
  std::vector<int64_t> codes;
  int64_t first = -1;  // the first group rank whose code is not 0, or -1
  std::string message;
};
/// e.g. `if (gather_verdicts(g, err.empty() ? 0 : 1, err).first >= 0) throw ...;`
Verdicts gather_verdicts(const Group& group, int64_t code, const std::string& my_message);

}  // namespace hyper_parallel
