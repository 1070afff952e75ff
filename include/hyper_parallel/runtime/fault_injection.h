#pragma once
// Failures on purpose, for tests of fault tolerance: inert unless HP_FAULT is set. Not part of
// the umbrella header: a program that offers fault points includes this one.
//   HP_FAULT=<rank>:<phase>[:<step>[:<restart>]][,...]
// kills rank <rank> with SIGKILL when it reaches fault_point(<phase>, <step>) in hprun's restart
// round <restart> (HPRUN_RESTART_COUNT; default 0), so a test hits each phase deterministically
// and a restarted job does not die again at the same point. Without <step> the phase kills at its
// first occurrence, whatever the step. Each phase means one thing on every rank:
//   forward, backward, optimizer_step  the training loop's phases of step <step>;
//   mid_write       a save of sharded pieces: this rank's data file written, its index not;
//   mid_save        this rank's files written; the ranks have not agreed that every rank's are;
//   before_commit   every rank has written and agreed; no rank has replaced LATEST;
//   hf_mid_write    a Hugging Face save: this rank's boxes written; the ranks have not agreed;
//   hf_before_swap  every rank's boxes written and agreed; the new directory is not swapped in.
// The save phases carry the train state's step (save_train_state); other saves have none.
#include <cstdint>

namespace hyper_parallel {

/// Kills this process with SIGKILL if HP_FAULT names this rank, `phase`, `step` (or no step) and
/// the current restart round. A malformed HP_FAULT is a c10::ValueError naming it, at the first
/// call. `step` -1: a point outside any step.
/// e.g. `hp::fault_point("forward", step);`
void fault_point(const char* phase, int64_t step = -1);

}  // namespace hyper_parallel
