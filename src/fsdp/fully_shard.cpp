#include <hyper_parallel/fsdp/fully_shard.h>
#include <hyper_parallel/platform/platform.h>
#include <hyper_parallel/runtime/chunking.h>
#include <hyper_parallel/runtime/collectives.h>
#include <hyper_parallel/runtime/errors.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>


namespace hyper_parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// How one parameter is sharded over dp and rebuilt for compute.
struct ParamLayout : torch::CustomClassHolder {
  DeviceMesh dp_mesh;
  int64_t dp_dim = -1;               // tensor dim sharded over dp; -1: replicated over dp
  int64_t compute_size = 0;          // size of dp_dim in the compute tensor's local shard
  c10::optional<DeviceMesh> tp_mesh; // compute tensor is a DTensor on it, else plain
  Placements tp_placements;
  std::shared_ptr<const DTensorSpec> compute_spec;  // spec of the compute DTensor (TP)
  std::shared_ptr<const DTensorSpec> sharded_spec;  // spec of the sharded parameter
};

// The compute tensor from the sharded parameter: all-gather over dp forward; backward the
// gradient goes to the TP placements, then is reduce-scattered (or all-reduced) with averaging.
struct UnshardFn : torch::autograd::Function<UnshardFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& sharded, c10::intrusive_ptr<ParamLayout> layout) {
    ctx->saved_data["layout"] = c10::IValue::make_capsule(layout);
    at::Tensor local = DTensor(sharded).to_local().detach();
    if (layout->dp_dim >= 0)
      local = all_gather(local, layout->dp_dim, layout->dp_mesh.get_group(), layout->compute_size);
    if (!layout->tp_mesh) return local;
    return DTensor::from_local(local, *layout->tp_mesh, layout->tp_placements, false,
                               c10::IntArrayRef(layout->compute_spec->shape));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto layout = c10::static_intrusive_pointer_cast<ParamLayout>(ctx->saved_data["layout"].toCapsule());
    at::Tensor g = grads[0];
    if (!g.defined()) return {at::Tensor(), at::Tensor()};
    at::Tensor local;
    if (is_dtensor(g)) {
      DTensor d(g);
      if (d.placements() != layout->tp_placements) d = d.redistribute(layout->tp_placements);
      local = d.to_local();
    } else {
      local = g;
    }
    const Group& dp = layout->dp_mesh.get_group();
    local = layout->dp_dim >= 0 ? reduce_scatter(local.contiguous(), ReduceOp::AVG, layout->dp_dim, dp)
                                : all_reduce(local, ReduceOp::AVG, dp);
    return {DTensor::from_local(local, layout->sharded_spec->mesh, layout->sharded_spec->placements, false,
                                c10::IntArrayRef(layout->sharded_spec->shape)),
            at::Tensor()};
  }
};

struct Managed {
  torch::nn::Module* owner;
  std::string name;
  at::Tensor sharded;  // the parameter optimizers hold
  c10::intrusive_ptr<ParamLayout> layout;
};

// A parameter an inner fully_shard call already took over lives on the root mesh (with TP) or on
// dp_mesh itself (without); TP parameters live on the other 1-D slice.
bool already_sharded(const at::Tensor& param, const DeviceMesh& dp_mesh, const DeviceMesh& root) {
  if (!is_dtensor(param)) return false;
  const DeviceMesh& m = DTensor(param).device_mesh();
  return m == dp_mesh || (root.ndim() > 1 && m == root);
}

}  // namespace

