// Train states: a run saved at step k and resumed is bitwise the run that never stopped (losses,
// gradient norms, learning rates, final parameters and moments), at one process, tp and dp x tp
// with FSDP; a state saved at one layout loads bitwise at another; bad states are refused on every
// rank with nothing changed.
#include <gtest/gtest.h>

#include <hyper_parallel/checkpoint/train_state.h>
#include <hyper_parallel/optim/lr_scheduler.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "../../common/test_files.h"
#include "../tensor_parallel/tp_models.h"
#include "train_state_util.h"

using namespace tp_test;
using train_state_test::Scratch;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_checkpoint_train_state_test {
namespace {

// An MLP, a norm, and a layer no forward uses (its gradient is never defined).
class NetImpl : public hnn::ModuleBase<NetImpl> {
 public:
  explicit NetImpl(int64_t unused_out = 4) {
    mlp = register_module("mlp", Mlp(8, 16));
    norm = register_module("norm", hnn::RMSNorm(hnn::RMSNormOptions(8)));
    unused = register_module("unused", hnn::Linear(4, unused_out));
  }
  at::Tensor forward(const at::Tensor& x) { return norm(mlp(x)); }
  Mlp mlp{nullptr};
  hnn::RMSNorm norm{nullptr};
  hnn::Linear unused{nullptr};
};
HP_MODULE(Net);

enum class Layout { Plain, Tp, DpTp };
const char* name_of(Layout l) { return l == Layout::Plain ? "one process" : l == Layout::Tp ? "tp" : "dp x tp"; }

// One rank's training: the model in `layout`, AdamW in two groups under a warmup-cosine schedule.
struct Trainer {
  Trainer(Layout layout, uint64_t init_seed, int64_t unused_out = 4) : layout(layout) {
    model = seeded<Net>(init_seed, unused_out);
    const int64_t world = hp::get_world_size();
    if (layout == Layout::Tp) {
      mesh = hp::init_device_mesh("cpu", {world}, {"tp"});
      hp::parallelize_module(*model, *mesh, {{"mlp.linear1", hp::ColwiseParallel()}, {"mlp.linear2", hp::RowwiseParallel()}});
    } else if (layout == Layout::DpTp) {
      mesh = hp::init_device_mesh("cpu", {2, world / 2}, {"dp", "tp"});
      hp::parallelize_module(*model, (*mesh)["tp"], {{"mlp.linear1", hp::ColwiseParallel()}, {"mlp.linear2", hp::RowwiseParallel()}});
      hp::fully_shard(*model, (*mesh)["dp"]);
    }
    std::vector<at::Tensor> decayed, plain;
    for (const at::Tensor& p : hp::unique_parameters(*model)) (p.dim() >= 2 ? decayed : plain).push_back(p);
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(decayed, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(0.05).betas({0.9, 0.95}).weight_decay(0.1)));
    groups.emplace_back(plain, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(0.02).weight_decay(0)));
    opt = std::make_unique<torch::optim::AdamW>(std::move(groups));
    hp::WarmupStableDecayOptions wsd;
    wsd.training_steps = 6;
    wsd.warmup_steps = 2;
    wsd.decay_ratio = 0.5;
    wsd.decay_type = "cosine";
    schedule = std::make_unique<hp::LRScheduler>(hp::linear_warmup_stable_decay(*opt, wsd));
    state = {model.get(), opt.get(), schedule.get()};
  }

  // One step: the inputs from torch's generator, dropout on them from ours, this data-parallel
  // rank's rows; the loss, gradient norm and learning rate recorded as bit patterns.
  void step() {
    at::Tensor x = at::randn({4, 8});
    x = hp::dropout(x, 0.25, true);
    if (layout == Layout::DpTp) x = x.chunk(2, 0)[mesh->get_local_rank(0)];
    at::Tensor loss = model(x).pow(2).mean();
    if (hp::is_dtensor(loss)) loss = hp::DTensor(loss).full_tensor();
    loss.backward();
    const double norm = hp::clip_grad_norm_(hp::unique_parameters(*model), 1.0).item<double>();
    record.push_back(bits(loss.item<float>()));
    record.push_back(bits(static_cast<float>(norm)));
    record.push_back(bits(static_cast<float>(opt->param_groups()[0].options().get_lr())));
    opt->step();
    opt->zero_grad();
    schedule->step();
    ++state.step;
    state.tokens_seen += 32;
  }

  static uint32_t bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
  }

  std::map<std::string, at::Tensor> gathered() { return train_state_test::gathered_state(*model, *opt); }

  Layout layout;
  c10::optional<hp::DeviceMesh> mesh;
  Net model{nullptr};
  std::unique_ptr<torch::optim::AdamW> opt;
  std::unique_ptr<hp::LRScheduler> schedule;
  hp::TrainState state;
  std::vector<uint32_t> record;
};

