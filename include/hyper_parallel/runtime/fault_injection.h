#pragma once
// Failures on purpose, for tests of fault tolerance: inert unless HP_FAULT is set.
//   HP_FAULT=<rank>:<phase>:<step>[:<restart>][,...]
// kills rank <rank> with SIGKILL when it reaches fault_point(<phase>, <step>) in hprun's restart
// round <restart> (HPRUN_RESTART_COUNT; default 0), so a test hits each phase deterministically
// and a restarted job does not die again at the same point. A training loop marks "forward",
// "backward" and "optimizer_step"; save_train_state marks "mid_save" (this rank's files written,
// the commit not agreed) and "before_commit" (every rank's files written, LATEST not replaced).
#include <cstdint>
#include <string>

namespace hyper_parallel {

/// Kills this process with SIGKILL if HP_FAULT names this rank, `phase`, `step` and the current
/// restart round. A malformed HP_FAULT is a c10::ValueError naming it, at the first call.
/// e.g. `hp::fault_point("forward", step);`
void fault_point(const std::string& phase, int64_t step);

}  // namespace hyper_parallel
