// Sharded checkpoints: every resharding path exact, and bad checkpoints refused before anything
// is loaded.
#include <gtest/gtest.h>

#include <torch/serialize.h>

#include <cstdio>
#include <fstream>

#include "../tensor_parallel/tp_models.h"

using namespace tp_test;

namespace {

// A scratch directory shared by the ranks of this job (same machine).
std::string scratch(const std::string& name) {
  const char* port = std::getenv("MASTER_PORT");
  return "/tmp/hp_ckpt_" + std::string(port ? port : "0") + "_" + name;
}

hp::ParallelizePlan mlp_plan() { return {{"linear1", hp::ColwiseParallel()}, {"linear2", hp::RowwiseParallel()}}; }

void expect_same_values(torch::nn::Module& a, torch::nn::Module& b) {
  auto pb = b.named_parameters();
  for (const auto& p : a.named_parameters()) EXPECT_TRUE(at::equal(full(p.value()), full(pb[p.key()]))) << p.key();
}

void randomize(torch::nn::Module& m, uint64_t seed) {
  at::NoGradGuard g;
  for (auto& p : m.parameters()) {
    at::Tensor local = hp::is_dtensor(p) ? hp::DTensor(p).to_local() : p;
    local.copy_(random(local.sizes(), seed++));
  }
}

}  // namespace

TEST(ShardedCheckpoint, TpToSingleAndSingleToTp) {
  auto tp = hp::init_device_mesh("cpu", {tp_size()}, {"tp"});
  const std::string dir = scratch("tp");
  auto model = seeded<Mlp>(71, 8, 4 * tp_size());
  hp::parallelize_module(*model, tp, mlp_plan());
  hp::save_sharded(*model, dir);
  // tp=n -> tp=1: a plain model receives the whole tensors.
  auto plain = seeded<Mlp>(72, 8, 4 * tp_size());
  hp::load_sharded(*plain, dir);
  expect_same_values(*model, *plain);
  // tp=1 -> tp=n: a plain model's checkpoint loads into a parallelised one with other values.
  const std::string dir1 = scratch("single");
  {
    auto single = seeded<Mlp>(73, 8, 4 * tp_size());
    hp::save_sharded(*single, dir1);  // no DTensors: a 1-rank checkpoint, written by rank 0
    std::ifstream meta(dir1 + "/metadata");
    std::string magic, key;
    int64_t world = 0;
    std::getline(meta, magic);
    meta >> key >> world;
    EXPECT_EQ(world, 1);
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
    EXPECT_NO_THROW(torch::save(tensors, dir1 + "/full.pt"));
  } else {
    EXPECT_EQ(sd.size(), 0u);
  }
}

TEST(ShardedCheckpoint, DataTimesTensorParallelToTensorParallel) {
  ASSERT_EQ(hp::get_world_size(), 4);
  auto mesh = hp::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  const std::string dir = scratch("dptp");
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
  const std::string dir = scratch("bad");
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
  struct ExtraImpl : hnn::Cloneable<ExtraImpl> {
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
  if (hp::get_rank() == 0) {
    std::rename((dir + "/rank_1.meta").c_str(), (dir + "/rank_1.meta.away").c_str());
  }
  hp::barrier(hp::world_group());
  auto target = seeded<Mlp>(80, 8, 4 * tp_size());
  expect_unchanged_after(*target, [&] { hp::load_sharded(*target, dir); }, "rank_1.meta is missing");
  hp::barrier(hp::world_group());
  if (hp::get_rank() == 0) {
    std::rename((dir + "/rank_1.meta.away").c_str(), (dir + "/rank_1.meta").c_str());
    std::ifstream in(dir + "/rank_0.pt", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(dir + "/rank_0.pt", std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() / 2);
  }
  hp::barrier(hp::world_group());
  expect_unchanged_after(*target, [&] { hp::load_sharded(*target, dir); }, "rank_0.pt is truncated or corrupt");
}
