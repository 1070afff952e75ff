// to_empty / init_parameters: a meta-built model's local shards allocated in place, then
// initialised by each module's reset_parameters.
#include <hyper_parallel/nn/init_parameters.h>

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/nn/module.h>
#include <hyper_parallel/runtime/errors.h>

#include <ATen/ATen.h>

#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace hyper_parallel {
namespace {

constexpr size_t kMaxNamed = 6;  // names listed in one message before "and N more"

// Every distinct parameter and buffer (tied slots once), under the first name that holds it.
struct Slot {
  std::string fqn;
  at::Tensor tensor;
};

std::vector<Slot> distinct_tensors(torch::nn::Module& module) {
  std::vector<Slot> out;
  std::set<const c10::TensorImpl*> seen;
  auto add = [&](const std::string& fqn, const at::Tensor& t) {
    if (t.defined() && seen.insert(t.unsafeGetTensorImpl()).second) out.push_back({fqn, t});
  };
  for (const auto& item : module.named_parameters(/*recurse=*/true)) add(item.key(), item.value());
  for (const auto& item : module.named_buffers(/*recurse=*/true)) add(item.key(), item.value());
  return out;
}

std::string listed(const std::vector<std::string>& names) { return join_listed(names, kMaxNamed); }

void check_materialisable(const char* fn, torch::nn::Module& module, const std::vector<Slot>& slots, const c10::Device& device) {
  HP_CHECK_T(c10::ValueError, device.type() != c10::kMeta, "hyper_parallel::", fn, ": the target device is meta; name a real device");
  std::vector<std::string> not_meta, wrong_mesh;
  std::string mesh_type;
  for (const Slot& s : slots) {
    if (!s.tensor.is_meta()) not_meta.push_back("'" + s.fqn + "' (" + s.tensor.device().str() + ")");
    if (is_dtensor(s.tensor)) {
      const std::string& type = DTensor(s.tensor).device_mesh().device_type();
      if (c10::Device(type).type() != device.type()) {
        wrong_mesh.push_back("'" + s.fqn + "'");
        mesh_type = type;
      }
    }
  }
  HP_CHECK_T(c10::ValueError, !slots.empty(), "hyper_parallel::", fn, ": ", module.name(), " has no parameters or buffers");
  HP_CHECK_T(c10::ValueError, not_meta.size() < slots.size(), "hyper_parallel::", fn, ": no parameter or buffer of ", module.name(),
             " is on the meta device: it was materialised already, or built on a device");
  HP_CHECK_T(c10::ValueError, not_meta.empty(), "hyper_parallel::", fn, ": ", module.name(),
             " mixes meta tensors with materialised ones: ", listed(not_meta), not_meta.size() == 1 ? " is" : " are",
             " not on meta; build the whole model under hyper_parallel::nn::ParameterScope(meta)");
  HP_CHECK_T(c10::ValueError, wrong_mesh.empty(), "hyper_parallel::", fn, ": ", listed(wrong_mesh), " ",
             wrong_mesh.size() == 1 ? "is a DTensor" : "are DTensors", " on a '", mesh_type, "' mesh, which does not use device ",
             device.str());
}

// Fills `t`'s TensorImpl in place with fresh memory for its local piece on `device`: everything
// that holds `t` (module slots, tied aliases, FSDP groups, optimizers) sees the new tensor.
void materialise(const at::Tensor& t, const c10::Device& device) {
  at::Tensor fresh;
  if (is_dtensor(t)) {
    const DTensor d(t);
    const at::Tensor local = d.to_local();
    const DTensorSpec& spec = d.spec();
    fresh = DTensor::from_local(at::empty(local.sizes(), local.options().device(device)), d.device_mesh(), d.placements(),
                                /*run_check=*/false, c10::IntArrayRef(spec.shape), c10::IntArrayRef(spec.stride));
  } else {
    fresh = at::empty(t.sizes(), t.options().device(device));
  }
  // set_data's job without its check, which refuses a meta tensor becoming a dense one: the
  // metadata (storage, device, dtype, dispatch keys) is copied; autograd state (requires_grad)
  // and the version counter stay.
  t.unsafeGetTensorImpl()->shallow_copy_from(fresh.getIntrusivePtr());
}

std::vector<std::pair<std::string, nn::Module*>> initialisers(torch::nn::Module& module) {
  std::vector<std::pair<std::string, nn::Module*>> out;
  for (const auto& [fqn, m] : nn::modules_with_names(module)) {
    const bool owns = !m->named_parameters(/*recurse=*/false).is_empty() || !m->named_buffers(/*recurse=*/false).is_empty();
    if (!owns) continue;
    auto* hm = dynamic_cast<nn::Module*>(m);
    HP_CHECK_T(c10::TypeError, hm != nullptr, "hyper_parallel::init_parameters: module '", fqn, "' (", m->name(),
               ") holds parameters but is not a hyper_parallel::nn::Module, so it has no reset_parameters to initialise them");
    out.emplace_back(fqn, hm);
  }
  return out;
}

// Meta stand-ins in some of a module's parameter slots, the real tensors put back when it ends
// (also when reset_parameters throws).
class StandIns {
 public:
  explicit StandIns(nn::Module& m) : m_(m) {}
  ~StandIns() {
    for (const auto& [name, t] : lent_) m_.replace_parameter(name, t);
  }
  StandIns(const StandIns&) = delete;
  StandIns& operator=(const StandIns&) = delete;
  void lend(const std::string& name, const at::Tensor& t) {
    lent_.emplace_back(name, t);
    m_.replace_parameter(name, at::empty(t.sizes(), t.options().device(c10::kMeta)));
  }

