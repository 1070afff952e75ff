// OpInfo: what a sharding rule sees of one call.
#include <hyper_parallel/dtensor/sharding_rule.h>

#include <sstream>

#include <hyper_parallel/runtime/errors.h>

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
    TORCH_CHECK(coord.has_value(), "hyper_parallel::dispatch: this rank is not part of ", mesh_->to_string());
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
      inputs_(inputs.begin(), inputs.end()),
      mesh_(nullptr),
      geometry_known_(true),
      mesh_shape_(std::move(mesh_shape)),
      coordinate_(std::move(coordinate)) {
  TORCH_CHECK(mesh_shape_.size() == coordinate_.size(), "hyper_parallel::OpInfo: a coordinate of ", coordinate_.size(),
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

const DTensorSpec& OpInfo::input_spec(size_t arg, int64_t elem) const {
  const DTensorSpec* s = spec(arg, elem);
  if (s != nullptr) return *s;
  const auto& args = schema().arguments();
  HP_CHECK_T(c10::ValueError, false, "hyper_parallel::dispatch: ", describe(), ": the sharding rule needs argument ",
             (arg < args.size() ? "'" + args[arg].name() + "'" : std::to_string(arg)),
             (elem >= 0 ? "[" + std::to_string(elem) + "]" : std::string()),
             " to be a DTensor, but it is a plain tensor (or none); make it a DTensor with distribute_tensor or "
             "DTensor::from_local");
  TORCH_INTERNAL_ASSERT(false);
}

int64_t OpInfo::input_index(size_t arg, int64_t elem) const {
  for (size_t k = 0; k < inputs_.size(); ++k)
    if (inputs_[k].arg == arg && inputs_[k].elem == elem) return static_cast<int64_t>(k);
  return -1;
}

std::string OpInfo::input_name(size_t k) const {
  const auto& in = inputs_.at(k);
  std::string s = schema().arguments()[in.arg].name();
  if (in.elem >= 0) s += "[" + std::to_string(in.elem) + "]";
  return s;
}

std::string OpInfo::describe() const {
  std::string s = name() + "(";
  for (size_t k = 0; k < inputs_.size(); ++k) s += (k ? ", " : "") + input_name(k) + ": " + inputs_[k].spec->short_string();
  s += ")";
  if (mesh_ != nullptr) s += " on " + mesh_->short_string();
  return s;
}

}  // namespace hyper_parallel