void seed_all(uint64_t s) {
  at::manual_seed(s);
  hp::manual_seed(s);
}

// Same keys, and every tensor the same bits.
bool bitwise_equal(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b, std::string* why = nullptr) {
  if (a.size() != b.size()) {
    if (why) *why = "key counts " + std::to_string(a.size()) + " and " + std::to_string(b.size());
    return false;
  }
  for (const auto& [k, v] : a) {
    auto it = b.find(k);
    if (it == b.end() || !train_state_test::same_bits(v, it->second)) {
      if (why) *why = k;
      return false;
    }
  }
  return true;
}

constexpr int64_t kSteps = 6, kSaveAt = 3;

// The uninterrupted run against one saved at kSaveAt and resumed in fresh objects (built from
// another seed, the generators drawn elsewhere), and a resume whose loaded state differs in one
// element of one moment, which must end elsewhere.
void expect_exact_resume(Layout layout) {
  const Scratch dir(std::string("resume_") + std::to_string(static_cast<int>(layout)));
  seed_all(11);
  Trainer reference(layout, 5);
  for (int64_t s = 0; s < kSteps; ++s) reference.step();
  const auto ref_final = reference.gathered();

  seed_all(11);
  {
    Trainer first(layout, 5);
    for (int64_t s = 0; s < kSaveAt; ++s) first.step();
    hp::save_train_state(dir, first.state);
  }
  auto resumed_run = [&](bool perturb) {
    seed_all(999);
    at::randn({100});  // the generators elsewhere: the load must put them back
    auto t = std::make_unique<Trainer>(layout, 77);
    hp::load_train_state(dir, t->state);
    EXPECT_EQ(t->state.step, kSaveAt);
    EXPECT_EQ(t->state.tokens_seen, 32 * kSaveAt);
    if (perturb) {
      at::NoGradGuard g;
      const at::Tensor w = t->model->mlp->linear1->weight();
      auto& s = static_cast<torch::optim::AdamWParamState&>(*t->opt->state().at(w.unsafeGetTensorImpl()));
      at::Tensor local = hp::local_tensor(s.exp_avg());
      float* v = local.data_ptr<float>();
      v[0] += 1e-3f;
    }
    for (int64_t s = kSaveAt; s < kSteps; ++s) t->step();
    return t;
  };
  auto resumed = resumed_run(false);
  const std::vector<uint32_t> ref_tail(reference.record.begin() + 3 * kSaveAt, reference.record.end());
  EXPECT_EQ(resumed->record, ref_tail) << name_of(layout) << ": losses, gradient norms or learning rates differ after the resume";
  std::string why;
  EXPECT_TRUE(bitwise_equal(resumed->gathered(), ref_final, &why)) << name_of(layout) << ": final state differs at " << why;
  // The unused layer never had a gradient: no state before the save, none after the load.
  EXPECT_EQ(resumed->gathered().count("unused.weight.exp_avg"), 0u);
  EXPECT_EQ(ref_final.count("unused.weight.exp_avg"), 0u);
  // The companion: one moment element off by 1e-3 on each rank must show.
  auto perturbed = resumed_run(true);
  EXPECT_FALSE(bitwise_equal(perturbed->gathered(), ref_final)) << "a perturbed moment went unnoticed";
}

}  // namespace

TEST(TrainStateDist, ResumedRunIsBitwiseTheUninterruptedOne) {
  expect_exact_resume(Layout::Plain);
  expect_exact_resume(Layout::Tp);
  if (hp::get_world_size() % 2 == 0 && hp::get_world_size() >= 4) expect_exact_resume(Layout::DpTp);
}

