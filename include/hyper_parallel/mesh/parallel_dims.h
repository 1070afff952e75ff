#pragma once
// The one mesh every parallel dimension lives on, in one canonical order (torchtitan's):
// [pp, dp_replicate, dp_shard, cp, tp], outermost first. Pipeline stages are furthest apart,
// tensor parallelism (the most communication) closest together, e.g. within a node. Expert
// parallelism borrows ranks from dp_shard x cp. Programs take the degrees as flags by one rule:
// --pp, --dp-replicate, --dp (dp_shard: fully_shard's degree), --cp, and tp takes the rest of
// the world.
//
//   auto dims = hp::ParallelDims::with_tp_rest(hp::get_world_size(), {.dp_shard = 2});
//   auto mesh = dims.build_mesh("cpu");
//   parallelize_qwen3_tp(*model, mesh["tp"]);
//   hp::fully_shard(*model, dims.dp_mesh(mesh));
#include <cstdint>
#include <string>
#include <vector>

#include <hyper_parallel/mesh/device_mesh.h>

namespace hyper_parallel {

struct ParallelDims {
  int64_t pp = 1;            ///< pipeline stages
  int64_t dp_replicate = 1;  ///< HSDP replicas (gradients all-reduced over them)
  int64_t dp_shard = 1;      ///< fully_shard's degree (parameters sharded over it)
  int64_t cp = 1;            ///< context parallelism (the sequence split)
  int64_t tp = 1;            ///< tensor parallelism

  /// The dimension names, in mesh order: pp, dp_replicate, dp_shard, cp, tp.
  static const std::vector<std::string>& names();
  /// `dims` with tp = world / (pp · dp_replicate · dp_shard · cp); c10::ValueError naming the
  /// degrees when a degree is not positive or their product does not divide the world.
  static ParallelDims with_tp_rest(int64_t world, ParallelDims dims);
  /// The product of every degree.
  int64_t world_size() const;
  /// The degrees in mesh order.
  std::vector<int64_t> shape() const;
  /// Whether data parallelism shards (dp_shard > 1) or replicates (dp_replicate > 1).
  bool dp_enabled() const { return dp_shard * dp_replicate > 1; }
  /// The job's mesh with every dimension, size 1 included (so mesh["tp"] always exists).
  /// Collective; c10::ValueError when world_size() is not the job's.
  DeviceMesh build_mesh(const std::string& device_type) const;
  /// The data-parallel mesh of `mesh` (build_mesh's) that fully_shard takes: mesh["dp_shard"],
  /// or mesh[{"dp_replicate", "dp_shard"}] for HSDP (dp_replicate > 1).
  DeviceMesh dp_mesh(const DeviceMesh& mesh) const;
  /// "pp=1 dp_replicate=1 dp_shard=2 cp=1 tp=2".
  std::string to_string() const;
};

}  // namespace hyper_parallel
