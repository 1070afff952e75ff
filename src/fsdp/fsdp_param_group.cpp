#include "fsdp_param_group.h"

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/nn/activation_checkpoint.h>
#include <hyper_parallel/nn/module.h>
#include <hyper_parallel/runtime/collective_label.h>
#include <hyper_parallel/runtime/collectives.h>

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>

#include <map>

namespace hyper_parallel {
namespace fsdp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The group's compute tensors from its sharded parameters (the data is already gathered); its
// backward reduces all their gradients at once.
struct UnshardGroupFn : torch::autograd::Function<UnshardGroupFn> {
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<FSDPParamGroup> group, at::TensorList sharded) {
    ctx->saved_data["group"] = c10::IValue::make_capsule(group);
    // A parameter this rank's forward did not use gets an undefined gradient, not zeros: whether
    // it gets one is decided over the ranks (reduce_grads).
    ctx->set_materialize_grads(false);
    variable_list out, frozen;
    for (const FSDPParam& p : group->params()) {
      out.push_back(p.compute_tensor());
      if (!p.sharded.requires_grad()) frozen.push_back(out.back());
    }
    // A frozen parameter gets no gradient, as in one process: its compute tensor is not one of
    // the node's differentiable outputs.
    ctx->mark_non_differentiable(frozen);
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto group = c10::static_intrusive_pointer_cast<FSDPParamGroup>(ctx->saved_data["group"].toCapsule());
    group->reduce_grads(grads);
    // The sharded gradients reach .grad at the end of the backward pass (reduce_grads), not
    // through autograd: undefined here.
    return variable_list(grads.size() + 1);
  }
};

// Every tensor in a module's output (a tensor, or tuples/lists of them).
void for_each_tensor(const c10::IValue& v, const std::function<void(const at::Tensor&)>& fn) {
  if (v.isTensor()) fn(v.toTensor());
  else if (v.isTuple()) for (const auto& e : v.toTupleRef().elements()) for_each_tensor(e, fn);
  else if (v.isList()) for (const auto& e : v.toListRef()) for_each_tensor(e, fn);
}

}  // namespace

FSDPParamGroup::FSDPParamGroup(std::vector<FSDPParam> params, DeviceMesh dp_mesh, FullyShardOptions options)
    : params_(std::move(params)),
      shard_group_(dp_mesh.get_group(-1)),
      shard_size_(dp_mesh.size(-1)),
      options_(std::move(options)) {
  if (dp_mesh.ndim() == 2) replicate_group_ = dp_mesh.get_group(0);
  std::map<at::ScalarType, size_t> bucket_of;
  for (size_t k = 0; k < params_.size(); ++k) {
    FSDPParam& p = params_[k];
    const at::ScalarType t = p.sharded.scalar_type();
    auto it = bucket_of.find(t);
    if (it == bucket_of.end()) {
      it = bucket_of.emplace(t, buckets_.size()).first;
      buckets_.emplace_back();
    }
    Bucket& b = buckets_[it->second];
    b.params.push_back(k);
    p.offset = b.row_numel;
    b.row_numel += p.padded_numel;
    b.compute_numel += c10::multiply_integers(p.compute_shape);
  }
  set_fqn("");
  for (Bucket& b : buckets_) b.grad_row_numel = b.row_numel + static_cast<int64_t>(b.params.size());
  for (Bucket& b : buckets_) allocate(b);
  reshard();  // sharded until the first forward
}

void FSDPParamGroup::set_fqn(const std::string& fqn) {
  const std::string who = fqn.empty() ? "fully_shard of the root module" : "fully_shard of '" + fqn + "'";
  gather_label_ = who + ": all_gather of its parameters";
  reduce_label_ = who + ": reduce_scatter of its gradients";
  replicas_label_ = who + ": all_reduce of its gradients over the replicas";
}

at::TensorOptions FSDPParamGroup::options_of(const Bucket& b) const {
  return DTensor(params_[b.params[0]].sharded).to_local().options();
}

at::ScalarType FSDPParamGroup::compute_dtype(const Bucket& b) const {
  return options_.mp_policy.param_dtype.value_or(options_of(b).dtype().toScalarType());
}

at::ScalarType FSDPParamGroup::reduce_dtype(const Bucket& b) const { return options_.mp_policy.reduce_dtype.value_or(compute_dtype(b)); }

