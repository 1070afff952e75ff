#include <hyper_parallel/dtensor/random.h>
#include <hyper_parallel/nn/module.h>
#include <hyper_parallel/runtime/agreement.h>
#include <hyper_parallel/runtime/errors.h>
#include <hyper_parallel/tensor_parallel/api.h>
#include <hyper_parallel/tensor_parallel/distribute_module.h>

#include "module_state.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <exception>
#include <map>
#include <set>
#include <sstream>

#include <fnmatch.h>

namespace hyper_parallel {

namespace {

std::vector<std::string> split_path(const std::string& path) {
  // The seed's case A4: an empty path is an error (PyTorch takes "" as the module itself).
  HP_CHECK_T(c10::ValueError, !path.empty(), "hyper_parallel::parallelize_module: a plan path is empty; name a submodule such as "
             "\"layers.*.attn.q_proj\", or pass the style itself to apply it to the whole module");
  std::vector<std::string> atoms;
  std::string cur;
  for (char c : path) {
    if (c == '.') { atoms.push_back(cur); cur.clear(); }
    else cur += c;
  }
  atoms.push_back(cur);
  for (const auto& a : atoms)
    HP_CHECK_T(c10::ValueError, !a.empty(), "hyper_parallel::parallelize_module: plan path '", path,
               "' has an empty name between dots");
  return atoms;
}

struct Target {
  std::string fqn;
  std::shared_ptr<torch::nn::Module> module;
  std::shared_ptr<ParallelStyle> style;
};

void match(const std::shared_ptr<torch::nn::Module>& m, const std::string& prefix, const std::vector<std::string>& atoms,
           size_t i, const std::shared_ptr<ParallelStyle>& style, std::vector<Target>& out) {
  if (i == atoms.size()) {
    out.push_back({prefix, m, style});
    return;
  }
  for (const auto& child : m->named_children())
    if (::fnmatch(atoms[i].c_str(), child.key().c_str(), 0) == 0)  // glibc: *, ?, [seq], [!seq]
      match(child.value(), prefix.empty() ? child.key() : prefix + "." + child.key(), atoms, i + 1, style, out);
}

void record_name(torch::nn::Module& m, const std::string& fqn) {
  if (auto* hp = dynamic_cast<nn::Module*>(&m)) hp->state<TpModuleState>().fqn = fqn.empty() ? "<root>" : fqn;
}

// A parameter held by several slots (module, name) of the tree: one tensor, tied (an output
// projection sharing the embedding's weight).
struct TieSlot {
  std::string fqn;  // the parameter's name in the model, e.g. "lm_head.weight"
  torch::nn::Module* module;
  std::string name;
};
// One tensor held by several slots, as it was before the plan applied.
struct Tie {
  at::Tensor tensor;
  std::vector<TieSlot> slots;
};
using Ties = std::vector<Tie>;

Ties find_ties(torch::nn::Module& root) {
  std::map<const c10::TensorImpl*, Tie> by_tensor;
  std::vector<const c10::TensorImpl*> order;
  for (const auto& [fqn, m] : nn::modules_with_names(root))
    for (const auto& p : m->named_parameters(/*recurse=*/false)) {
      if (!p.value().defined()) continue;
      Tie& tie = by_tensor[p.value().unsafeGetTensorImpl()];
      if (tie.slots.empty()) {
        order.push_back(p.value().unsafeGetTensorImpl());
        tie.tensor = p.value();
      }
      auto& slots = tie.slots;
      const bool known = std::any_of(slots.begin(), slots.end(), [&](const TieSlot& s) { return s.module == m && s.name == p.key(); });
      if (!known) slots.push_back({fqn.empty() ? p.key() : fqn + "." + p.key(), m, p.key()});  // a module reached twice is one slot
    }
  Ties ties;
  for (const auto* impl : order)
    if (by_tensor[impl].slots.size() > 1) ties.push_back(std::move(by_tensor[impl]));
  return ties;
}

at::Tensor slot_value(const TieSlot& s) {
  const auto parameters = s.module->named_parameters(/*recurse=*/false);  // a copy: keep it while reading
  const at::Tensor* t = parameters.find(s.name);
  return t != nullptr ? *t : at::Tensor();
}

std::string layout_of(const at::Tensor& t) {
  if (!t.defined()) return "no parameter (removed)";
  if (!is_dtensor(t)) return "a plain tensor (no style in the plan lays it out)";
  const DTensor d(t);
  return to_string(d.placements()) + " on mesh " + d.device_mesh().short_string();
}

// A tie stays one parameter: when every owner's style gave it the same layout, every slot takes
// the first owner's DTensor (the values are the same: one tensor, split the same way). An owner no
// style touched keeps the full tensor and leaves the tie, with a warning that says how to tie it
// again (PyTorch's behaviour: its examples distribute an embedding and its tied output projection in
// separate calls, then assign one to the other). Owners laid out differently are refused, naming
// every owner, before the caller lets the change stand.
void keep_ties(const Ties& ties) {
  for (const Tie& tie : ties) {
    const auto& slots = tie.slots;
    std::vector<at::Tensor> now;
    std::vector<size_t> changed;  // the owners a style changed: those must agree with each other
    std::vector<std::string> left;  // the owners no style touched
    for (size_t i = 0; i < slots.size(); ++i) {
      now.push_back(slot_value(slots[i]));
      const bool untouched = now[i].defined() && now[i].unsafeGetTensorImpl() == tie.tensor.unsafeGetTensorImpl();
      if (untouched) left.push_back(slots[i].fqn);
      else changed.push_back(i);
    }
    if (changed.empty()) continue;
    const at::Tensor& first = now[changed[0]];
    const auto same_layout = [&](const at::Tensor& t) {
      if (!t.defined() || !is_dtensor(t) || !is_dtensor(first)) return false;
      const DTensor a(t), b(first);
      return a.placements() == b.placements() && a.device_mesh() == b.device_mesh() && t.sizes() == first.sizes() &&
             t.scalar_type() == first.scalar_type();
    };
    const bool agree = std::all_of(changed.begin(), changed.end(), [&](size_t i) { return same_layout(now[i]); });
    if (!agree) {
      std::ostringstream owners;
      for (size_t i = 0; i < slots.size(); ++i) owners << (i ? "; " : "") << "'" << slots[i].fqn << "': " << layout_of(now[i]);
      HP_CHECK_T(c10::ValueError, false, "hyper_parallel::parallelize_module: '", slots[0].fqn, "' and '", slots[1].fqn,
                 "' are one parameter (tied), but the plan lays its owners out differently (", owners.str(),
                 "); give every module that holds it a style with the same placements (RowwiseParallel on an embedding and "
                 "ColwiseParallel on an output projection both give Shard(dim=0)), or untie them first. The module is left as it was");
    }
    for (size_t i : changed)
      if (now[i].unsafeGetTensorImpl() != first.unsafeGetTensorImpl()) nn::replace_parameter(*slots[i].module, slots[i].name, first);
    if (!left.empty()) {
      std::ostringstream kept;
      for (size_t i = 0; i < left.size(); ++i) kept << (i ? ", " : "") << "'" << left[i] << "'";
      TORCH_WARN("parallelize_module: '", slots[changed[0]].fqn, "' was tied to ", kept.str(),
                 ", which no style of this plan lays out: ", kept.str(), " keeps the full tensor and is no longer tied to it. "
                 "Tie them again once both are laid out the same way (e.g. model.lm_head.weight = model.embed_tokens.weight), "
                 "or give every owner a style in one plan");
    }
  }
}

}  // namespace

namespace {

torch::nn::Module& parallelize(torch::nn::Module& module, const c10::optional<DeviceMesh>& device_mesh,
                               const ParallelizePlan* parallelize_plan, c10::optional<int64_t> src_data_rank) {
  c10::optional<DeviceMesh> mesh = device_mesh;
  if (!mesh) mesh = current_mesh();
  TORCH_CHECK(mesh.has_value(), "hyper_parallel::parallelize_module: no device_mesh given and no current mesh; pass one or call it "
              "inside a hyper_parallel::MeshScope");
  HP_CHECK_T(c10::ValueError, mesh->ndim() == 1, "hyper_parallel::parallelize_module: Tensor Parallel only accepts a 1D DeviceMesh, but found ", mesh->ndim(),
             "D! If you have a 2-D or N-D device_mesh, consider passing in device_mesh[\"tp\"]");
  if (!parallelize_plan) {
    TORCH_WARN("parallelize_module: no parallelize_plan is given and auto-parallel is not supported, so the module is "
               "left unchanged");
    return module;
  }

  // Resolve and validate the whole plan before changing anything.
  std::vector<Target> targets;
  std::shared_ptr<torch::nn::Module> root(std::shared_ptr<torch::nn::Module>{}, &module);  // non-owning
  if (parallelize_plan->is_single()) {
    HP_CHECK_T(c10::TypeError, parallelize_plan->style() != nullptr,
               "hyper_parallel::parallelize_module: the plan must be a ParallelStyle or a {path: ParallelStyle} plan, got a null style");
    targets.push_back({"", root, parallelize_plan->style()});
  } else {
    for (const auto& entry : parallelize_plan->entries()) {
      HP_CHECK_T(c10::TypeError, entry.style != nullptr, "hyper_parallel::parallelize_module: the plan value for '", entry.path,
                 "' must be a ParallelStyle, got a null style");
      std::vector<Target> found;
      match(root, "", split_path(entry.path), 0, entry.style, found);
      if (found.empty()) {
        TORCH_WARN("parallelize_module: plan path '", entry.path, "' matches no submodule; it is skipped");
        continue;
      }
      targets.insert(targets.end(), found.begin(), found.end());
    }
  }
  // Every rank must apply the same plan to the same model: otherwise some ranks fail validation
  // while others wait in a collective, or they silently compute different things.
  {
    std::ostringstream d;
    d << "mesh " << c10::IntArrayRef(mesh->shape()) << " src_data_rank "
      << (src_data_rank ? std::to_string(*src_data_rank) : "None") << "; plan:";
    for (const auto& t : targets) d << " " << (t.fqn.empty() ? "<root>" : t.fqn) << "=" << t.style->describe();
    d << "; parameters:";
    for (const auto& p : module.named_parameters(/*recurse=*/true))
      d << " " << p.key() << p.value().sizes() << p.value().scalar_type();
    check_agreement(mesh->get_group(0), "parallelize_module", d.str());
  }
  std::map<const torch::nn::Module*, std::string> distributed;
  for (const auto& t : targets) {
    t.style->validate(*t.module, t.fqn, *mesh);
    if (t.style->distributes_module()) {
      auto [it, fresh] = distributed.emplace(t.module.get(), t.style->name());
      TORCH_CHECK(fresh, "hyper_parallel::parallelize_module: module '", t.fqn.empty() ? "<root>" : t.fqn, "' gets both ", it->second,
                  " and ", t.style->name(), ", but distribute_module can be applied to a module only once");
    }
  }

  // From here on every rank changes the module; a failure anywhere puts it back as it was.
  const Ties ties = find_ties(module);
  nn::ModuleSnapshot before(module);
  try {
    for (const auto& t : targets) {
      t.style->src_data_rank = src_data_rank;
      record_name(*t.module, t.fqn);
      if (!t.style->runs_user_code()) {
        t.style->apply(*t.module, *mesh);
        continue;
      }
      // Code we could not validate: no rank goes on to the next entry's collectives before every
      // rank knows it succeeded everywhere.
      std::exception_ptr error;
      try {
        t.style->apply(*t.module, *mesh);
      } catch (...) {
        error = std::current_exception();
      }
      agree_on_user_code(*mesh, error, "parallelize_module: " + t.style->name() + " on '" + (t.fqn.empty() ? "<root>" : t.fqn) + "'");
    }
    keep_ties(ties);
  } catch (...) {
    before.restore();
    throw;
  }
  return module;
}

}  // namespace

torch::nn::Module& parallelize_module(torch::nn::Module& module, const c10::optional<DeviceMesh>& device_mesh,
                                      const ParallelizePlan& parallelize_plan, c10::optional<int64_t> src_data_rank) {
  return parallelize(module, device_mesh, &parallelize_plan, src_data_rank);
}

torch::nn::Module& parallelize_module(torch::nn::Module& module, const c10::optional<DeviceMesh>& device_mesh) {
  return parallelize(module, device_mesh, nullptr, 0);
}

}  // namespace hyper_parallel
