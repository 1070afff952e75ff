#pragma once
// The TensorImpl behind every DTensor. Internal to the library.
#include <c10/core/TensorImpl.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <ATen/core/Tensor.h>

#include <atomic>
#include <typeinfo>

#include <memory>

#include <hyper_parallel/dtensor/dtensor_spec.h>

#include "copy_view_watch.h"

namespace hyper_parallel {

/// The dispatch key whose boxed fallback receives every aten op on DTensors. `Fake` is unused by
/// libtorch's C++ runtime in 1.13 and sits where Python's __torch_dispatch__ does: below autograd
/// and after CompositeImplicitAutograd decompositions. The only place that names the key.
/// In 2.11 `Fake` is still unused by libtorch's C++ code, in the same place; upstream has begun to use
/// it for a C++ FakeTensor, so the registration checks that no one else took it (dispatch.cpp).
constexpr c10::DispatchKey kDTensorKey = c10::DispatchKey::Fake;

namespace detail {
/// Set once the fallback at kDTensorKey is known to be ours (dispatch.cpp).
extern std::atomic<bool> g_dtensor_key_is_ours;
void check_dtensor_key_is_ours_slow();
void check_included_key_is_ours();
}  // namespace detail

/// Throws, naming the key, when another library registered kDTensorKey's fallback before ours, or
/// when the key is in this thread's included set and we did not put it there (torch 2.15's C++
/// FakeTensor mode includes `Fake`: every op of the thread, plain tensors too, would reach our
/// fallback). Every DTensor is made through here: one relaxed load and one thread-local test.
inline void check_dtensor_key_is_ours() {
  if (C10_UNLIKELY(!detail::g_dtensor_key_is_ours.load(std::memory_order_relaxed))) detail::check_dtensor_key_is_ours_slow();
  if (C10_UNLIKELY(c10::impl::tls_is_dispatch_key_included(kDTensorKey))) detail::check_included_key_is_ours();
}

/// Reports the global sizes and strides, holds the local shard, has no storage.
class DTensorImpl final : public c10::TensorImpl {
 public:
  DTensorImpl(at::Tensor local, std::shared_ptr<const DTensorSpec> spec);

  const at::Tensor& local() const { return local_; }
  const DTensorSpec& spec() const { return *spec_; }
  const std::shared_ptr<const DTensorSpec>& spec_ptr() const { return spec_; }
  /// Whether this DTensor is a view whose local data is a copy (its base had to be redistributed,
  /// or the local piece could not be viewed): an in-place write would not reach the base, so the
  /// dispatcher refuses it instead of losing it silently.
  bool is_copy_view() const { return copy_source_ != nullptr; }
  /// Where a copy-view's values came from (null for other DTensors): a read after a write into
  /// that source is refused (copy_view_watch.h).
  const std::shared_ptr<const CopySource>& copy_source() const { return copy_source_; }
  void set_copy_source(std::shared_ptr<const CopySource> s) { copy_source_ = std::move(s); }
  /// A copy-view whose source was written since the copy: reading it is refused.
  bool is_stale_copy_view() const { return C10_UNLIKELY(copy_source_ != nullptr) && copy_source_->writes_since() != 0; }
  /// The new geometry after an in-place view op (squeeze_, t_, transpose_, unsqueeze_): the
  /// reshaped local data and the spec with the new sizes and strides.
  void set_local_and_spec(at::Tensor local, std::shared_ptr<const DTensorSpec> spec);

  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(
      const c10::VariableVersion& version_counter,
      bool allow_tensor_metadata_change) const override;
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(
      c10::VariableVersion&& version_counter, bool allow_tensor_metadata_change) const override;
  void shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) override;
  void release_resources() override;

 private:
  // torch names it where it refuses storage access, which is where torch.compile and other
  // code written for dense tensors stop: the name says what to do instead.
  const char* tensorimpl_type_name() const override {
    return "hyper_parallel::DTensorImpl (a DTensor has no storage of its own. To save a parallelized model, gather it on rank 0: "
           "sd = hyper_parallel.get_model_state_dict(model, options=hyper_parallel.StateDictOptions(full_state_dict=True, "
           "cpu_offload=True)) on every rank, then on rank 0 model.save_pretrained(dir, state_dict=sd) or torch.save(sd, path) "
           "(C++: save_sharded, save_hf_checkpoint); "
           "one rank's piece is t.to_local(); torch.compile does not trace hyper_parallel's DTensors, run the module eagerly)";
  }
  template <class VersionCounter>
  c10::intrusive_ptr<c10::TensorImpl> copy_impl(VersionCounter&& vc, bool allow) const;
  // The spec's global sizes, strides and offset as this TensorImpl's.
  void set_geometry_from_spec();

  at::Tensor local_;
  std::shared_ptr<const DTensorSpec> spec_;
  std::shared_ptr<const CopySource> copy_source_;
};

/// The DTensorImpl behind `t`, or nullptr when `t` is not a DTensor.
inline DTensorImpl* dtensor_impl(const at::Tensor& t) {
  if (!t.defined()) return nullptr;
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (!impl->key_set().has(kDTensorKey)) return nullptr;
  // DTensorImpl is final: comparing the dynamic type is exact, and several times cheaper than a
  // dynamic_cast (this runs for every tensor argument of every DTensor op).
  return typeid(*impl) == typeid(DTensorImpl) ? static_cast<DTensorImpl*>(impl) : nullptr;
}

/// Wraps `local` (no autograd history of its own) with `spec`.
at::Tensor make_dtensor(at::Tensor local, std::shared_ptr<const DTensorSpec> spec);

}  // namespace hyper_parallel
