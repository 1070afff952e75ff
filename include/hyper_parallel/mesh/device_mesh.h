#pragma once
// DeviceMesh: the ranks of the job arranged as an N-D array with named dimensions, one process
// group per dimension (PyTorch's torch.distributed.device_mesh).
#include <c10/util/Optional.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include <hyper_parallel/runtime/process_group.h>

namespace hyper_parallel {

/// A cheap handle; copies share the mesh. Build one with init_device_mesh().
class DeviceMesh {
 public:
  struct Impl;
  DeviceMesh() = default;
  explicit DeviceMesh(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  /// A mesh of the given ranks (PyTorch's DeviceMesh(device_type, mesh)): `mesh_shape` and its
  /// row-major `ranks`, distinct ranks of the world. Collective over the whole world; a rank not in
  /// `ranks` holds the mesh without a coordinate (get_coordinate() is nullopt).
  /// e.g. `hp::DeviceMesh("cpu", {2}, {0, 2})` on a world of 4.
  DeviceMesh(const std::string& device_type, const std::vector<int64_t>& mesh_shape, const std::vector<int64_t>& ranks,
             const std::vector<std::string>& mesh_dim_names = {});

  bool defined() const { return impl_ != nullptr; }
  /// "cpu", "cuda": tensors of DTensors on this mesh live on this device type.
  const std::string& device_type() const;
  int64_t ndim() const;
  /// Number of ranks along `dim` (negative counts from the end).
  int64_t size(int64_t dim) const;
  /// Number of ranks in the whole mesh.
  int64_t size() const;
  std::vector<int64_t> shape() const;
  const std::vector<std::string>& mesh_dim_names() const;
  /// Global ranks of the mesh in row-major order.
  const std::vector<int64_t>& ranks() const;
  /// This rank's index along each mesh dimension; nullopt when this rank is not in the mesh.
  c10::optional<std::vector<int64_t>> get_coordinate() const;
  /// This rank's index along `dim` (its rank in get_group(dim)).
  int64_t get_local_rank(int64_t dim = 0) const;
  /// The process group of this rank's peers along `dim`.
  const Group& get_group(int64_t dim = 0) const;
  const Group& get_group(const std::string& dim_name) const;
  /// Index of the named dimension; c10::IndexError (naming the known dims) when unknown
  /// (libtorch 1.13 has no KeyError).
  int64_t dim_index(const std::string& dim_name) const;
  /// The 1-D sub-mesh of this rank's peers along the named dimension; shares its group.
  /// e.g. on a ("dp","tp") = 2x2 mesh rank 3 gets `mesh["tp"]` == ranks [2, 3].
  DeviceMesh operator[](const std::string& dim_name) const;
  /// The sub-mesh of this rank's peers along several named dimensions, in this mesh's order
  /// (PyTorch's mesh["dp_replicate", "dp_shard"]); shares their groups. c10::ValueError when the
  /// names repeat or are out of order. e.g. `auto dp = mesh[{"dp_replicate", "dp_shard"}];`
  DeviceMesh operator[](const std::vector<std::string>& dim_names) const;
  DeviceMesh operator[](std::initializer_list<std::string> dim_names) const {
    return (*this)[std::vector<std::string>(dim_names)];
  }
  /// The same ranks with dimension `dim` split into `sizes` (row-major), named `names`, and a
  /// process group per new dimension (PyTorch's DeviceMesh._unflatten). Collective over this
  /// mesh's ranks. The result is a root mesh of its own; unflattening a 1-D slice of an N-D root
  /// (mesh["tp"]) gives a slice of that root with the dimension split (see refines), so that
  /// fully_shard on mesh["dp"] composes with it. Only a 1-D mesh can be unflattened now
  /// (c10::NotImplementedError otherwise); c10::ValueError when the sizes' product differs from
  /// the dimension's size. e.g. tp = 8 ranks viewed as (kv=4, kv_replica=2):
  /// `auto kv = tp.unflatten(0, {4, 2}, {"kv", "kv_replica"});`
  DeviceMesh unflatten(int64_t dim, const std::vector<int64_t>& sizes, const std::vector<std::string>& names) const;
  /// The mesh this one was sliced from with operator[] (itself for a mesh from init_device_mesh).
  DeviceMesh root_mesh() const;
  /// For a 1-D slice: its dimension in root_mesh(); nullopt for a root or an N-D slice.
  c10::optional<int64_t> dim_in_root() const;
  /// The dimensions of root_mesh() this mesh spans, in order (0..ndim-1 for a root).
  std::vector<int64_t> dims_in_root() const;
  /// For a root made by unflattening a slice of the root `other`: where each dimension of `other`
  /// lies in this one (a split dimension: at its first part); nullopt otherwise.
  c10::optional<std::vector<int64_t>> refines(const DeviceMesh& other) const;
  /// The seed every rank of the mesh shares (rank 0's CPU generator seed at mesh creation). Random
  /// ops on DTensors do not use it: they draw from hyper_parallel::manual_seed's counter-based
  /// generator (dtensor/random.h), the same values whatever the mesh.
  uint64_t shared_seed() const;
  /// e.g. "DeviceMesh('cpu', [[0, 1], [2, 3]], mesh_dim_names=('dp', 'tp'))".
  std::string to_string() const;
  /// The compact form of traces and errors: "mesh(dp=2, tp=4)" (sizes alone when unnamed).
  std::string short_string() const;

  /// Same ranks in the same layout with the same names and device type.
  bool operator==(const DeviceMesh& other) const;
  bool operator!=(const DeviceMesh& other) const { return !(*this == other); }
  const Impl* impl() const { return impl_.get(); }

 private:
  std::shared_ptr<const Impl> impl_;
};

/// Builds a mesh of all `WORLD_SIZE` ranks (row-major) and the process groups of this rank's
/// peers along every dimension. Collective: every rank calls it with the same arguments.
/// Throws c10::ValueError when the shape's product differs from the world size, or when names
/// are duplicated or their number differs from the number of dimensions.
/// e.g. `auto mesh = hp::init_device_mesh("cpu", {2, 2}, {"dp", "tp"}); auto tp = mesh["tp"];`
DeviceMesh init_device_mesh(const std::string& device_type, const std::vector<int64_t>& mesh_shape,
                            const std::vector<std::string>& mesh_dim_names = {});

/// RAII: makes `mesh` the current mesh of this thread (Python's `with mesh:`), so that
/// parallelize_module(module, c10::nullopt, plan) finds it. Scopes nest.
class MeshScope {
 public:
  explicit MeshScope(DeviceMesh mesh);
  ~MeshScope();
  MeshScope(const MeshScope&) = delete;
  MeshScope& operator=(const MeshScope&) = delete;
};

/// The innermost MeshScope's mesh on this thread, if any.
c10::optional<DeviceMesh> current_mesh();

}  // namespace hyper_parallel
