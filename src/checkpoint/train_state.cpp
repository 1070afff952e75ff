// Train states (train_state.h): the model, the optimizer's state keyed by parameter FQN in the
// parameter's layout, the schedule, the data position, the counters and the random-number state,
// saved and loaded as entries of one sharded-checkpoint transaction. The model's entries carry
// the same names as save_sharded's, so load_sharded reads a train state's model.
#include <hyper_parallel/checkpoint/train_state.h>

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/dtensor/random.h>
#include <hyper_parallel/runtime/agreement.h>
#include <hyper_parallel/runtime/errors.h>
#include <hyper_parallel/runtime/process_group.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

#include "../dtensor/philox_draw.h"
#include "sharded_entries.h"

namespace hyper_parallel {
using namespace checkpoint_layout;

namespace {

constexpr const char* kSave = "save_train_state";
constexpr const char* kLoad = "load_train_state";

// The optimizers whose state is understood: Adam and AdamW keep the same fields.
enum class OptimKind : int64_t { Adam = 1, AdamW = 2 };

OptimKind kind_of(const torch::optim::OptimizerOptions& o, const char* what) {
  if (dynamic_cast<const torch::optim::AdamWOptions*>(&o) != nullptr) return OptimKind::AdamW;
  if (dynamic_cast<const torch::optim::AdamOptions*>(&o) != nullptr) return OptimKind::Adam;
  HP_CHECK_T(c10::ValueError, false, "hyper_parallel::", what, ": only torch::optim::Adam and AdamW states are understood; ",
             "this optimizer's parameter groups have other options");
}

// Each parameter's FQN (a tied weight: its first name), by TensorImpl as the optimizer keys state.
std::map<const void*, std::string> parameter_names(torch::nn::Module& model) {
  std::map<const void*, std::string> out;
  for (const auto& e : entries_of(model)) out.emplace(e.value.unsafeGetTensorImpl(), e.name);
  return out;
}

const std::string& name_of(const std::map<const void*, std::string>& names, const at::Tensor& p, const char* what) {
  auto it = names.find(p.unsafeGetTensorImpl());
  HP_CHECK_T(c10::ValueError, it != names.end(), "hyper_parallel::", what, ": the optimizer holds a parameter of shape ", p.sizes(),
             " that is not a parameter of the model (build the optimizer from hp::unique_parameters(*model))");
  return it->second;
}

// Hyperparameters of a group, as one row: lr, beta1, beta2, eps, weight_decay, amsgrad, kind.
template <class Options>
std::vector<double> hyper_row(const Options& o, OptimKind kind) {
  return {o.lr(), std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(), o.weight_decay(), o.amsgrad() ? 1.0 : 0.0,
          static_cast<double>(kind)};
}
constexpr int64_t kHyperFields = 7;

std::vector<double> hyper_of(const torch::optim::OptimizerOptions& o, const char* what) {
  const OptimKind kind = kind_of(o, what);
  if (kind == OptimKind::AdamW) return hyper_row(static_cast<const torch::optim::AdamWOptions&>(o), kind);
  return hyper_row(static_cast<const torch::optim::AdamOptions&>(o), kind);
}

template <class Options>
void set_hyper(Options& o, const std::vector<double>& h) {
  o.lr(h[0]);
  o.betas({h[1], h[2]});
  o.eps(h[3]);
  o.weight_decay(h[4]);
  o.amsgrad(h[5] != 0);
}

// Adam's and AdamW's per-parameter states have the same fields under different types.
struct MomentState {
  int64_t step = 0;
  at::Tensor exp_avg, exp_avg_sq, max_exp_avg_sq;
};

c10::optional<MomentState> moments_of(torch::optim::Optimizer& opt, const at::Tensor& p, OptimKind kind) {
  auto& state = opt.state();
  auto it = state.find(p.unsafeGetTensorImpl());
  if (it == state.end() || !it->second) return c10::nullopt;
  MomentState m;
  if (kind == OptimKind::AdamW) {
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
    m = {s.step(), s.exp_avg(), s.exp_avg_sq(), s.max_exp_avg_sq()};
  } else {
    const auto& s = static_cast<const torch::optim::AdamParamState&>(*it->second);
    m = {s.step(), s.exp_avg(), s.exp_avg_sq(), s.max_exp_avg_sq()};
  }
  return m;
}

template <class State>
void install(torch::optim::Optimizer& opt, const at::Tensor& p, const MomentState& m) {
  auto s = std::make_unique<State>();
  s->step(m.step);
  s->exp_avg(m.exp_avg);
  s->exp_avg_sq(m.exp_avg_sq);
  if (m.max_exp_avg_sq.defined()) s->max_exp_avg_sq(m.max_exp_avg_sq);
  opt.state()[p.unsafeGetTensorImpl()] = std::move(s);
}

// A moment as saved: a DTensor of its parameter's placements (a plain local moment of a DTensor
// parameter, as an optimizer that stepped on local tensors would keep, is wrapped in its spec).
at::Tensor in_layout_of(const at::Tensor& moment, const at::Tensor& param) {
  if (!is_dtensor(param) || is_dtensor(moment)) return moment;
  const DTensor d(param);
  return DTensor::from_local(moment, d.device_mesh(), d.placements());
}

at::Tensor int64_scalar(int64_t v) { return at::tensor(v, at::kLong); }

// This process's state of torch's default CPU generator.
at::Tensor cpu_generator_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

int64_t world_of_job() { return is_initialized() ? get_world_size() : 1; }
int64_t rank_of_job() { return is_initialized() ? get_rank() : 0; }

// One row of a [world, n] table: this rank's `row` (a per-rank state).
Entry row_entry(const std::string& name, const at::Tensor& row, int64_t world, int64_t r) {
  return {name, row.reshape({1, row.numel()}), {world, row.numel()}, {r, 0}};
}

const char* kRngHp = "rng.hyper_parallel";    // [world, 2] int64: seed, 0 (formerly a call count)
const char* kRngCpu = "rng.torch_cpu";        // [world, n] uint8: torch's CPU generator state
const char* kCounters = "train_state";        // [2] int64: step, tokens_seen
const char* kScheduler = "lr_scheduler.step";  // int64
const char* kSchedule = "lr_scheduler.schedule";  // uint8: the schedule and its options, as text

std::string state_key(const std::string& fqn, const char* field) { return "optimizer.state." + fqn + "." + field; }
std::string groups_key(const std::string& fqn) { return "optimizer.param_groups." + fqn; }

}  // namespace

namespace {

// The save in flight, if any, held here and not by its handle: the next save or load commits it,
// whether or not the caller kept the handle. A rank that fails never gets there, so it never
// commits (and never runs a collective on its way out).
std::shared_ptr<AsyncSave>& in_flight() {
  static std::shared_ptr<AsyncSave> p;
  return p;
}

void wait_for_save_in_flight() {
  if (auto p = in_flight()) p->wait();
}

std::vector<Entry> train_state_entries(const TrainState& state) {
  HP_CHECK_T(c10::ValueError, state.model != nullptr, "hyper_parallel::save_train_state: the state has no model");
  const int64_t world = world_of_job(), rank = rank_of_job();
  // Seeds are not compared here: a per-rank seed (base + rank) is a common data idiom, and each
  // rank's generator state is saved as its own row. Random ops on DTensors compare the ranks' keys
  // where they must agree (dtensor/random.h).
  std::vector<Entry> entries = entries_of(*state.model);
  if (state.scheduler != nullptr) state.scheduler->check_groups(kSave);
  if (state.optimizer != nullptr) {
    const auto names = parameter_names(*state.model);
    size_t g = 0;
    for (const auto& group : state.optimizer->param_groups()) {
      std::vector<double> hyper = hyper_of(group.options(), kSave);
      // The base rate (torch's initial_lr), never the scheduled one: a scheduler built after the
      // load takes the groups' rates as its bases, and would apply its factor twice. (check_groups
      // above: the scheduler has a base rate for every group.)
      if (state.scheduler != nullptr) hyper[0] = state.scheduler->base_lrs()[g];
      ++g;
      const OptimKind kind = kind_of(group.options(), kSave);
      for (const at::Tensor& p : group.params()) {
        const std::string& fqn = name_of(names, p, kSave);
        entries.push_back({groups_key(fqn), at::tensor(hyper, at::kDouble)});
        const auto m = moments_of(*state.optimizer, p, kind);
        if (!m) continue;  // never stepped: no state, on load too
        entries.push_back({state_key(fqn, "step"), int64_scalar(m->step)});
        entries.push_back({state_key(fqn, "exp_avg"), in_layout_of(m->exp_avg, p)});
        entries.push_back({state_key(fqn, "exp_avg_sq"), in_layout_of(m->exp_avg_sq, p)});
        if (m->max_exp_avg_sq.defined()) entries.push_back({state_key(fqn, "max_exp_avg_sq"), in_layout_of(m->max_exp_avg_sq, p)});
      }
    }
  }
  if (state.scheduler != nullptr) {
    entries.push_back({kScheduler, int64_scalar(state.scheduler->last_step())});
    const std::string& schedule = state.scheduler->schedule();
    entries.push_back({kSchedule, at::tensor(std::vector<uint8_t>(schedule.begin(), schedule.end()), at::kByte)});
  }
  if (state.data != nullptr)
    for (const auto& [k, v] : state.data->state_dict()) entries.push_back({"dataloader." + k, v.detach().cpu()});
  if (state.extra != nullptr)
    for (const auto& [k, v] : *state.extra) entries.push_back({"extra." + k, v.detach().cpu()});
  entries.push_back({kCounters, at::tensor(std::vector<int64_t>{state.step, state.tokens_seen}, at::kLong)});
  // The second column, the call count of an earlier generator, is 0: the keys now come from
  // torch's CPU generator, whose state is the next row.
  entries.push_back(row_entry(kRngHp, at::tensor(std::vector<int64_t>{static_cast<int64_t>(random_seed()), 0},
                                                 at::kLong),
                              world, rank));
  entries.push_back(row_entry(kRngCpu, cpu_generator_state(), world, rank));
  return entries;
}

}  // namespace

void save_train_state(const std::string& dir, const TrainState& state, const TrainStateSaveOptions& options) {
  require_real_world(kSave, "every rank to write its own files and agree on the commit");
  wait_for_save_in_flight();
  save_entries(train_state_entries(state), dir, options.keep, kSave, /*every_rank_writes=*/true, state.step);
}

struct AsyncSave::Impl {
  PendingSave save;
  std::thread writer;
  bool committed = false;
};

AsyncSave::AsyncSave(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

AsyncSave::~AsyncSave() {
  // No collective here: the other ranks may be anywhere (this rank may be unwinding from an
  // error, or the process exiting). This rank's files are finished; the generation stays
  // uncommitted and the next save removes it.
  if (impl_->writer.joinable()) impl_->writer.join();
  if (!impl_->committed)
    std::fprintf(stderr, "hyper_parallel::AsyncSave: the train state being saved in the background to %s (generation %lld) "
                 "was not committed: no wait(), save or load came after it; %s keeps its previous state\n",
                 impl_->save.dir.c_str(), static_cast<long long>(impl_->save.gen.seq), impl_->save.dir.c_str());
}

void AsyncSave::wait() {
  if (impl_->committed) return;
  if (impl_->writer.joinable()) impl_->writer.join();
  impl_->committed = true;  // once, whatever the outcome: a failed commit is raised once
  if (in_flight().get() == this) in_flight().reset();  // (the caller holds a reference: `this` lives on)
  commit_save(impl_->save);
}

bool AsyncSave::committed() const { return impl_->committed; }

std::shared_ptr<AsyncSave> async_save_train_state(const std::string& dir, const TrainState& state, const TrainStateSaveOptions& options) {
  require_real_world("async_save_train_state", "every rank to write its own files and agree on the commit");
  wait_for_save_in_flight();
  auto impl = std::make_unique<AsyncSave::Impl>();
  impl->save = begin_save(train_state_entries(state), dir, options.keep, kSave, /*every_rank_writes=*/true, state.step, /*copy=*/true);
  // Only this rank's files: no collective runs on the writer thread.
  AsyncSave::Impl* raw = impl.get();
  impl->writer = std::thread([raw] { write_save(raw->save); });
  in_flight() = std::make_shared<AsyncSave>(std::move(impl));
  return in_flight();
}

bool has_train_state(const std::string& dir) {
  // No LATEST: a fresh run. A LATEST that cannot be read is an error, not a fresh start (a run
  // that started over would prune the generations it could not read).
  if (checkpoint_files::file_size(dir + "/LATEST") < 0) return false;
  const Latest latest = read_latest(dir);
  // The generation it names must be there with its metadata; else an older committed one whose
  // metadata reads (a load with fall_back finds it).
  std::string why;
  try {
    read_metadata(gen_dir(dir, latest.seq), latest);
    return true;
  } catch (const std::exception& e) {
    why = message_of(e);
  }
  for (int64_t seq : generations(dir)) {
    if (seq >= latest.seq) continue;
    try {
      generation_record(dir, seq);
      return true;
    } catch (const std::exception&) {
    }
  }
  HP_CHECK_T(c10::ValueError, false, "hyper_parallel::has_train_state: ", dir, "/LATEST names generation ", latest.seq,
             ", which cannot be read (", why, "), and no older generation is there: not a fresh start, nothing to resume");
  return false;
}

namespace {

// What load_train_state reads, and where each piece goes once every rank has read everything.
struct LoadPlan {
  std::vector<Entry> entries;
  // Optimizer: per group, its hyperparameter entry index (of the group's first parameter); per
  // parameter with saved state, the indices of step, exp_avg, exp_avg_sq, max_exp_avg_sq (-1: none).
  struct Param {
    at::Tensor param;
    size_t step, exp_avg, exp_avg_sq;
    int64_t max_exp_avg_sq = -1;
  };
  std::vector<size_t> group_hyper;
  std::vector<Param> params;
  OptimKind kind = OptimKind::AdamW;
  int64_t scheduler = -1, schedule = -1, counters = -1, rng_hp = -1, rng_cpu = -1;
  std::map<std::string, size_t> data, extra;
  size_t model_entries = 0;
};

bool saved(const SavedIndex& index, const std::string& key) { return index.meta.tensors.count(key) != 0; }

size_t add(LoadPlan& plan, Entry e) {
  plan.entries.push_back(std::move(e));
  return plan.entries.size() - 1;
}

// A plain tensor of the saved shape and dtype, to read whole.
Entry whole(const SavedIndex& index, const std::string& key) {
  const auto& t = index.meta.tensors.at(key);
  return {key, at::empty(t.shape, at::TensorOptions().dtype(static_cast<at::ScalarType>(t.dtype)))};
}

// This rank's row of a saved [world, n] table: its own at the same world size, else rank 0's.
Entry saved_row(const SavedIndex& index, const std::string& key) {
  const auto& t = index.meta.tensors.at(key);
  HP_CHECK_T(c10::ValueError, t.shape.size() == 2, "hyper_parallel::load_train_state: '", key, "' is not a table of rows");
  const int64_t row = t.shape[0] == world_of_job() ? rank_of_job() : 0;
  return {key, at::empty({1, t.shape[1]}, at::TensorOptions().dtype(static_cast<at::ScalarType>(t.dtype))), t.shape, {row, 0}};
}

LoadPlan plan_load(const SavedIndex& index, const TrainState& state, const std::string& dir) {
  LoadPlan plan;
  plan.entries = entries_of(*state.model);
  plan.model_entries = plan.entries.size();
  if (state.optimizer != nullptr) {
    const auto names = parameter_names(*state.model);
    bool first_group = true;
    for (const auto& group : state.optimizer->param_groups()) {
      const OptimKind kind = kind_of(group.options(), kLoad);
      HP_CHECK_T(c10::ValueError, first_group || kind == plan.kind, "hyper_parallel::load_train_state: the optimizer's groups mix Adam and AdamW");
      plan.kind = kind;
      first_group = false;
      HP_CHECK_T(c10::ValueError, !group.params().empty(), "hyper_parallel::load_train_state: the optimizer has an empty parameter group");
      for (const at::Tensor& p : group.params()) {
        const std::string& fqn = name_of(names, p, kLoad);
        HP_CHECK_T(c10::ValueError, saved(index, groups_key(fqn)), "hyper_parallel::load_train_state: the train state in ", dir,
                   " has no optimizer state for '", fqn, "' (saved without an optimizer, or from another model)");
        if (&p == &group.params().front())
          plan.group_hyper.push_back(add(plan, {groups_key(fqn), at::empty({kHyperFields}, at::kDouble)}));
        if (!saved(index, state_key(fqn, "exp_avg"))) continue;
        at::NoGradGuard no_grad;
        auto moment = [&] { return at::zeros_like(p.detach(), at::MemoryFormat::Contiguous); };
        LoadPlan::Param lp{p, add(plan, {state_key(fqn, "step"), int64_scalar(0)}), add(plan, {state_key(fqn, "exp_avg"), moment()}),
                           add(plan, {state_key(fqn, "exp_avg_sq"), moment()})};
        if (saved(index, state_key(fqn, "max_exp_avg_sq")))
          lp.max_exp_avg_sq = static_cast<int64_t>(add(plan, {state_key(fqn, "max_exp_avg_sq"), moment()}));
        plan.params.push_back(lp);
      }
    }
  }
  if (state.scheduler != nullptr) {
    HP_CHECK_T(c10::ValueError, saved(index, kScheduler), "hyper_parallel::load_train_state: the train state in ", dir,
               " has no learning-rate schedule (saved without a scheduler)");
    plan.scheduler = static_cast<int64_t>(add(plan, {kScheduler, int64_scalar(0)}));
    if (saved(index, kSchedule)) plan.schedule = static_cast<int64_t>(add(plan, whole(index, kSchedule)));
  }
  for (const auto& [key, meta] : index.meta.tensors) {
    (void)meta;
    if (state.data != nullptr && key.rfind("dataloader.", 0) == 0) plan.data[key.substr(11)] = add(plan, whole(index, key));
    if (state.extra != nullptr && key.rfind("extra.", 0) == 0) plan.extra[key.substr(6)] = add(plan, whole(index, key));
  }
  HP_CHECK_T(c10::ValueError, state.data == nullptr || !plan.data.empty(), "hyper_parallel::load_train_state: the train state in ", dir,
             " has no data-loader state (saved without one)");
  plan.counters = static_cast<int64_t>(add(plan, {kCounters, at::empty({2}, at::kLong)}));
  plan.rng_hp = static_cast<int64_t>(add(plan, saved_row(index, kRngHp)));
  plan.rng_cpu = static_cast<int64_t>(add(plan, saved_row(index, kRngCpu)));
  return plan;
}

std::vector<double> as_doubles(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}

// The checks that need the values read: the saved hyperparameters fit the live optimizer, and the
// data loader accepts its state.
void check_staged(const LoadPlan& plan, const std::vector<at::Tensor>& staged, const TrainState& state, const TrainStateLoadOptions& options) {
  if (state.scheduler != nullptr) state.scheduler->check_groups(kLoad);
  if (state.scheduler != nullptr && plan.schedule >= 0 && !options.schedule_changed) {
    const at::Tensor t = staged[static_cast<size_t>(plan.schedule)].contiguous();
    const std::string saved_schedule(reinterpret_cast<const char*>(t.data_ptr<uint8_t>()), static_cast<size_t>(t.numel()));
    HP_CHECK_T(c10::ValueError, saved_schedule == state.scheduler->schedule(), "hyper_parallel::load_train_state: the run was saved under ",
               "the schedule '", saved_schedule, "', this one is '", state.scheduler->schedule(), "'; if the schedule changed on ",
               "purpose, say so with TrainStateLoadOptions{/*schedule_changed=*/true}");
  }
  for (size_t g = 0; g < plan.group_hyper.size(); ++g) {
    const auto h = as_doubles(staged[plan.group_hyper[g]]);
    HP_CHECK_T(c10::ValueError, static_cast<int64_t>(h[6]) == static_cast<int64_t>(plan.kind), "hyper_parallel::load_train_state: '",
               plan.entries[plan.group_hyper[g]].name, "' was saved by ", static_cast<int64_t>(h[6]) == 1 ? "Adam" : "AdamW",
               ", the optimizer now is ", plan.kind == OptimKind::Adam ? "Adam" : "AdamW");
  }
  if (state.data != nullptr) {
    std::map<std::string, at::Tensor> d;
    for (const auto& [k, i] : plan.data) d[k] = staged[i];
    state.data->check_state_dict(d);
  }
}

void apply(const LoadPlan& plan, const std::vector<at::Tensor>& staged, TrainState& state) {
  at::NoGradGuard no_grad;
  const auto fill = [&](size_t k) { local_tensor(plan.entries[k].value).copy_(staged[k]); };
  for (size_t k = 0; k < plan.model_entries; ++k) fill(k);
  if (state.optimizer != nullptr) {
    auto& groups = state.optimizer->param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      const auto h = as_doubles(staged[plan.group_hyper[g]]);
      if (plan.kind == OptimKind::AdamW) set_hyper(static_cast<torch::optim::AdamWOptions&>(groups[g].options()), h);
      else set_hyper(static_cast<torch::optim::AdamOptions&>(groups[g].options()), h);
    }
    // Parameters the checkpoint has no state for have none now either (as a fresh optimizer).
    state.optimizer->state().clear();
    for (const auto& lp : plan.params) {
      fill(lp.exp_avg);
      fill(lp.exp_avg_sq);
      if (lp.max_exp_avg_sq >= 0) fill(static_cast<size_t>(lp.max_exp_avg_sq));
      MomentState m{staged[lp.step].item<int64_t>(), plan.entries[lp.exp_avg].value, plan.entries[lp.exp_avg_sq].value, {}};
      if (lp.max_exp_avg_sq >= 0) m.max_exp_avg_sq = plan.entries[static_cast<size_t>(lp.max_exp_avg_sq)].value;
      if (plan.kind == OptimKind::AdamW) install<torch::optim::AdamWParamState>(*state.optimizer, lp.param, m);
      else install<torch::optim::AdamParamState>(*state.optimizer, lp.param, m);
    }
  }
  if (state.scheduler != nullptr) {
    // The groups now hold the run's base rates (saved in place of the scheduled ones).
    std::vector<double> bases;
    if (state.optimizer != nullptr)
      for (const auto& group : state.optimizer->param_groups()) bases.push_back(group.options().get_lr());
    if (bases.size() == state.scheduler->base_lrs().size()) state.scheduler->load_state(staged[static_cast<size_t>(plan.scheduler)].item<int64_t>(), bases);
    else state.scheduler->load_state(staged[static_cast<size_t>(plan.scheduler)].item<int64_t>());
  }
  if (state.data != nullptr) {
    std::map<std::string, at::Tensor> d;
    for (const auto& [k, i] : plan.data) d[k] = staged[i].clone();  // (staged tensors may view the mapped files)
    state.data->load_state_dict(d);
  }
  if (state.extra != nullptr) {
    state.extra->clear();
    for (const auto& [k, i] : plan.extra) (*state.extra)[k] = staged[i].clone();
  }
  const at::Tensor counters = staged[static_cast<size_t>(plan.counters)];
  state.step = counters[0].item<int64_t>();
  state.tokens_seen = counters[1].item<int64_t>();
  const at::Tensor hp_rng = staged[static_cast<size_t>(plan.rng_hp)].reshape({-1});
  // A seeding (the next random op on a DTensor compares the ranks' keys), then torch's CPU
  // generator exactly as saved: hyper_parallel's keys are its draws.
  manual_seed(static_cast<uint64_t>(hp_rng[0].item<int64_t>()));
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(staged[static_cast<size_t>(plan.rng_cpu)].reshape({-1}));
}

}  // namespace

namespace {

// One rank's attempt at one generation: what failed, and whether it is the files' integrity (a
// generation another one may stand in for) or the state's fit (the model, the optimizer, the
// schedule: no older generation fits better).
struct Attempt {
  Latest generation;  // the generation tried, as LATEST would name it
  LoadPlan plan;
  std::vector<at::Tensor> staged;
  std::string err;
  bool damaged = false;
};

// `which` gives the generation's record (reading it may fail: that is damage too).
Attempt try_generation(const std::string& dir, const std::function<Latest()>& which, TrainState& state,
                       const TrainStateLoadOptions& options) {
  Attempt a;
  SavedIndex index;
  try {
    a.generation = which();
    index = read_index(dir, a.generation);
  } catch (const std::exception& e) {
    a.err = message_of(e);
    a.damaged = true;
    return a;
  }
  try {
    a.plan = plan_load(index, state, dir);
    check_saved_entries(index, a.plan.entries, dir, kLoad);
  } catch (const std::exception& e) {
    a.err = message_of(e);
    return a;
  }
  try {
    a.staged = read_entries(index, a.plan.entries, dir, kLoad);
  } catch (const std::exception& e) {
    a.err = message_of(e);
    a.damaged = true;
    return a;
  }
  try {
    check_staged(a.plan, a.staged, state, options);
  } catch (const std::exception& e) {
    a.err = message_of(e);
  }
  return a;
}

}  // namespace

void load_train_state(const std::string& dir, TrainState& state, const TrainStateLoadOptions& options) {
  require_real_world(kLoad, "real files written by every rank of a real job");
  HP_CHECK_T(c10::ValueError, state.model != nullptr, "hyper_parallel::load_train_state: the state has no model");
  wait_for_save_in_flight();  // a load reads what was saved last
  if (!options.fall_back) {
    Attempt a = try_generation(dir, [&] { return read_latest(dir); }, state, options);
    agree_to_load(is_initialized(), a.damaged ? a.err + " (TrainStateLoadOptions{fall_back} loads the newest generation that verifies)" : a.err,
                  kLoad);
    apply(a.plan, a.staged, state);
    return;
  }
  // LATEST's generation first, then the older committed ones, newest first; a generation whose
  // files do not verify on some rank is skipped on every rank, saying why.
  std::vector<int64_t> candidates;
  std::string latest_err;
  Latest latest;
  int64_t newest = std::numeric_limits<int64_t>::max();
  try {
    latest = read_latest(dir);
    newest = latest.seq;
    candidates.push_back(newest);
  } catch (const std::exception& e) {
    latest_err = message_of(e);
  }
  // (Every rank reads the same directory; a LATEST one rank cannot read is agreed on below.)
  agree_to_load(is_initialized(), latest_err.find("holds no committed checkpoint") != std::string::npos ? latest_err : "", kLoad);
  const auto gens = generations(dir);
  for (auto it = gens.rbegin(); it != gens.rend(); ++it)
    if (*it < newest) candidates.push_back(*it);
  std::vector<std::pair<int64_t, std::string>> skipped;
  if (!latest_err.empty()) skipped.push_back({-1, latest_err});
  for (int64_t seq : candidates) {
    const bool is_latest = latest_err.empty() && seq == newest;
    Attempt a = try_generation(dir, [&] { return is_latest ? latest : generation_record(dir, seq); }, state, options);
    // Every rank's verdict: 0 loaded, 1 damaged files, 2 anything else.
    const Verdicts verdicts = gather_verdicts(is_initialized(), a.err.empty() ? 0 : a.damaged ? 1 : 2, a.err);
    const int64_t worst = *std::max_element(verdicts.codes.begin(), verdicts.codes.end());
    if (worst == 2) agree_to_load(is_initialized(), a.damaged ? "" : a.err, kLoad);  // a misfit: raised by name, as without fall_back
    if (worst == 1) {
      const std::string& why = verdicts.message;
      std::fprintf(stderr, "hyper_parallel::load_train_state: rank %lld skips generation %lld of %s, which does not verify: %s\n",
                   static_cast<long long>(is_initialized() ? get_rank() : 0), static_cast<long long>(seq), dir.c_str(), why.c_str());
      skipped.push_back({seq, why});
      continue;
    }
    if (!skipped.empty()) {
      // Every rank verified this one: the skipped ones are set aside (never removed) and LATEST
      // names this one, so that a load without fall_back, has_train_state and the next save's
      // pruning all see the directory as it is.
      std::string err;
      try {
        for (const auto& [bad, why] : skipped)
          if (bad > 0) set_aside_damaged(dir, bad);
        if (!is_initialized() || get_rank() == 0) write_latest(dir, a.generation);
      } catch (const std::exception& e) {
        err = message_of(e);
      }
      agree_to_load(is_initialized(), err, kLoad);
    }
    apply(a.plan, a.staged, state);
    return;
  }
  std::string why;
  for (const auto& [bad, reason] : skipped)
    why += (why.empty() ? "" : "; ") + (bad > 0 ? "generation " + std::to_string(bad) : std::string("LATEST")) + ": " + reason;
  HP_CHECK_T(c10::ValueError, false, "hyper_parallel::load_train_state: no generation of ", dir, " verifies (", why,
             "); no rank loaded anything");
}

}  // namespace hyper_parallel