torch::nn::Module& fully_shard(torch::nn::Module& module, const DeviceMesh& dp_mesh) {
  nn::Module& root_module = platform::hookable(module, module.name());
  HP_CHECK_T(c10::ValueError, dp_mesh.ndim() == 1, "fully_shard needs the 1-D data-parallel mesh (e.g. mesh[\"dp\"]), got a ",
             dp_mesh.ndim(), "-D one");
  const DeviceMesh root = dp_mesh.root_mesh();
  const int64_t dp_root_dim = dp_mesh.dim_in_root().value_or(0);

  // Plan every parameter first: nothing changes unless all of them can be sharded.
  struct Planned {
    torch::nn::Module* owner;
    std::string name;
    at::Tensor param;
    c10::intrusive_ptr<ParamLayout> layout;
  };
  std::vector<Planned> plan;
  {
    for (const auto& [prefix, owner_ptr] : nn::modules_with_names(module)) {
      torch::nn::Module& owner = *owner_ptr;
      for (const auto& p : owner.named_parameters(false)) {
        const at::Tensor& param = p.value();
        if (already_sharded(param, dp_mesh, root)) continue;
        const std::string fqn = prefix.empty() ? p.key() : prefix + "." + p.key();
        auto layout = c10::make_intrusive<ParamLayout>();
        layout->dp_mesh = dp_mesh;
        auto sharded = std::make_shared<DTensorSpec>(dp_mesh, Placements{Shard(0)}, param.sizes().vec(), param.scalar_type());
        if (is_dtensor(param)) {
          const DTensor d(param);
          const DeviceMesh& tp = d.device_mesh();
          HP_CHECK_T(c10::ValueError, tp.ndim() == 1 && tp.root_mesh() == root && tp.dim_in_root().has_value() &&
                                          *tp.dim_in_root() != dp_root_dim,
                     "fully_shard: parameter '", fqn, "' lives on ", tp.to_string(),
                     ", which is not the other dimension of the root mesh of ", dp_mesh.to_string(),
                     " (apply parallelize_module on mesh[\"tp\"] and fully_shard on mesh[\"dp\"] of one mesh)");
          layout->tp_mesh = tp;
          layout->tp_placements = d.placements();
          layout->compute_spec = std::make_shared<DTensorSpec>(d.spec());
          // The first dim TP leaves whole: sharding it over dp nests correctly under any mesh order.
          for (int64_t k = 0; k < d.dim(); ++k)
            if (!d.placements()[0].is_shard(k)) { layout->dp_dim = k; break; }
          const auto local = d.spec().local_shape();
          layout->compute_size = layout->dp_dim >= 0 ? local[static_cast<size_t>(layout->dp_dim)] : 0;
          Placements pl(static_cast<size_t>(root.ndim()), Replicate());
          pl[static_cast<size_t>(*tp.dim_in_root())] = d.placements()[0];
          pl[static_cast<size_t>(dp_root_dim)] = layout->dp_dim >= 0 ? Shard(layout->dp_dim) : Replicate();
          sharded = std::make_shared<DTensorSpec>(root, pl, param.sizes().vec(), param.scalar_type());
        } else {
          HP_CHECK_T(c10::ValueError, param.dim() > 0, "fully_shard: parameter '", fqn, "' is a scalar");
          layout->dp_dim = 0;
          layout->compute_size = param.size(0);
        }
        layout->sharded_spec = sharded;
        plan.push_back({&owner, p.key(), param, layout});
      }
    }
  }

  std::vector<Managed> managed;
  for (auto& pl : plan) {
    const auto& layout = *pl.layout;
    at::Tensor local = is_dtensor(pl.param) ? DTensor(pl.param).to_local().detach() : pl.param.detach();
    if (layout.dp_dim >= 0) {
      const int64_t n = local.size(layout.dp_dim), parts = dp_mesh.size(0), r = dp_mesh.get_local_rank();
      local = local.narrow(layout.dp_dim, chunk_offset(n, parts, r), chunk_size(n, parts, r));
    }
    at::Tensor sharded = DTensor::from_local(local.clone(at::MemoryFormat::Contiguous), layout.sharded_spec->mesh,
                                             layout.sharded_spec->placements, false,
                                             c10::IntArrayRef(layout.sharded_spec->shape))
                             .detach();
    nn::replace_parameter(*pl.owner, pl.name, sharded);  // keeps requires_grad
    managed.push_back({pl.owner, pl.name, sharded, pl.layout});
  }

  auto shared = std::make_shared<std::vector<Managed>>(std::move(managed));
  root_module.register_forward_pre_hook([shared](nn::Module&, const std::vector<c10::IValue>&) -> c10::optional<std::vector<c10::IValue>> {
    for (auto& m : *shared) nn::replace_parameter(*m.owner, m.name, UnshardFn::apply(m.sharded, m.layout));
    return c10::nullopt;
  });
  // After forward the registry holds the shards again (what optimizers and state dicts see); the
  // gathered tensors live on only where autograd saved them.
  root_module.register_forward_hook([shared](nn::Module&, const std::vector<c10::IValue>&, const c10::IValue&) -> c10::optional<c10::IValue> {
    for (auto& m : *shared) nn::replace_parameter(*m.owner, m.name, m.sharded);
    return c10::nullopt;
  });
  return module;
}

}  // namespace hyper_parallel
