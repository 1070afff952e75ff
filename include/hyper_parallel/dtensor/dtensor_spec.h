#pragma once
// DTensorSpec: everything that describes a DTensor except its local data.
#include <c10/core/ScalarType.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <hyper_parallel/dtensor/placement.h>
#include <hyper_parallel/mesh/device_mesh.h>

namespace hyper_parallel {

namespace detail {
/// A value a spec caches about its own contents (internal): a copy starts without it (zero), so a
/// spec copied and then changed never carries its original's.
template <class T>
class ResetOnCopy {
 public:
  ResetOnCopy() noexcept = default;
  ResetOnCopy(const ResetOnCopy&) noexcept {}
  ResetOnCopy& operator=(const ResetOnCopy&) noexcept {
    value.store(0, std::memory_order_relaxed);
    return *this;
  }
  mutable std::atomic<T> value{0};
};

/// The dispatcher's short name for a spec's contents, given on first use: a cached decision is
/// looked up by the names of its inputs' specs instead of by their contents.
using SpecKeyId = ResetOnCopy<int64_t>;

/// What a TensorImpl derives from a spec's sizes and strides (its element count and contiguity
/// flags), found by the first DTensor made with the spec and read by the next ones.
struct SpecGeometry {
  ResetOnCopy<int64_t> numel;
  ResetOnCopy<uint32_t> flags;  // 0: not known yet
};
}  // namespace detail

/// Mesh, one (normalised) placement per mesh dimension, and the global shape/stride and dtype.
struct DTensorSpec {
  /// Every field given: `placements` are normalised for `shape` (Shard(-1) -> Shard(ndim - 1)),
  /// an empty `stride` means contiguous.
  /// e.g. `DTensorSpec(mesh, {Shard(0)}, {8, 4}, at::kFloat)`.
  DTensorSpec(DeviceMesh mesh, const Placements& placements, std::vector<int64_t> shape, c10::ScalarType dtype,
              std::vector<int64_t> stride = {}, int64_t storage_offset = 0);

  DeviceMesh mesh;
  Placements placements;
  std::vector<int64_t> shape;   ///< global sizes
  std::vector<int64_t> stride;  ///< global strides (contiguous unless a view made them otherwise)
  c10::ScalarType dtype;
  /// Offset of a view into its base's (global) storage, as a plain tensor's would be: autograd
  /// replays an in-place op on a view with as_strided(sizes, strides, offset), so it must be real.
  int64_t storage_offset = 0;
  /// Given when the spec first reaches the dispatcher. A spec that a DTensor holds never changes
  /// (DTensors hold `std::shared_ptr<const DTensorSpec>`); change a copy instead.
  detail::SpecKeyId key_id;
  detail::SpecGeometry geometry;

  int64_t ndim() const { return static_cast<int64_t>(shape.size()); }
  int64_t numel() const;
  /// Sizes and global offsets of the piece held by the rank at `coordinate` (torch.chunk
  /// semantics; mesh dimensions shard in order, so a later mesh dim splits an earlier one's piece).
  std::pair<std::vector<int64_t>, std::vector<int64_t>> local_shape_and_offset(
      const std::vector<int64_t>& coordinate) const;
  /// Sizes of this rank's piece.
  std::vector<int64_t> local_shape() const;
  bool is_replicated() const;
  bool has_partial() const;
  /// Mesh dimensions that shard tensor dimension `dim`.
  std::vector<int64_t> mesh_dims_sharding(int64_t dim) const;
  /// e.g. "DTensorSpec(placements=(Shard(dim=0),), shape=[4, 8], dtype=Float)".
  std::string to_string() const;
  /// The compact form every DTensor error and trace uses: dtype, global shape, placements,
  /// e.g. "f32[8,16] S(0)", "bf16[2,4,64] S(1)R".
  std::string short_string() const;
};

/// "f32", "bf16", "i64", ... (the compact dtype names of short_string).
std::string short_dtype_name(at::ScalarType dtype);

/// Contiguous strides of `shape`.
std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape);

/// Local sizes of `global_shape` laid out by `placements` on `mesh` at `coordinate`.
std::pair<std::vector<int64_t>, std::vector<int64_t>> compute_local_shape_and_offset(
    const std::vector<int64_t>& global_shape, const std::vector<int64_t>& mesh_shape,
    const std::vector<int64_t>& coordinate, const Placements& placements);

}  // namespace hyper_parallel