// Saved at dp x tp = 2 x 2 with FSDP, loaded at tp = 4 and in one process (and back): parameters
// and moments gathered are the saved bits; the next step's loss agrees to rounding.
TEST(TrainStateDist, StateSavedAtOneLayoutLoadsBitwiseAtAnother) {
  ASSERT_EQ(hp::get_world_size(), 4);
  const Scratch dir("reshard");
  seed_all(21);
  Trainer source(Layout::DpTp, 8);
  for (int64_t s = 0; s < kSaveAt; ++s) source.step();
  hp::save_train_state(dir, source.state);
  const auto saved = source.gathered();
  source.step();
  const float next_loss = [&] {
    float f;
    const uint32_t u = source.record[3 * kSaveAt];
    std::memcpy(&f, &u, 4);
    return f;
  }();
  for (Layout to : {Layout::Tp, Layout::Plain}) {
    seed_all(3);
    Trainer target(to, 99);
    hp::load_train_state(dir, target.state);
    std::string why;
    EXPECT_TRUE(bitwise_equal(target.gathered(), saved, &why)) << name_of(to) << ": differs at " << why;
    // The companion: one element off must be seen.
    auto off = saved;
    off["mlp.linear2.weight.exp_avg_sq"] = off["mlp.linear2.weight.exp_avg_sq"].clone();
    off["mlp.linear2.weight.exp_avg_sq"].view({-1})[3] += 1e-7;
    EXPECT_FALSE(bitwise_equal(target.gathered(), off));
    // The data of the next step: the dp x tp run's rows were half the batch each, so the loss of
    // the whole batch is the mean of the halves; compared on rank 0's half through the dp layout
    // above would need the rows: here the whole-batch loss is compared with the average.
    target.step();
    float whole;
    std::memcpy(&whole, &target.record[0], 4);
    at::Tensor halves = at::tensor({next_loss});
    hp::all_reduce_(halves, hp::ReduceOp::AVG, hp::world_group());
    EXPECT_NEAR(whole, halves.item<float>(), 1e-5 * std::abs(whole) + 1e-6) << name_of(to);
  }
}

// An asynchronous save holds the state of the moment it was called, while training goes on; its
// commit waits for wait(), and the next save waits for it.
TEST(TrainStateDist, AsyncSaveKeepsTheStateOfItsStepWhileTrainingGoesOn) {
  const Scratch dir("async");
  seed_all(41);
  Trainer run(Layout::Tp, 6);
  for (int64_t s = 0; s < 2; ++s) run.step();
  const auto at_two = run.gathered();
  auto pending = hp::async_save_train_state(dir, run.state);
  run.step();  // changes the parameters and moments the save copied
  EXPECT_FALSE(pending->committed());
  pending->wait();
  EXPECT_TRUE(pending->committed());
  {
    seed_all(1);
    Trainer loaded(Layout::Tp, 9);
    hp::load_train_state(dir, loaded.state);
    EXPECT_EQ(loaded.state.step, 2);
    std::string why;
    EXPECT_TRUE(bitwise_equal(loaded.gathered(), at_two, &why)) << why;
  }
  // In flight, then a synchronous save: it waits for the first, then commits its own.
  auto second = hp::async_save_train_state(dir, run.state);
  run.step();
  hp::save_train_state(dir, run.state);
  EXPECT_TRUE(second->committed());
  seed_all(1);
  Trainer loaded(Layout::Tp, 9);
  hp::load_train_state(dir, loaded.state);
  EXPECT_EQ(loaded.state.step, 4);
  EXPECT_TRUE(bitwise_equal(loaded.gathered(), run.gathered()));
}

// A discarded handle neither makes the save synchronous nor loses it: the library holds the save
// in flight and the next load commits it before reading, so the load sees the state of the save's
// step (the training steps after it changed nothing of what it copied).
TEST(TrainStateDist, AsyncSaveWithItsHandleDiscardedIsCommittedByTheNextLoad) {
  const Scratch dir("async_discarded");
  seed_all(43);
  Trainer run(Layout::Tp, 6);
  run.step();
  hp::save_train_state(dir, run.state);
  run.step();
  const auto at_two = run.gathered();
  (void)hp::async_save_train_state(dir, run.state);
  run.step();
  seed_all(1);
  Trainer loaded(Layout::Tp, 9);
  hp::load_train_state(dir, loaded.state);
  EXPECT_EQ(loaded.state.step, 2);
  std::string why;
  EXPECT_TRUE(bitwise_equal(loaded.gathered(), at_two, &why)) << why;
}

