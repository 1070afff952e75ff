#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <hyper_parallel/mesh/device_mesh.h>
#include <hyper_parallel/runtime/collectives.h>
#include <hyper_parallel/runtime/errors.h>

namespace hp = hyper_parallel;

// Needs 4 ranks.
TEST(DeviceMesh2x2Dist, SlicingCoordinatesAndGroups) {
  ASSERT_EQ(hp::get_world_size(), 4);
  auto mesh = hp::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  const int64_t me = hp::get_rank();
  EXPECT_EQ(mesh.ndim(), 2);
  EXPECT_EQ(mesh.size(), 4);
  EXPECT_EQ(mesh.size(0), 2);
  EXPECT_EQ(mesh.size(-1), 2);
  EXPECT_EQ(mesh.to_string(), "DeviceMesh('cpu', [[0, 1], [2, 3]], mesh_dim_names=('dp', 'tp'))");
  const std::vector<int64_t> coord{me / 2, me % 2};
  EXPECT_EQ(*mesh.get_coordinate(), coord);

  auto tp = mesh["tp"];
  auto dp = mesh["dp"];
  EXPECT_EQ(tp.ndim(), 1);
  EXPECT_EQ(tp.ranks(), (std::vector<int64_t>{me / 2 * 2, me / 2 * 2 + 1}));
  EXPECT_EQ(dp.ranks(), (std::vector<int64_t>{me % 2, me % 2 + 2}));
  EXPECT_EQ(tp.get_local_rank(), me % 2);
  EXPECT_EQ(dp.get_local_rank(), me / 2);
  EXPECT_EQ(tp.mesh_dim_names(), std::vector<std::string>{"tp"});
  // The sub-mesh shares the parent's group (created once).
  EXPECT_EQ(tp.get_group(), mesh.get_group("tp"));
  EXPECT_EQ(dp.get_group(0), mesh.get_group(0));

  // Collectives on each dimension's group reach exactly the peers along it.
  at::Tensor t = at::full({1}, static_cast<double>(me), at::kLong);
  auto tp_sum = hp::all_reduce(t, hp::ReduceOp::SUM, tp.get_group());
  auto dp_sum = hp::all_reduce(t, hp::ReduceOp::SUM, dp.get_group());
  EXPECT_EQ(tp_sum.item<int64_t>(), (me / 2 * 2) * 2 + 1);
  EXPECT_EQ(dp_sum.item<int64_t>(), (me % 2) * 2 + 2);

  // A second mesh of the same shape reuses the cached groups.
  auto again = hp::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  EXPECT_EQ(again.get_group("tp"), mesh.get_group("tp"));
  EXPECT_EQ(again, mesh);
  EXPECT_EQ(again.shared_seed(), mesh.shared_seed());
}

// A 1-D slice unflattened: the tp ranks of a (dp=1, tp=4) mesh viewed as (kv=2, kv_replica=2),
// with working groups along both new dimensions; bad sizes refused.
TEST(DeviceMesh2x2Dist, UnflattenSplitsAOneDimensionalMesh) {
  ASSERT_EQ(hp::get_world_size(), 4);
  const int64_t me = hp::get_rank();
  auto tp = hp::init_device_mesh("cpu", {1, 4}, {"dp", "tp"})["tp"];
  auto kv = tp.unflatten(0, {2, 2}, {"kv", "kv_replica"});
  EXPECT_EQ(kv.to_string(), "DeviceMesh('cpu', [[0, 1], [2, 3]], mesh_dim_names=('kv', 'kv_replica'))");
  EXPECT_EQ(*kv.get_coordinate(), (std::vector<int64_t>{me / 2, me % 2}));
  EXPECT_EQ(kv["kv"].ranks(), (std::vector<int64_t>{me % 2, me % 2 + 2}));
  EXPECT_EQ(kv["kv_replica"].ranks(), (std::vector<int64_t>{me / 2 * 2, me / 2 * 2 + 1}));
  at::Tensor t = at::full({1}, static_cast<double>(me), at::kLong);
  EXPECT_EQ(hp::all_reduce(t, hp::ReduceOp::SUM, kv.get_group("kv_replica")).item<int64_t>(), (me / 2 * 2) * 2 + 1);
  EXPECT_EQ(hp::all_reduce(t, hp::ReduceOp::SUM, kv.get_group("kv")).item<int64_t>(), (me % 2) * 2 + 2);
  EXPECT_THROW(tp.unflatten(0, {3, 2}, {"a", "b"}), c10::ValueError);
  EXPECT_THROW(tp.unflatten(0, {2, 2}, {"a"}), c10::ValueError);
  EXPECT_THROW(kv.unflatten(0, {1, 2}, {"a", "b"}), c10::NotImplementedError);
}

TEST(DeviceMeshDist, OneDimensionalMeshIsTheWorld) {
  auto mesh = hp::init_device_mesh("cpu", {hp::get_world_size()}, {"tp"});
  EXPECT_EQ(mesh.get_group(), hp::world_group());
  EXPECT_EQ(mesh["tp"], mesh);
  EXPECT_EQ(mesh.get_local_rank(), hp::get_rank());
  // Every rank got rank 0's seed.
  at::Tensor s = at::full({1}, static_cast<int64_t>(mesh.shared_seed()), at::kLong);
  at::Tensor s0 = s.clone();
  hp::broadcast_(s0, 0, mesh.get_group());
  EXPECT_TRUE(at::equal(s, s0));
}

TEST(DeviceMeshDist, BadShapesAndNames) {
  const int64_t ws = hp::get_world_size();
  EXPECT_THROW(hp::init_device_mesh("cpu", {ws + 1}), c10::ValueError);
  EXPECT_THROW(hp::init_device_mesh("cpu", {ws, 1}, {"tp", "tp"}), c10::ValueError);
  EXPECT_THROW(hp::init_device_mesh("cpu", {ws}, {"a", "b"}), c10::ValueError);
  auto mesh = hp::init_device_mesh("cpu", {ws}, {"tp"});
  try {
    mesh["dp"];
    FAIL() << "unknown dim name accepted";
  } catch (const c10::IndexError& e) {
    EXPECT_NE(std::string(e.what()).find("'dp'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("('tp',)"), std::string::npos);
  }
}

TEST(DeviceMeshDist, CurrentMeshScopeNests) {
  EXPECT_FALSE(hp::current_mesh().has_value());
  auto mesh = hp::init_device_mesh("cpu", {hp::get_world_size()}, {"tp"});
  {
    hp::MeshScope scope(mesh);
    ASSERT_TRUE(hp::current_mesh().has_value());
    EXPECT_EQ(*hp::current_mesh(), mesh);
  }
  EXPECT_FALSE(hp::current_mesh().has_value());
}

// A device type the process group was not made for is refused (a CPU build has no "cuda" mesh).
TEST(DeviceMeshDist, DeviceTypeMustMatchTheProcessGroup) {
  EXPECT_THROW(hp::init_device_mesh("cuda", {hp::get_world_size()}, {"tp"}), c10::ValueError);
  EXPECT_NO_THROW(hp::init_device_mesh("cpu", {hp::get_world_size()}, {"tp"}));
}