 private:
  nn::Module& m_;
  std::vector<std::pair<std::string, at::Tensor>> lent_;
};

void to_empty_checked(const std::vector<Slot>& slots, const c10::Device& device) {
  at::NoGradGuard no_grad;
  for (const Slot& s : slots) materialise(s.tensor, device);
}

}  // namespace

void to_empty(torch::nn::Module& module, const c10::Device& device) {
  const std::vector<Slot> slots = distinct_tensors(module);
  check_materialisable("to_empty", module, slots, device);
  to_empty_checked(slots, device);
}

void init_parameters(torch::nn::Module& module, const c10::Device& device) {
  const std::vector<Slot> slots = distinct_tensors(module);
  check_materialisable("init_parameters", module, slots, device);
  const auto mods = initialisers(module);
  // On meta, reset_parameters draws and writes nothing: a module that cannot initialise its
  // parameters fails here, before anything is allocated.
  for (const auto& [fqn, m] : mods) m->reset_parameters();
  to_empty_checked(slots, device);
  // Which module initialises each tensor: the first that holds it, as in construction (a tied
  // lm_head that shares embed_tokens' weight does not draw into it again).
  std::unordered_map<const c10::TensorImpl*, const nn::Module*> owner;
  for (const auto& [fqn, m] : mods) {
    for (const auto& item : m->named_parameters(/*recurse=*/false)) owner.emplace(item.value().unsafeGetTensorImpl(), m);
    for (const auto& item : m->named_buffers(/*recurse=*/false)) owner.emplace(item.value().unsafeGetTensorImpl(), m);
  }
  for (const auto& [fqn, m] : mods) {
    // A slot another module owns gets a meta stand-in while this module draws (a meta draw
    // takes no call number, as when construction drew into a weight that tying then replaced).
    StandIns stand_ins(*m);
    for (const auto& item : m->named_parameters(/*recurse=*/false))
      if (owner.at(item.value().unsafeGetTensorImpl()) != m) stand_ins.lend(item.key(), item.value());
    m->reset_parameters();
  }
}

}  // namespace hyper_parallel
