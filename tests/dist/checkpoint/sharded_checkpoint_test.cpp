// Sharded checkpoints: every resharding path exact, and bad checkpoints refused before anything
// is loaded.
#include <gtest/gtest.h>

#include <hyper_parallel/checkpoint/hf_checkpoint.h>
#include <hyper_parallel/checkpoint/train_state.h>

#include <torch/serialize.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <csignal>
#include <sys/resource.h>

#include "../../common/error_message.h"
#include "../../common/test_files.h"
#include "../tensor_parallel/tp_models.h"

using namespace tp_test;
using hp_test::read_bytes;
using hp_test::write_bytes;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_checkpoint_sharded_checkpoint_test {
namespace {

// A scratch directory shared by the ranks of this job (same machine), removed at the end of
// the test once every rank is done with it.
struct Scratch {
  explicit Scratch(const std::string& name) {
    const char* port = std::getenv("MASTER_PORT");
    path = "/tmp/hp_ckpt_" + std::string(port ? port : "0") + "_" + name;
  }
  ~Scratch() {
    hp::barrier(hp::world_group());
    if (hp::get_rank() == 0) std::filesystem::remove_all(path);
  }
  operator const std::string&() const { return path; }
  std::string path;
};


std::vector<at::Tensor> snapshot(torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(full(p).clone());
  return out;
}
void expect_values(torch::nn::Module& m, const std::vector<at::Tensor>& values, const std::string& what) {
  auto ps = m.parameters();
  ASSERT_EQ(ps.size(), values.size());
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_TRUE(at::equal(full(ps[i]), values[i])) << what << ": parameter " << i;
}

// Loading must fail on every rank with `words` in the message, leaving every model unchanged.
void expect_refused(torch::nn::Module& m, const std::string& dir, const std::string& words) {
  const auto before = snapshot(m);
  try {
    hp::load_sharded(m, dir);
    ADD_FAILURE() << "loaded, expected: " << words;
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
  expect_values(m, before, "after a refused load");
}

hp::ParallelizePlan mlp_plan() { return {{"linear1", hp::ColwiseParallel()}, {"linear2", hp::RowwiseParallel()}}; }

void expect_same_values(torch::nn::Module& a, torch::nn::Module& b) {
  auto pb = b.named_parameters();
  for (const auto& p : a.named_parameters()) EXPECT_TRUE(at::equal(full(p.value()), full(pb[p.key()]))) << p.key();
}

void randomize(torch::nn::Module& m, uint64_t seed) {
  at::NoGradGuard g;
  for (auto& p : m.parameters()) {
    at::Tensor local = hp::local_tensor(p);
    local.copy_(random(local.sizes(), seed++));
  }
}

}  // namespace

TEST(ShardedCheckpoint, TpToSingleAndSingleToTp) {
  auto tp = hp::init_device_mesh("cpu", {tp_size()}, {"tp"});
  const Scratch dir("tp");
  auto model = seeded<Mlp>(71, 8, 4 * tp_size());
  hp::parallelize_module(*model, tp, mlp_plan());
  hp::save_sharded(*model, dir);
  // tp=n -> tp=1: a plain model receives the whole tensors.
  auto plain = seeded<Mlp>(72, 8, 4 * tp_size());
  hp::load_sharded(*plain, dir);
  expect_same_values(*model, *plain);
  // tp=1 -> tp=n: a plain model's checkpoint loads into a parallelised one with other values.
  const Scratch dir1("single");
  {
    auto single = seeded<Mlp>(73, 8, 4 * tp_size());
    hp::save_sharded(*single, dir1);  // no DTensors: a 1-rank checkpoint, written by rank 0
    std::ifstream meta(hp::checkpoint_generation_dir(dir1) + "/metadata");
    std::string text((std::istreambuf_iterator<char>(meta)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("\nworld_size 1\n"), std::string::npos) << text;
  }
  auto target = seeded<Mlp>(74, 8, 4 * tp_size());
  hp::parallelize_module(*target, tp, mlp_plan());
  hp::load_sharded(*target, dir1);
  auto single = seeded<Mlp>(73, 8, 4 * tp_size());
  expect_same_values(*target, *single);
  // full_state_dict: whole tensors on rank 0, writable by torch::save.
  auto sd = hp::full_state_dict(*target);
  if (hp::get_rank() == 0) {
    ASSERT_EQ(sd.size(), 4u);
    EXPECT_TRUE(at::equal(sd["linear1.weight"], single->linear1->weight()));
    std::vector<at::Tensor> tensors;
    for (const auto& item : sd) tensors.push_back(item.value());
    EXPECT_NO_THROW(torch::save(tensors, dir1.path + "/full.pt"));
  } else {
    EXPECT_EQ(sd.size(), 0u);
  }
}

TEST(ShardedCheckpoint, DataTimesTensorParallelToTensorParallel) {
  ASSERT_EQ(hp::get_world_size(), 4);
  auto mesh = hp::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  const Scratch dir("dptp");
  auto model = seeded<Mlp>(75, 8, 12);
  hp::parallelize_module(*model, mesh["tp"], mlp_plan());
  hp::fully_shard(*model, mesh["dp"]);
  randomize(*model, 5);  // values of its own, so the load cannot pass by accident
  hp::save_sharded(*model, dir);
  auto tp_only = seeded<Mlp>(76, 8, 12);
  hp::parallelize_module(*tp_only, mesh["tp"], mlp_plan());
  hp::load_sharded(*tp_only, dir);
  expect_same_values(*model, *tp_only);
  // ... and back into the dp x tp layout.
  auto again = seeded<Mlp>(77, 8, 12);
  hp::parallelize_module(*again, mesh["tp"], mlp_plan());
  hp::fully_shard(*again, mesh["dp"]);
  hp::load_sharded(*again, dir);
  expect_same_values(*model, *again);
}

TEST(ShardedCheckpoint, BadCheckpointsFailCleanlyAndLoadNothing) {
  auto tp = hp::init_device_mesh("cpu", {tp_size()}, {"tp"});
  const Scratch dir("bad");
  auto model = seeded<Mlp>(78, 8, 4 * tp_size());
  hp::parallelize_module(*model, tp, mlp_plan());
  hp::save_sharded(*model, dir);
  auto expect_unchanged_after = [&](torch::nn::Module& m, const std::function<void()>& load, const std::string& words) {
    std::vector<at::Tensor> before;
    for (const auto& p : m.parameters()) before.push_back(full(p).clone());
    try {
      load();
      ADD_FAILURE() << "loaded: " << words;
    } catch (const c10::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
    auto after = m.parameters();
    for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(at::equal(before[i], full(after[i]))) << "partially loaded";
  };
  // Another model: an extra key, another shape.
  struct ExtraImpl : hnn::ModuleBase<ExtraImpl> {
    ExtraImpl() {
      linear1 = register_module("linear1", hnn::Linear(8, 4 * tp_size()));
      extra = register_module("extra", hnn::Linear(2, 2));
    }
    hnn::Linear linear1{nullptr}, extra{nullptr};
  } extra;
  expect_unchanged_after(extra, [&] { hp::load_sharded(extra, dir); }, "'extra.weight'");
  auto wider = seeded<Mlp>(79, 8, 8 * tp_size());
  expect_unchanged_after(*wider, [&] { hp::load_sharded(*wider, dir); }, "linear1.weight' has shape");
  hp::barrier(hp::world_group());
  // A missing rank file (another world layout) and a truncated file.
  const std::string gen = hp::checkpoint_generation_dir(dir);
  if (hp::get_rank() == 0) {
    std::rename((gen + "/rank_1.meta").c_str(), (gen + "/rank_1.meta.away").c_str());
  }
  hp::barrier(hp::world_group());
  auto target = seeded<Mlp>(80, 8, 4 * tp_size());
  expect_unchanged_after(*target, [&] { hp::load_sharded(*target, dir); }, "rank_1.meta is missing");
  hp::barrier(hp::world_group());
  if (hp::get_rank() == 0) {
    std::rename((gen + "/rank_1.meta.away").c_str(), (gen + "/rank_1.meta").c_str());
    std::ifstream in(gen + "/rank_0.bin", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(gen + "/rank_0.bin", std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() / 2);
  }
  hp::barrier(hp::world_group());
  expect_unchanged_after(*target, [&] { hp::load_sharded(*target, dir); }, "rank_0.bin is truncated or corrupt");
}

// Flipped bytes, a truncated .meta, files of another save: refused on every rank, nothing loaded.
TEST(ShardedCheckpoint, CorruptedAndMixedFilesAreRefusedEverywhere) {
  auto tp = hp::init_device_mesh("cpu", {tp_size()}, {"tp"});
  const Scratch dir("corrupt");
  auto model = seeded<Mlp>(81, 8, 4 * tp_size());
  hp::parallelize_module(*model, tp, mlp_plan());
  hp::save_sharded(*model, dir, {/*keep=*/2});
  const std::string old_gen = hp::checkpoint_generation_dir(dir);
  randomize(*model, 9);
  hp::save_sharded(*model, dir, {/*keep=*/2});
  const std::string gen = hp::checkpoint_generation_dir(dir);
  ASSERT_NE(gen, old_gen);
  const auto saved = snapshot(*model);
  auto target = seeded<Mlp>(82, 8, 4 * tp_size());
  hp::parallelize_module(*target, tp, mlp_plan());
  const std::string last = std::to_string(tp_size() - 1);
  struct Case {
    std::string file, words;
    std::function<std::string(const std::string&)> damage;
  };
  const std::vector<Case> cases = {
      {"rank_" + last + ".bin", "crc does not match", [](std::string b) { b[b.size() / 2] ^= 0x10; return b; }},
      {"rank_" + last + ".bin", "bytes", [](std::string b) { return b.substr(0, b.size() - 7); }},
      {"rank_0.meta", "crc", [](std::string b) { b[b.size() / 3] ^= 0x01; return b; }},
      {"rank_0.meta", "truncated or corrupt", [](std::string b) { return b.substr(0, b.size() / 2); }},
      {"metadata", "truncated or corrupt", [](std::string b) { return b.substr(0, 10); }},
  };
  for (const auto& c : cases) {
    const std::string path = gen + "/" + c.file;
    std::string original;
    hp::barrier(hp::world_group());
    if (hp::get_rank() == 0) {
      original = read_bytes(path);
      write_bytes(path, c.damage(original));
    }
    hp::barrier(hp::world_group());
    expect_refused(*target, dir, c.words);
    hp::barrier(hp::world_group());
    if (hp::get_rank() == 0) write_bytes(path, original);
  }
  // A rank file of the previous save in the current generation.
  hp::barrier(hp::world_group());
  if (hp::get_rank() == 0)
    for (const char* ext : {".bin", ".meta"}) {
      const std::string f = "/rank_" + last + ext;
      std::filesystem::rename(gen + f, gen + f + ".keep");
      std::filesystem::copy_file(old_gen + f, gen + f);
    }
  hp::barrier(hp::world_group());
  expect_refused(*target, dir, "belongs to checkpoint");
  hp::barrier(hp::world_group());
  if (hp::get_rank() == 0)
    for (const char* ext : {".bin", ".meta"}) {
      const std::string f = "/rank_" + last + ext;
      std::filesystem::remove(gen + f);
      std::filesystem::rename(gen + f + ".keep", gen + f);
    }
  hp::barrier(hp::world_group());
  hp::load_sharded(*target, dir);  // repaired: loads, exactly
  expect_values(*target, saved, "after repair");
}

// A disk that fills up on one rank during a save: an error on every rank, and the previous
// checkpoint stays current and loads bit-exact. (RLIMIT_FSIZE stands in for a full disk: the
// write fails with EFBIG, as it would with ENOSPC.)
TEST(ShardedCheckpoint, DiskFullOnOneRankLosesNothing) {
  auto tp = hp::init_device_mesh("cpu", {tp_size()}, {"tp"});
  const Scratch dir("full");
  auto model = seeded<Mlp>(83, 8, 4 * tp_size());
  hp::parallelize_module(*model, tp, mlp_plan());
  hp::save_sharded(*model, dir);
  const auto first = snapshot(*model);
  const std::string gen = hp::checkpoint_generation_dir(dir);
  randomize(*model, 11);
  const bool victim = hp::get_rank() == hp::get_world_size() - 1;
  struct rlimit old_limit;
  ::getrlimit(RLIMIT_FSIZE, &old_limit);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  if (victim) {
    struct rlimit small = old_limit;
    small.rlim_cur = 100;  // less than its shards
    ::setrlimit(RLIMIT_FSIZE, &small);
  }
  try {
    hp::save_sharded(*model, dir);
    ADD_FAILURE() << "save succeeded on a full disk";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("save_sharded: rank(s) [" + std::to_string(hp::get_world_size() - 1) + "] failed"),
              std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("File too large"), std::string::npos) << e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(hp::checkpoint_generation_dir(dir), gen);
  auto target = seeded<Mlp>(84, 8, 4 * tp_size());
  hp::parallelize_module(*target, tp, mlp_plan());
  hp::load_sharded(*target, dir);
  expect_values(*target, first, "the previous checkpoint");
  // The failed generation was removed; the next save works and commits.
  hp::barrier(hp::world_group());
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path), std::filesystem::directory_iterator()), 2);
  hp::barrier(hp::world_group());
  hp::save_sharded(*model, dir);
  hp::load_sharded(*target, dir);
  expect_values(*target, snapshot(*model), "the next checkpoint");
}

// Driven by tests/tools/checkpoint_fault_test.sh, which kills ranks in the middle of saves
// (HP_FAULT) and then checks that the previous checkpoint still loads bit-exact.
// HP_TEST_CKPT=save|verify|state|state_verify|async_fail:<dir>:<seed>.
TEST(CheckpointFault, SaveOrVerify) {
  const char* spec = std::getenv("HP_TEST_CKPT");
  if (spec == nullptr) GTEST_SKIP() << "run by checkpoint_fault_test.sh";
  const std::string s(spec);
  const size_t a = s.find(':'), b = s.rfind(':');
  const std::string mode = s.substr(0, a), dir = s.substr(a + 1, b - a - 1);
  const uint64_t seed = std::stoull(s.substr(b + 1));
  auto tp = hp::init_device_mesh("cpu", {tp_size()}, {"tp"});
  auto model = seeded<Mlp>(90, 8, 4 * tp_size());
  hp::parallelize_module(*model, tp, mlp_plan());
  randomize(*model, seed);
  // HP_TEST_CKPT_FORMAT=hf: the same through save_hf_checkpoint / load_hf_checkpoint.
  const char* format = std::getenv("HP_TEST_CKPT_FORMAT");
  const bool hf = format != nullptr && std::string(format) == "hf";
  if (mode == "save") {
    if (hf) hp::save_hf_checkpoint(*model, dir);
    else hp::save_sharded(*model, dir);
    return;
  }
  // Train states: "state" saves one; "async_fail" starts a save in the background, then rank 1
  // fails (an exception unwinds past the handle) and exits while rank 0 goes on to the next
  // step's collective, which must raise naming rank 1 rather than meet a commit (unless hprun
  // stops rank 0 first, as it stops every rank once one fails).
  if (mode == "state") {
    hp::save_train_state(dir, hp::TrainState{model.get(), nullptr});
    return;
  }
  if (mode == "async_fail") {
    if (hp::get_rank() == 1) {
      try {
        auto pending = hp::async_save_train_state(dir, hp::TrainState{model.get(), nullptr});
        throw std::runtime_error("the step after the save failed on rank 1");
      } catch (const std::runtime_error&) {
      }
      std::exit(3);
    }
    auto pending = hp::async_save_train_state(dir, hp::TrainState{model.get(), nullptr});
    at::Tensor loss = at::ones({1});
    const std::string m = hp_test::error_message([&] { hp::all_reduce_(loss, hp::ReduceOp::SUM, hp::world_group()); });
    EXPECT_NE(m.find("rank(s) [1]"), std::string::npos) << m;
    return;
  }
  auto target = seeded<Mlp>(91, 8, 4 * tp_size());
  hp::parallelize_module(*target, tp, mlp_plan());
  hp::TrainState target_state{target.get(), nullptr};
  if (mode == "state_verify") hp::load_train_state(dir, target_state);
  else if (hf) hp::load_hf_checkpoint(*target, dir);
  else hp::load_sharded(*target, dir);
  expect_values(*target, snapshot(*model), "checkpoint of seed " + std::to_string(seed));
}

}  // namespace t_dist_checkpoint_sharded_checkpoint_test