void FSDPParamGroup::allocate(Bucket& b) {
  const auto options = options_of(b).dtype(compute_dtype(b));
  b.send = at::empty({b.row_numel}, options);
  b.storage = at::empty({b.compute_numel}, options);
  int64_t at = 0;
  for (size_t k : b.params) {
    FSDPParam& p = params_[k];
    const int64_t n = c10::multiply_integers(p.compute_shape);
    p.unsharded = b.storage.narrow(0, at, n).view(p.compute_shape);
    at += n;
  }
  b.grad_rows = at::zeros({shard_size_, b.grad_row_numel}, options.dtype(reduce_dtype(b)));
}

// The buffers follow the sharded parameters' device and dtype before each gather: a group made
// on a meta model gets real buffers once init_parameters / to_empty materialise the parameters
// in place, and model.to(dtype or device) after fully_shard (which changes the parameters in
// place) gathers and computes in the new dtype, as FSDP2 does.
void FSDPParamGroup::follow_parameters() {
  for (Bucket& b : buckets_) {
    const at::TensorOptions now = options_of(b);
    if (b.send.device() == now.device() && b.send.scalar_type() == compute_dtype(b)) continue;
    for (size_t k : b.params) {
      const at::Tensor local = DTensor(params_[k].sharded).to_local();
      HP_CHECK_T(c10::ValueError, local.scalar_type() == now.dtype().toScalarType() && local.device() == now.device(),
                 "hyper_parallel::fully_shard: the parameters of one fully_shard group were moved to different dtypes or devices (",
                 now.dtype(), " on ", now.device(), " and ", local.scalar_type(), " on ", local.device(),
                 "); convert the whole module, or shard the differing parts in calls of their own");
    }
    allocate(b);
    b.storage.storage().unsafeGetStorageImpl()->reset();  // sharded: issue_unshard fills it
  }
}

void FSDPParamGroup::issue_unshard() {
  if (unsharded_) return;
  at::NoGradGuard no_grad;
  follow_parameters();
  for (Bucket& b : buckets_) {
    c10::StorageImpl* s = b.storage.storage().unsafeGetStorageImpl();
    const size_t bytes = static_cast<size_t>(b.compute_numel) * b.storage.element_size();
    s->set_data_ptr_noswap(s->allocator()->allocate(bytes));
    s->set_nbytes(bytes);
    for (size_t k : b.params) params_[k].copy_in(b.send);
    const CollectiveLabel label(gather_label_);
    b.gather = all_gather_async(b.send, 0, shard_group_);
  }
  unsharded_ = true;
  gather_pending_ = true;
}

void FSDPParamGroup::unshard() {
  issue_unshard();
  if (!gather_pending_) return;
  gather_pending_ = false;
  at::NoGradGuard no_grad;
  for (Bucket& b : buckets_) {
    const at::Tensor rows = b.gather.wait().view({shard_size_, b.row_numel});
    b.gather = Work();
    // Writing the storage must not count as a modification of the tensors autograd saved.
    at::AutoDispatchBelowADInplaceOrView no_version_bump;
    for (size_t k : b.params) params_[k].copy_out(rows);
  }
}

void FSDPParamGroup::reshard() {
  if (gather_pending_) unshard();  // the transport may still write the storage
  for (Bucket& b : buckets_) b.storage.storage().unsafeGetStorageImpl()->reset();
  unsharded_ = false;
}

namespace {
// fully_shard forwards running on this thread: the group whose first forward starts with none
// running is the root.
thread_local int t_active_forwards = 0;
}  // namespace

bool FSDPParamGroup::claim_root() {
  if (root_known_) return false;
  is_root_ = t_active_forwards == 0;
  root_known_ = true;
  return is_root_;
}

std::vector<at::Tensor> FSDPParamGroup::pre_forward() {
  claim_root();
  ++t_active_forwards;
  in_forward_ = true;
  unshard();
  // Issued before this group computes; the prefetched group's own pre_forward completes it.
  for (const auto& w : forward_prefetch)
    if (auto g = w.lock()) g->issue_unshard();
  std::vector<at::Tensor> sharded;
  for (const FSDPParam& p : params_) sharded.push_back(p.sharded);
  return UnshardGroupFn::apply(c10::intrusive_ptr<FSDPParamGroup>::reclaim_copy(this), at::TensorList(sharded));
}

