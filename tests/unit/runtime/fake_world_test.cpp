// A fake world (init_fake_process_group): one process plays one rank of a large job. Collectives
// give real shapes and their documented values without peers, CommDebugMode counts them as a real
// run would, meshes of any shape build, and what needs real peers is refused. MemoryTracker counts
// meta and CPU storages.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdlib>

#include <hyper_parallel/checkpoint/sharded_checkpoint.h>
#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/mesh/device_mesh.h>
#include <hyper_parallel/runtime/c10d_interop.h>
#include <hyper_parallel/runtime/collectives.h>
#include <hyper_parallel/runtime/comm_debug_mode.h>
#include <hyper_parallel/runtime/memory_tracker.h>
#include <hyper_parallel/runtime/process_group.h>
#include "../../common/error_message.h"

namespace hp = hyper_parallel;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_unit_runtime_fake_world_test {
namespace {

class FakeWorld : public ::testing::Test {
 protected:
  void TearDown() override {
    hp::destroy_process_group();
    unsetenv("HP_FAKE_WORLD");
    unsetenv("HP_FAKE_RANK");
  }
};


at::Tensor meta(std::vector<int64_t> shape) { return at::empty(shape, at::TensorOptions().device(at::kMeta)); }

}  // namespace

TEST_F(FakeWorld, CollectivesGiveRealShapesAndTheDocumentedValues) {
  hp::init_fake_process_group(8, 3);
  ASSERT_TRUE(hp::is_fake_world());
  EXPECT_EQ(hp::get_world_size(), 8);
  EXPECT_EQ(hp::get_rank(), 3);
  const hp::Group g = hp::world_group();
  EXPECT_EQ(g.transport(), "fake");
  EXPECT_EQ(g.backend_name(), "fake");
  const at::Tensor x = at::arange(6, at::kFloat).view({2, 3});
  // As if every rank held x: the gather repeats it, a sum multiplies it by 8, the rest keep it.
  EXPECT_TRUE(at::equal(hp::all_gather(x, 0, g), at::cat(std::vector<at::Tensor>(8, x), 0)));
  EXPECT_TRUE(at::equal(hp::all_gather(x, 1, g), at::cat(std::vector<at::Tensor>(8, x), 1)));
  EXPECT_TRUE(at::equal(hp::all_reduce(x, hp::ReduceOp::SUM, g), x * 8));
  for (auto op : {hp::ReduceOp::AVG, hp::ReduceOp::MAX, hp::ReduceOp::MIN}) EXPECT_TRUE(at::equal(hp::all_reduce(x, op, g), x));
  const at::Tensor big = at::arange(48, at::kFloat).view({16, 3});
  EXPECT_TRUE(at::equal(hp::reduce_scatter(big, hp::ReduceOp::SUM, 0, g), big.narrow(0, 6, 2) * 8));
  // Uneven: torch.chunk of 10 rows over 8 ranks gives rank 3 two rows ([6, 8)).
  const at::Tensor ten = at::arange(30, at::kFloat).view({10, 3});
  EXPECT_TRUE(at::equal(hp::reduce_scatter(ten, hp::ReduceOp::MAX, 0, g), ten.narrow(0, 6, 2)));
  EXPECT_TRUE(at::equal(hp::scatter(big, 0, 0, g), big.narrow(0, 6, 2)));
  at::Tensor b = x.clone();
  hp::broadcast_(b, 5, g);
  EXPECT_TRUE(at::equal(b, x));
  // all_to_all: rank 3's piece of every rank's split dim, which is its own.
  const at::Tensor a2a = hp::all_to_all(big, 0, 1, g);
  EXPECT_TRUE(at::equal(a2a, at::cat(std::vector<at::Tensor>(8, big.narrow(0, 6, 2)), 1)));
  hp::barrier(g);
}

TEST_F(FakeWorld, MetaCollectivesComputeShapesAndCountAsARealRun) {
  hp::init_fake_process_group(8, 7);
  const hp::Group g = hp::world_group();
  hp::CommDebugMode comm;
  // 10 rows over 8 ranks: torch.chunk gives rank 7 nothing (2, 2, 2, 2, 2, 0, 0, 0).
  const at::Tensor gathered = hp::all_gather(meta({0, 4}), 0, g, 10);
  EXPECT_TRUE(gathered.is_meta());
  EXPECT_EQ(gathered.sizes(), (std::vector<int64_t>{10, 4}));
  EXPECT_EQ(hp::reduce_scatter(meta({10, 4}), hp::ReduceOp::SUM, 0, g).sizes(), (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(hp::reduce_scatter(meta({16, 4}), hp::ReduceOp::SUM, 0, g).sizes(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(hp::all_reduce(meta({5, 4}), hp::ReduceOp::SUM, g).sizes(), (std::vector<int64_t>{5, 4}));
  EXPECT_EQ(hp::all_to_all(meta({16, 2}), 0, 1, g).sizes(), (std::vector<int64_t>{2, 16}));
  EXPECT_EQ(hp::scatter(meta({16, 3}), 1, 0, g).sizes(), (std::vector<int64_t>{16, 0}));
  EXPECT_EQ(comm.get_comm_count("all_gather"), 1);
  EXPECT_EQ(comm.get_comm_count("reduce_scatter"), 2);
  EXPECT_EQ(comm.get_total_counts(), 6);
  // Bytes are this rank's input; full_bytes the whole tensor (here 10 x 4 floats gathered).
  const auto groups = comm.get_comm_group_stats();  // a copy: the reference below points into it
  const auto& stats = groups.at(g.ranks()).at("forward");
  EXPECT_EQ(stats.at("all_gather").bytes, 0);
  EXPECT_EQ(stats.at("all_gather").full_bytes, 10 * 4 * 4);
  EXPECT_EQ(stats.at("reduce_scatter").bytes, (10 + 16) * 4 * 4);
  EXPECT_EQ(stats.at("all_reduce").full_bytes, 5 * 4 * 4);
}

TEST_F(FakeWorld, MeshesOfAThousandRanksInAnyShape) {
  hp::init_fake_process_group(1024, 1000);
  const hp::DeviceMesh m = hp::init_device_mesh("cpu", {128, 8}, {"dp", "tp"});
  EXPECT_EQ(*m.get_coordinate(), (std::vector<int64_t>{125, 0}));
  std::vector<int64_t> tp, dp;
  for (int64_t i = 0; i < 8; ++i) tp.push_back(1000 + i);
  for (int64_t i = 0; i < 128; ++i) dp.push_back(i * 8);
  EXPECT_EQ(m["tp"].get_group().ranks(), tp);
  EXPECT_EQ(m["dp"].get_group().ranks(), dp);
  // (pp, dp, tp): rank 1000 = 3 * 256 + 29 * 8 + 0.
  const hp::DeviceMesh m3 = hp::init_device_mesh("cpu", {4, 32, 8}, {"pp", "dp", "tp"});
  EXPECT_EQ(*m3.get_coordinate(), (std::vector<int64_t>{3, 29, 0}));
  EXPECT_EQ(m3["pp"].get_group().ranks(), (std::vector<int64_t>{232, 488, 744, 1000}));
  // A DTensor on the fake mesh: its local piece and, from real values, the documented gather.
  const at::Tensor w = at::arange(64 * 4, at::kFloat).view({64, 4});
  const hp::DTensor d = hp::distribute_tensor(w, m["tp"], {hp::Shard(0)});
  EXPECT_TRUE(at::equal(d.to_local(), w.narrow(0, 0, 8)));  // tp coordinate 0
  EXPECT_TRUE(at::equal(d.full_tensor(), at::cat(std::vector<at::Tensor>(8, w.narrow(0, 0, 8)), 0)));
  EXPECT_NE(hp_test::error_message([] { hp::init_device_mesh("cpu", {100, 8}, {"dp", "tp"}); }).find("world size is 1024"),
            std::string::npos);
}

TEST_F(FakeWorld, WhatNeedsRealPeersIsRefused) {
  hp::init_fake_process_group(64, 2);
  torch::nn::Module model;
  model.register_parameter("w", at::zeros({4}));
  for (const auto& m : {hp_test::error_message([&] { hp::save_sharded(model, "/nonexistent/never"); }),
                        hp_test::error_message([&] { hp::load_sharded(model, "/nonexistent/never"); }),
                        hp_test::error_message([&] { hp::c10d_group(hp::world_group()); })}) {
    EXPECT_NE(m.find("rank 2 of a fake world of 64 ranks"), std::string::npos) << m;
    EXPECT_NE(m.find("Run it in a real job"), std::string::npos) << m;
  }
  EXPECT_THROW(hp::load_sharded(model, "/nonexistent/never"), c10::NotImplementedError);
}

TEST_F(FakeWorld, InitProcessGroupReadsHpFakeWorld) {
  setenv("HP_FAKE_WORLD", "16", 1);
  setenv("HP_FAKE_RANK", "5", 1);
  hp::init_process_group();
  EXPECT_TRUE(hp::is_fake_world());
  EXPECT_EQ(hp::get_world_size(), 16);
  EXPECT_EQ(hp::get_rank(), 5);
  hp::destroy_process_group();
  EXPECT_FALSE(hp::is_fake_world());
  setenv("HP_FAKE_RANK", "16", 1);
  EXPECT_NE(hp_test::error_message([] { hp::init_process_group(); }).find("rank 16 is outside the world of size 16"), std::string::npos);
  setenv("HP_FAKE_WORLD", "x", 1);
  EXPECT_THROW(hp::init_process_group(), c10::ValueError);
  EXPECT_FALSE(hp::is_initialized());
}

TEST(MemoryTracker, CountsMetaAndCpuStoragesLiveAndTransient) {
  for (const char* device : {"meta", "cpu"}) {
    hp::MemoryTracker mem(device);
    const auto o = at::TensorOptions().device(device);
    at::Tensor kept = at::empty({256}, o);  // 1 KiB, still alive at the end
    {
      at::Tensor a = at::empty({1024}, o), b = at::empty({512}, o);  // 6 KiB, freed
      at::Tensor view = a.narrow(0, 0, 10);                          // a view: no storage
      EXPECT_EQ(mem.live_bytes(), 1024 + 4096 + 2048) << device;
    }
    at::Tensor c = at::empty({128}, o);  // 512 B, alive
    EXPECT_EQ(mem.live_bytes(), 1024 + 512) << device;
    EXPECT_EQ(mem.peak_bytes(), 1024 + 4096 + 2048) << device;
    EXPECT_EQ(mem.transient_peak_bytes(), 4096 + 2048) << device;
    EXPECT_EQ(mem.allocations(), 4) << device;
    EXPECT_THROW(hp::MemoryTracker second(device), c10::ValueError);
  }
  // The allocator is back: what is made now counts nowhere, and a new tracker starts at zero.
  hp::MemoryTracker again("cpu");
  EXPECT_EQ(again.live_bytes(), 0);
  EXPECT_THROW(hp::MemoryTracker("cuda"), c10::ValueError);
}

TEST_F(FakeWorld, AllToAllSingleGivesShapesOnMetaAndThisRanksRowsOnRealTensors) {
  hp::init_fake_process_group(4, 1);
  hp::Group g = hp::world_group();
  hp::CommDebugMode comm;
  EXPECT_EQ(hp::all_to_all_single(meta({10, 8}), {3, 0, 2, 6}, {1, 2, 3, 4}, g).sizes(), at::IntArrayRef({11, 8}));
  // Every rank sends this rank what it sends itself (rows 1..2 of its input).
  at::Tensor x = at::arange(20, at::kFloat).view({10, 2});
  at::Tensor got = hp::all_to_all_single(x, {2, 2, 2, 2}, {1, 2, 3, 4}, g);
  EXPECT_TRUE(at::equal(got, x.narrow(0, 1, 2).repeat({4, 1})));
  EXPECT_EQ(comm.get_comm_counts().at("all_to_all"), 2);
  // Output sizes that contradict that are refused by name.
  EXPECT_THROW(hp::all_to_all_single(x, {2, 1, 2, 2}, {1, 2, 3, 4}, g), c10::ValueError);
}

}  // namespace t_unit_runtime_fake_world_test
