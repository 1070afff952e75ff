#pragma once
// Train states: everything a run needs to go on exactly where it stopped, as one transaction (the
// protocol of save_sharded), loadable at another parallel layout.
//   hp::TrainState state{model.get(), &optimizer, &schedule, &dataset};
//   if (hp::has_train_state(dir)) hp::load_train_state(dir, state);   // step, tokens_seen restored
//   for (; state.step < steps; ++state.step) { ...; if (due) hp::save_train_state(dir, state); }
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include <hyper_parallel/optim/lr_scheduler.h>

namespace hyper_parallel {

/// An object with state of its own in a train state (PyTorch DCP's Stateful), e.g. a data loader's
/// position. Its tensors are plain and the same on every rank.
class Stateful {
 public:
  virtual ~Stateful() = default;
  virtual std::map<std::string, at::Tensor> state_dict() const = 0;
  /// Throws c10::ValueError naming what does not fit (e.g. another global batch); called on every
  /// rank before anything is loaded, so a refusal leaves every object unchanged.
  virtual void check_state_dict(const std::map<std::string, at::Tensor>& state) const { (void)state; }
  virtual void load_state_dict(const std::map<std::string, at::Tensor>& state) = 0;
};

/// What save_train_state writes and load_train_state restores. `model` is required; the others
/// are left out when null.
/// - model: every parameter and buffer, in its layout (as save_sharded).
/// - optimizer (torch::optim::Adam or AdamW): per parameter, keyed by its FQN in `model`,
///   `optimizer.state.<fqn>.{step, exp_avg, exp_avg_sq[, max_exp_avg_sq]}` (a moment of a DTensor
///   parameter is saved as a DTensor of the same placements) and `optimizer.param_groups.<fqn>`
///   (the base lr, as torch's initial_lr, betas, eps, weight_decay, amsgrad). A parameter with no state (its gradient was never
///   defined) is saved without any and loads with none.
/// - scheduler: its step, and its schedule and options (lr_scheduler.schedule). `data`: its state_dict(). `extra`: plain tensors of the caller's, the
///   same on every rank, loaded back under their names.
/// - step, tokens_seen: the run's counters.
/// - always: the random-number state that decides the next step, per rank: hyper_parallel's
///   seed and torch's default CPU generator (whose draws key hyper_parallel's generator too). A state saved at another
///   world size loads rank 0's (the layouts' random streams cannot correspond element for element).
struct TrainState {
  torch::nn::Module* model = nullptr;
  torch::optim::Optimizer* optimizer = nullptr;
  LRScheduler* scheduler = nullptr;
  Stateful* data = nullptr;
  std::map<std::string, at::Tensor>* extra = nullptr;
  int64_t step = 0;
  int64_t tokens_seen = 0;
};

/// Options of save_train_state.
struct TrainStateSaveOptions {
  /// Committed generations kept (the newest); older ones are removed after the new one commits.
  int64_t keep = 2;
};

/// Saves `state` into `dir` as one transaction: a crash, a full disk or an error on any rank at any
/// moment leaves the previous train state committed and loadable (see save_sharded). Collective:
/// every rank calls it. Seeds are not compared (a per-rank seed is fine; each rank's state is its
/// own row). A name holding whitespace or a control character is refused by name before anything
/// is written.
/// e.g. `hp::save_train_state("ckpt", state, {/*keep=*/2});`
void save_train_state(const std::string& dir, const TrainState& state, const TrainStateSaveOptions& options = {});

/// A train state being written in the background (async_save_train_state). At most one is in
/// flight, and the library holds it, not the handle: the next save or load commits it first, on
/// every rank, whether or not the handle was kept. No destructor runs a collective: a rank that
/// fails with a save in flight leaves it uncommitted (one line on stderr when the process ends;
/// the next save removes it) and the directory keeps its previous state.
class AsyncSave {
 public:
  struct Impl;
  explicit AsyncSave(std::unique_ptr<Impl> impl);
  /// Joins this rank's writer; an uncommitted save stays uncommitted (no collective here).
  ~AsyncSave();
  AsyncSave(const AsyncSave&) = delete;
  AsyncSave& operator=(const AsyncSave&) = delete;
  /// Waits for this rank's writes, then commits with the other ranks. Collective: every rank
  /// calls it at the same point (or the next save or load does). Raises on every rank when any
  /// rank's writes failed; the previous state stays committed.
  void wait();
  /// Whether wait() has completed.
  bool committed() const;

 private:
  std::unique_ptr<Impl> impl_;
};

/// save_train_state in the background: returns once this rank's shards are copied to host
/// memory and a thread writes them; the commit happens in wait(), or in the next save or load
/// (torchtitan's async mode: the next optimizer step may change the parameters as soon as this
/// returns). Collective. Discarding the handle is fine; commit (wait, save or load) before
/// destroy_process_group, or the save is not committed.
/// e.g. `auto pending = hp::async_save_train_state("ckpt", state);  ...  pending->wait();`
std::shared_ptr<AsyncSave> async_save_train_state(const std::string& dir, const TrainState& state,
                                                  const TrainStateSaveOptions& options = {});

/// Options of load_train_state.
struct TrainStateLoadOptions {
  /// The learning-rate schedule (its kind and options, kept in the train state) may differ from the
  /// saved run's; otherwise a different one is refused by name.
  bool schedule_changed = false;
  /// When the newest generation's files do not verify (a flipped byte, a missing or truncated
  /// file) on some rank, load the newest older one that does, saying on every rank which one was
  /// skipped and why; the skipped ones are renamed gen_<n>.damaged (never removed, never counted
  /// by the pruning of later saves) and LATEST then names the one loaded. A state that does not
  /// fit (another model, optimizer or schedule) is refused as without it. Off: the damaged
  /// generation is an error naming the file and the piece.
  bool fall_back = false;
};

/// Loads the committed train state of `dir` into `state`'s objects at their current layout (any
/// mesh, placements or world size; parameters and moments move bytes, no arithmetic). All or
/// nothing on every rank: a missing or corrupt file (named, with the key and the piece), another
/// model config (the FQN and both shapes), another optimizer, or a data state its loader refuses,
/// and every rank raises c10::ValueError with every object unchanged. Collective. A save still in
/// flight (async_save_train_state) is committed first.
/// The optimizer's groups get the run's base learning rates (torch's initial_lr, saved in place of
/// the scheduled ones); `state.scheduler`, when given, then sets the saved step's rates, and a
/// scheduler built after the load and given the saved step does the same.
void load_train_state(const std::string& dir, TrainState& state, const TrainStateLoadOptions& options = {});

/// Whether `dir` holds a committed train state (a run resumes from it; a fresh run starts without):
/// LATEST and the metadata of the generation it names, or of an older one (a load with
/// fall_back reads that). A damaged or unreadable `LATEST`, or one naming a generation that is
/// not there with nothing older, is a c10::ValueError naming it, not a fresh start.
bool has_train_state(const std::string& dir);

}  // namespace hyper_parallel