void FSDPParamGroup::post_forward(const c10::IValue& output) {
  // Also runs when the forward (or a pre-hook) threw, with a None output (an always_call hook):
  // the count of running forwards stays right.
  if (!in_forward_) return;
  in_forward_ = false;
  --t_active_forwards;
  // An activation-checkpointing recompute runs in backward, which is about to use the
  // parameters: they stay gathered until this group's gradients are reduced.
  if (is_recomputing()) return;
  // The root's parameters stay gathered: backward starts with them (as FSDP2 does).
  if (options_.reshard_after_forward && !is_root_) reshard();
  if (output.isNone()) return;  // no backward will come
  // Gathered again when this output's gradient arrives: after this forward, or - when several
  // forwards run before their backwards (pipeline microbatches) - after an earlier backward
  // resharded them. A no-op when they are still gathered.
  c10::weak_intrusive_ptr<FSDPParamGroup> self(c10::intrusive_ptr<FSDPParamGroup>::reclaim_copy(this));
  for_each_tensor(output, [&](const at::Tensor& t) {
    if (t.defined() && t.requires_grad())
      t.register_hook([self](const at::Tensor&) {
        if (auto g = self.lock()) g->unshard();
      });
  });
}

void FSDPParamGroup::reduce_grads(const std::vector<at::Tensor>& grads) {
  TORCH_INTERNAL_ASSERT(grads.size() == params_.size());
  if (reduce_pending_) finish_reduce_grads();  // a second backward through the same forward
  for (Bucket& b : buckets_) {
    if (!grads_accumulated_) {
      b.grad_rows.zero_();
      b.used_here.assign(b.params.size(), false);
    }
    for (size_t i = 0; i < b.params.size(); ++i) {
      const FSDPParam& p = params_[b.params[i]];
      at::Tensor g = grads[b.params[i]];
      // No gradient on this rank: its rows stay zero, its share of the mean. The others' shares
      // still arrive in this rank's piece of the reduction, which is why the flag decides.
      if (!g.defined()) continue;
      b.grad_rows.select(1, b.row_numel + static_cast<int64_t>(i)).fill_(1);
      b.used_here[i] = true;
      if (is_dtensor(g)) {
        DTensor d(g);
        if (d.placements() != p.tp_placements) d = d.redistribute(p.tp_placements);
        g = d.to_local();
      }
      p.pack_grad(g, b.grad_rows);
    }
  }
  if (reshard_after_backward) reshard();  // backward is done with this group's parameters
  if (!requires_gradient_sync) {  // accumulate: the sync backward reduces it all at once
    grads_accumulated_ = true;
    return;
  }
  grads_accumulated_ = false;
  const ReduceOp op = options_.gradient_divide_factor ? ReduceOp::SUM : ReduceOp::AVG;
  {
    const CollectiveLabel label(reduce_label_);
    for (Bucket& b : buckets_) b.reduce = reduce_scatter_async(b.grad_rows.view({-1}), op, 0, shard_group_);
  }
  reduce_pending_ = true;
  c10::weak_intrusive_ptr<FSDPParamGroup> self(c10::intrusive_ptr<FSDPParamGroup>::reclaim_copy(this));
  torch::autograd::Engine::get_default_engine().queue_callback([self] {
    if (auto g = self.lock()) g->finish_reduce_grads();
  });
}

void FSDPParamGroup::finish_reduce_grads() {
  if (!reduce_pending_) return;
  reduce_pending_ = false;
  at::NoGradGuard no_grad;
  for (Bucket& b : buckets_) {
    at::Tensor row = b.reduce.wait();
    b.reduce = Work();
    // HSDP: the shard-reduced row averaged over the replicas too.
    if (replicate_group_) {
      const CollectiveLabel label(replicas_label_);
      all_reduce_(row, options_.gradient_divide_factor ? ReduceOp::SUM : ReduceOp::AVG, *replicate_group_);
    }
    if (options_.gradient_divide_factor) row.div_(*options_.gradient_divide_factor);
    // A parameter gets a gradient iff some rank's backward produced one (as one process on the
    // whole batch): then every rank takes its piece, which holds the other ranks' shares; one no
    // rank used gets none, so an optimizer keeps no state for a layer no forward used.
    std::vector<bool> used = b.used_here;
    if (!row.is_meta()) {
      const at::Tensor flags = row.narrow(0, b.row_numel, static_cast<int64_t>(b.params.size())).gt(0).cpu();
      for (size_t i = 0; i < used.size(); ++i) used[i] = flags.data_ptr<bool>()[i];
    }
    for (size_t i = 0; i < b.params.size(); ++i) {
      const size_t k = b.params[i];
      if (!used[i]) continue;
      at::Tensor g = params_[k].unpack_grad(row);
      at::Tensor& grad = params_[k].sharded.mutable_grad();
      if (!grad.defined()) grad = std::move(g);
      else grad.add_(g);
    }
  }
}

}  // namespace fsdp
}  // namespace hyper_parallel