// A name with whitespace would commit a generation nothing can load: refused at save by name, on
// every rank, with nothing written (LATEST as it was, the previous state loadable); '=' and
// non-ASCII keys round-trip; a module registered under a name with a space is refused alike.
TEST(TrainStateDist, NamesWithWhitespaceAreRefusedAtSaveWithNothingWritten) {
  const Scratch dir("names");
  seed_all(33);
  Trainer t(Layout::Tp, 4);
  t.step();
  hp::save_train_state(dir, t.state);
  hp::barrier(hp::world_group());
  const std::string latest = hp_test::read_bytes(dir.path + "/LATEST");
  const auto files = std::distance(std::filesystem::directory_iterator(dir.path), std::filesystem::directory_iterator());
  for (const char* key : {"train loss", "train\tloss", "train\nloss"}) {
    std::map<std::string, at::Tensor> extra{{key, at::ones({1})}};
    hp::TrainState st = t.state;
    st.extra = &extra;
    try {
      hp::save_train_state(dir, st);
      ADD_FAILURE() << "saved a name with whitespace";
    } catch (const c10::Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("hyper_parallel::save_train_state: "), std::string::npos) << m;
      EXPECT_NE(m.find("the name 'extra.train"), std::string::npos) << m;
      EXPECT_NE(m.find("Nothing was written"), std::string::npos) << m;
    }
    hp::barrier(hp::world_group());
    EXPECT_EQ(hp_test::read_bytes(dir.path + "/LATEST"), latest) << key;
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path), std::filesystem::directory_iterator()), files) << key;
  }
  // '=' and non-ASCII keys are written and read back exactly.
  std::map<std::string, at::Tensor> extra{{"lr=3e-4", at::full({1}, 2.0)}, {"Verlust\u00b7\u00fc", at::full({1}, 3.0)}};
  hp::TrainState st = t.state;
  st.extra = &extra;
  hp::save_train_state(dir, st);
  std::map<std::string, at::Tensor> back;
  seed_all(34);
  Trainer other(Layout::Tp, 4);
  hp::TrainState other_state = other.state;
  other_state.extra = &back;
  hp::load_train_state(dir, other_state);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_TRUE(at::equal(back.at("lr=3e-4"), extra.at("lr=3e-4")));
  EXPECT_TRUE(at::equal(back.at("Verlust\u00b7\u00fc"), extra.at("Verlust\u00b7\u00fc")));
  // A parameter FQN with a space.
  torch::nn::Module spaced;
  spaced.register_module("my layer", torch::nn::Linear(2, 2));
  try {
    hp::save_sharded(spaced, dir.path + "_model");
    ADD_FAILURE() << "saved a parameter FQN with a space";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("the name 'my layer.weight' holds a space"), std::string::npos) << e.what();
  }
  hp::barrier(hp::world_group());
  EXPECT_FALSE(std::filesystem::exists(dir.path + "_model/LATEST"));
  hp::barrier(hp::world_group());
  if (hp::get_rank() == 0) std::filesystem::remove_all(dir.path + "_model");
}

// A warmup schedule resumed: the train state keeps the base rate (torch's initial_lr), so a
// scheduler built after the load and given the saved step sets the uninterrupted run's rate at
// once (0.8, not 0.8 · 0.8); the schedule's options are kept, and a resume under others is refused
// by name unless the user says the schedule changed.
TEST(TrainStateDist, SchedulerBuiltAfterTheLoadResumesTheUninterruptedRate) {
  const Scratch dir("schedule");
  hp::WarmupStableDecayOptions o;
  o.training_steps = 10;
  o.warmup_steps = 4;
  auto make = [](hnn::Linear& layer) {
    return std::make_unique<torch::optim::AdamW>(hp::unique_parameters(*layer), torch::optim::AdamWOptions(1.0));
  };
  seed_all(35);
  hnn::Linear layer(4, 4);
  auto opt = make(layer);
  auto sched = hp::linear_warmup_stable_decay(*opt, o);
  hp::TrainState st{layer.get(), opt.get(), &sched};
  for (; st.step < 3; ++st.step) {
    layer(at::ones({2, 4})).sum().backward();
    opt->step();
    opt->zero_grad();
    sched.step();
  }
  const double due = opt->param_groups()[0].options().get_lr();
  EXPECT_DOUBLE_EQ(due, 0.8);
  hp::save_train_state(dir, st);
  // Resumed: a fresh optimizer, the state loaded without a scheduler, then the scheduler.
  hnn::Linear resumed(4, 4);
  auto opt2 = make(resumed);
  hp::TrainState back{resumed.get(), opt2.get()};
  hp::load_train_state(dir, back);
  EXPECT_EQ(back.step, 3);
  EXPECT_DOUBLE_EQ(opt2->param_groups()[0].options().get_lr(), 1.0) << "the load restores the base rate";
  auto sched2 = hp::linear_warmup_stable_decay(*opt2, o, back.step);
  EXPECT_DOUBLE_EQ(opt2->param_groups()[0].options().get_lr(), due);
  // With the scheduler in the state: the same rate.
  hnn::Linear again(4, 4);
  auto opt3 = make(again);
  auto sched3 = hp::linear_warmup_stable_decay(*opt3, o);
  hp::TrainState with{again.get(), opt3.get(), &sched3};
  hp::load_train_state(dir, with);
  EXPECT_DOUBLE_EQ(opt3->param_groups()[0].options().get_lr(), due);
  // Other options: refused by name, nothing changed; accepted when the user says so.
  hp::WarmupStableDecayOptions other = o;
  other.warmup_steps = 2;
  hnn::Linear third(4, 4);
  auto opt4 = make(third);
  auto sched4 = hp::linear_warmup_stable_decay(*opt4, other);
  hp::TrainState changed{third.get(), opt4.get(), &sched4};
  try {
    hp::load_train_state(dir, changed);
    ADD_FAILURE() << "resumed under another schedule";
  } catch (const c10::ValueError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("the run was saved under the schedule 'linear_warmup_stable_decay training_steps=10 warmup_steps=4"), std::string::npos) << m;
    EXPECT_NE(m.find("schedule_changed"), std::string::npos) << m;
  }
  EXPECT_EQ(changed.step, 0);
  hp::load_train_state(dir, changed, {/*schedule_changed=*/true});
  EXPECT_EQ(sched4.last_step(), 3);
  EXPECT_DOUBLE_EQ(opt4->param_groups()[0].options().get_lr(), hp::warmup_stable_decay_factor(other, 3));
}

