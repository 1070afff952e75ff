// OpInfo: what a sharding rule sees of one call.
#include <hyper_parallel/dtensor/sharding_rule.h>

#include <sstream>

namespace hyper_parallel {

OpInfo::OpInfo(const c10::OperatorHandle& op, const c10::IValue* args, size_t nargs, const DeviceMesh& mesh)
    : op_(op), args_(args), nargs_(nargs), mesh_(&mesh), geometry_known_(false) {}

const std::vector<int64_t>& OpInfo::mesh_shape() const {
  if (!geometry_known_) coordinate();
  return mesh_shape_;
}

const std::vector<int64_t>& OpInfo::coordinate() const {
  if (!geometry_known_) {
    const auto coord = mesh_->get_coordinate();
    TORCH_CHECK(coord.has_value(), "hyper_parallel: this rank is not part of ", mesh_->to_string());
    mesh_shape_ = mesh_->shape();
    coordinate_ = *coord;
    geometry_known_ = true;
  }
  return coordinate_;
}

OpInfo::OpInfo(const c10::OperatorHandle& op, const c10::IValue* args, size_t nargs, std::vector<TensorInput> inputs,
               std::vector<int64_t> mesh_shape, std::vector<int64_t> coordinate)
    : op_(op),
      args_(args),
      nargs_(nargs),
      inputs_(std::move(inputs)),
      mesh_(nullptr),
      geometry_known_(true),
      mesh_shape_(std::move(mesh_shape)),
      coordinate_(std::move(coordinate)) {
  TORCH_CHECK(mesh_shape_.size() == coordinate_.size(), "OpInfo: a coordinate of ", coordinate_.size(),
              " entries on a mesh of ", mesh_shape_.size(), " dimensions");
}

int64_t OpInfo::written_arg() const {
  if (written_arg_ == -2) {
    written_arg_ = -1;
    const auto& a = op_.schema().arguments();
    for (size_t i = 0; i < a.size(); ++i) {
      const auto* alias = a[i].alias_info();
      if (alias != nullptr && alias->isWrite()) {
        written_arg_ = static_cast<int64_t>(i);
        break;
      }
    }
  }
  return written_arg_;
}

std::string OpInfo::name() const {
  const auto& n = op_.operator_name();
  return n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
}

const DTensorSpec* OpInfo::spec(size_t arg, int64_t elem) const {
  for (const auto& in : inputs_)
    if (in.arg == arg && in.elem == elem) return in.spec;
  return nullptr;
}

int64_t OpInfo::input_index(size_t arg, int64_t elem) const {
  for (size_t k = 0; k < inputs_.size(); ++k)
    if (inputs_[k].arg == arg && inputs_[k].elem == elem) return static_cast<int64_t>(k);
  return -1;
}

std::string OpInfo::describe() const {
  std::ostringstream os;
  os << name() << " with inputs (";
  for (size_t k = 0; k < inputs_.size(); ++k) {
    const auto& in = inputs_[k];
    os << (k ? ", " : "") << schema().arguments()[in.arg].name();
    if (in.elem >= 0) os << "[" << in.elem << "]";
    os << ": " << to_string(in.spec->placements) << " " << c10::IntArrayRef(in.spec->shape) << " " << in.spec->dtype;
  }
  os << ")";
  return os.str();
}

}  // namespace hyper_parallel
