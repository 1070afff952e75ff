#include <hyper_parallel/dtensor/dtensor_spec.h>
#include <hyper_parallel/runtime/chunking.h>

#include <c10/util/ArrayRef.h>

#include <sstream>

namespace hyper_parallel {

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> st(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i)
    st[static_cast<size_t>(i)] = st[static_cast<size_t>(i + 1)] * std::max<int64_t>(shape[static_cast<size_t>(i + 1)], 1);
  return st;
}

DTensorSpec::DTensorSpec(DeviceMesh mesh_, const Placements& placements_, std::vector<int64_t> shape_,
                         c10::ScalarType dtype_, std::vector<int64_t> stride_, int64_t storage_offset_)
    : mesh(std::move(mesh_)),
      placements(normalize_placements(placements_, static_cast<int64_t>(shape_.size()))),
      shape(std::move(shape_)),
      stride(stride_.empty() ? contiguous_strides(shape) : std::move(stride_)),
      dtype(dtype_),
      storage_offset(storage_offset_) {}

std::pair<std::vector<int64_t>, std::vector<int64_t>> compute_local_shape_and_offset(
    const std::vector<int64_t>& global_shape, const std::vector<int64_t>& mesh_shape,
    const std::vector<int64_t>& coordinate, const Placements& placements) {
  std::vector<int64_t> shape = global_shape;
  std::vector<int64_t> offset(global_shape.size(), 0);
  for (size_t i = 0; i < placements.size(); ++i) {
    if (!placements[i].is_shard()) continue;
    const auto d = static_cast<size_t>(placements[i].dim());
    const int64_t n = shape[d];
    offset[d] += chunk_offset(n, mesh_shape[i], coordinate[i]);
    shape[d] = chunk_size(n, mesh_shape[i], coordinate[i]);
  }
  return {shape, offset};
}

int64_t DTensorSpec::numel() const {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> DTensorSpec::local_shape_and_offset(
    const std::vector<int64_t>& coordinate) const {
  return compute_local_shape_and_offset(shape, mesh.shape(), coordinate, placements);
}

std::vector<int64_t> DTensorSpec::local_shape() const {
  auto coord = mesh.get_coordinate();
  if (!coord) return std::vector<int64_t>(shape.size(), 0);  // not in the mesh: holds nothing
  return local_shape_and_offset(*coord).first;
}

bool DTensorSpec::is_replicated() const {
  for (const auto& p : placements)
    if (!p.is_replicate()) return false;
  return true;
}

bool DTensorSpec::has_partial() const {
  for (const auto& p : placements)
    if (p.is_partial()) return true;
  return false;
}

std::vector<int64_t> DTensorSpec::mesh_dims_sharding(int64_t dim) const {
  std::vector<int64_t> out;
  for (size_t i = 0; i < placements.size(); ++i)
    if (placements[i].is_shard(dim)) out.push_back(static_cast<int64_t>(i));
  return out;
}

std::string DTensorSpec::to_string() const {
  std::ostringstream os;
  os << "DTensorSpec(placements=" << hyper_parallel::to_string(placements) << ", shape="
     << c10::IntArrayRef(shape) << ", dtype=" << dtype << ")";
  return os.str();
}

std::string short_dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return "f32";
    case at::kDouble: return "f64";
    case at::kHalf: return "f16";
    case at::kBFloat16: return "bf16";
    case at::kLong: return "i64";
    case at::kInt: return "i32";
    case at::kShort: return "i16";
    case at::kChar: return "i8";
    case at::kByte: return "u8";
    case at::kBool: return "b8";
    case at::kComplexFloat: return "c64";
    case at::kComplexDouble: return "c128";
    case at::ScalarType::Undefined: return "?";
    default: return c10::toString(dtype);
  }
}

std::string DTensorSpec::short_string() const {
  std::string s = short_dtype_name(dtype) + "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "] " + hyper_parallel::short_string(placements);
}

}  // namespace hyper_parallel