// keep = 2 and one flipped byte in the newest generation's rank_0.bin: a load names the file and
// points at fall_back; with fall_back every rank loads the generation before, bitwise, the damaged
// one is set aside as gen_2.damaged and LATEST names the loaded one (a plain load and
// has_train_state then agree with it). Later saves never prune the good generations for it.
TEST(TrainStateDist, DamagedNewestGenerationFallsBackToTheNewestThatVerifies) {
  const Scratch dir("damaged_newest");
  seed_all(35);
  Trainer t(Layout::Tp, 4);
  t.step();
  hp::save_train_state(dir, t.state, {/*keep=*/2});
  const auto at_one = t.gathered();
  t.step();
  hp::save_train_state(dir, t.state, {/*keep=*/2});
  hp::barrier(hp::world_group());
  if (hp::get_rank() == 0) {
    const std::string bin = dir.path + "/gen_2/rank_0.bin";
    std::string bytes = hp_test::read_bytes(bin);
    bytes[bytes.size() / 3] ^= 0x10;
    hp_test::write_bytes(bin, bytes);
  }
  hp::barrier(hp::world_group());
  {
    seed_all(1);
    Trainer plain(Layout::Tp, 4);
    const auto before = plain.gathered();
    try {
      hp::load_train_state(dir, plain.state);
      ADD_FAILURE() << "a damaged generation loaded";
    } catch (const c10::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("rank_0.bin"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("fall_back"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(bitwise_equal(plain.gathered(), before));
  }
  seed_all(1);
  Trainer resumed(Layout::Tp, 4);
  hp::TrainStateLoadOptions options;
  options.fall_back = true;
  hp::load_train_state(dir, resumed.state, options);
  EXPECT_EQ(resumed.state.step, 1);
  std::string why;
  EXPECT_TRUE(bitwise_equal(resumed.gathered(), at_one, &why)) << why;
  EXPECT_TRUE(std::filesystem::is_directory(dir.path + "/gen_2.damaged"));
  EXPECT_FALSE(std::filesystem::exists(dir.path + "/gen_2"));
  EXPECT_TRUE(hp::has_train_state(dir));
  {
    seed_all(1);
    Trainer plain(Layout::Tp, 4);
    hp::load_train_state(dir, plain.state);  // LATEST names generation 1 now
    EXPECT_TRUE(bitwise_equal(plain.gathered(), at_one));
  }
  // Two more saves at keep = 2: the two newest good generations stay, the damaged one is kept aside.
  for (int k = 0; k < 2; ++k) {
    resumed.step();
    hp::save_train_state(dir, resumed.state, {/*keep=*/2});
  }
  hp::barrier(hp::world_group());
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.path))
    if (e.path().filename().string().rfind("gen_", 0) == 0) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"gen_2", "gen_2.damaged", "gen_3"}));
  seed_all(1);
  Trainer last(Layout::Tp, 4);
  hp::load_train_state(dir, last.state, options);
  EXPECT_EQ(last.state.step, 3);
  EXPECT_TRUE(bitwise_equal(last.gathered(), resumed.gathered()));
  hp::barrier(hp::world_group());
}

