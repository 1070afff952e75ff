// The canonical mesh of every parallel dimension (mesh/parallel_dims.h).
#include <hyper_parallel/mesh/parallel_dims.h>

#include <hyper_parallel/runtime/errors.h>
#include <hyper_parallel/runtime/process_group.h>

namespace hyper_parallel {

const std::vector<std::string>& ParallelDims::names() {
  static const std::vector<std::string> n{"pp", "dp_replicate", "dp_shard", "cp", "tp"};
  return n;
}

std::vector<int64_t> ParallelDims::shape() const { return {pp, dp_replicate, dp_shard, cp, tp}; }

int64_t ParallelDims::world_size() const { return pp * dp_replicate * dp_shard * cp * tp; }

std::string ParallelDims::to_string() const {
  std::string s;
  const auto sh = shape();
  for (size_t k = 0; k < sh.size(); ++k) s += (k ? " " : "") + names()[k] + "=" + std::to_string(sh[k]);
  return s;
}

ParallelDims ParallelDims::with_tp_rest(int64_t world, ParallelDims dims) {
  const auto sh = dims.shape();
  for (size_t k = 0; k + 1 < sh.size(); ++k)
    HP_CHECK_T(c10::ValueError, sh[k] > 0, "hyper_parallel::ParallelDims::with_tp_rest: the degree of ", names()[k],
               " must be positive, got ", sh[k]);
  const int64_t others = dims.pp * dims.dp_replicate * dims.dp_shard * dims.cp;
  HP_CHECK_T(c10::ValueError, world % others == 0, "hyper_parallel::ParallelDims::with_tp_rest: pp=", dims.pp, " x dp_replicate=",
             dims.dp_replicate, " x dp_shard=", dims.dp_shard, " x cp=", dims.cp, " = ", others, " ranks do not divide the world of ", world,
             ", so tensor parallelism cannot take the rest");
  dims.tp = world / others;
  return dims;
}

DeviceMesh ParallelDims::build_mesh(const std::string& device_type) const {
  HP_CHECK_T(c10::ValueError, world_size() == get_world_size(), "hyper_parallel::ParallelDims::build_mesh: ", to_string(), " holds ",
             world_size(), " ranks, but the job has ", get_world_size());
  return init_device_mesh(device_type, shape(), names());
}

DeviceMesh ParallelDims::dp_mesh(const DeviceMesh& mesh) const {
  return dp_replicate > 1 ? mesh[{"dp_replicate", "dp_shard"}] : mesh["dp_shard"];
}

}  // namespace hyper_parallel