TEST(TrainStateDist, BadStatesAreRefusedEverywhereWithNothingChanged) {
  const Scratch dir("bad");
  seed_all(31);
  Trainer source(Layout::Tp, 4);
  source.step();
  hp::save_train_state(dir, source.state);
  auto expect_refused = [&](Trainer& t, const std::vector<std::string>& words) {
    const auto before = t.gathered();
    const int64_t step = t.state.step;
    try {
      hp::load_train_state(dir, t.state);
      ADD_FAILURE() << "loaded, expected: " << words[0];
    } catch (const c10::ValueError& e) {
      for (const auto& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
    }
    EXPECT_TRUE(bitwise_equal(t.gathered(), before)) << "a refused load changed the state";
    EXPECT_EQ(t.state.step, step);
  };
  // Another model config: the FQN and both shapes named.
  {
    seed_all(1);
    Trainer other(Layout::Tp, 4, /*unused_out=*/6);
    expect_refused(other, {"'unused.weight'", "[4, 4]", "[6, 4]"});
  }
  // Another optimizer: named.
  {
    seed_all(1);
    Trainer other(Layout::Tp, 4);
    std::vector<at::Tensor> ps = hp::unique_parameters(*other.model);
    torch::optim::Adam adam(ps);
    hp::TrainState s{other.model.get(), &adam};
    try {
      hp::load_train_state(dir, s);
      ADD_FAILURE() << "an Adam loaded AdamW's state";
    } catch (const c10::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("saved by AdamW, the optimizer now is Adam"), std::string::npos) << e.what();
    }
  }
  // A damaged LATEST: an error naming it, not a fresh start, and a save over it is refused with
  // every generation kept.
  {
    const std::string latest = dir.path + "/LATEST";
    std::string original;
    hp::barrier(hp::world_group());
    if (hp::get_rank() == 0) {
      original = hp_test::read_bytes(latest);
      std::string bad = original;
      bad[bad.size() / 2] ^= 0x04;
      hp_test::write_bytes(latest, bad);
    }
    hp::barrier(hp::world_group());
    EXPECT_THROW(hp::has_train_state(dir), c10::ValueError);
    const auto before = std::distance(std::filesystem::directory_iterator(dir.path), std::filesystem::directory_iterator());
    try {
      hp::save_train_state(dir, source.state);
      ADD_FAILURE() << "saved over a damaged LATEST";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("LATEST"), std::string::npos) << e.what();
    }
    hp::barrier(hp::world_group());
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path), std::filesystem::directory_iterator()), before);
    hp::barrier(hp::world_group());
    if (hp::get_rank() == 0) hp_test::write_bytes(latest, original);
    hp::barrier(hp::world_group());
    EXPECT_TRUE(hp::has_train_state(dir));
  }
  // A flipped byte in a moment (rank 1 flips one in its own piece of linear1's exp_avg): the file,
  // the key and the piece named, on every rank.
  {
    hp::barrier(hp::world_group());
    if (hp::get_rank() == 1) {
      const std::string path = hp::checkpoint_generation_dir(dir) + "/rank_1.bin";
      std::string bytes = hp_test::read_bytes(path);
      const at::Tensor w = source.model->mlp->linear1->weight();
      const auto& st = static_cast<const torch::optim::AdamWParamState&>(*source.opt->state().at(w.unsafeGetTensorImpl()));
      const at::Tensor local = hp::local_tensor(st.exp_avg()).contiguous();
      const std::string pattern(static_cast<const char*>(local.data_ptr()), static_cast<size_t>(local.numel() * 4));
      const auto at_ = bytes.find(pattern);
      ASSERT_NE(at_, std::string::npos);
      bytes[at_ + 5] = static_cast<char>(bytes[at_ + 5] ^ 0x10);
      hp_test::write_bytes(path, bytes);
    }
    hp::barrier(hp::world_group());
    seed_all(1);
    Trainer other(Layout::Tp, 4);
    const std::string offset = "offset [" + std::to_string(16 / hp::get_world_size()) + ",0]";  // rank 1's rows
    expect_refused(other, {"rank_1.bin", "'optimizer.state.mlp.linear1.weight.exp_avg'", offset, "rank(s) [1]", "flipped bytes"});
  }
}

}  // namespace t_dist_checkpoint_train_state_test
