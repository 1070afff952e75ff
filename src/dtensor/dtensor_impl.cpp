#include "dtensor_impl.h"

namespace hyper_parallel {

namespace {
// The Fake functionality key plus the local tensor's backend bit only: without the Dense key a
// plain tensor's set_data(dtensor) is rejected instead of corrupting it. The TensorImpl
// constructor adds the matching Autograd and ADInplaceOrView keys.
c10::DispatchKeySet key_set_for(const at::Tensor& local) {
  return c10::DispatchKeySet(kDTensorKey) |
         c10::DispatchKeySet(local.key_set().highestBackendKey());
}
}  // namespace

DTensorImpl::DTensorImpl(at::Tensor local, std::shared_ptr<const DTensorSpec> spec)
    : c10::TensorImpl(key_set_for(local), local.dtype(), local.device()),
      local_(std::move(local)),
      spec_(std::move(spec)) {
  set_sizes_and_strides(spec_->shape, spec_->stride);
  storage_offset_ = spec_->storage_offset;
  set_storage_access_should_throw();
  check_dtensor_key_is_ours();
}

void DTensorImpl::set_local_and_spec(at::Tensor local, std::shared_ptr<const DTensorSpec> spec) {
  local_ = std::move(local);
  spec_ = std::move(spec);
  // An in-place view op changes metadata by definition; the flag guards .data/.detach() aliases
  // against *other* metadata changes, which this is not.
  const bool allow = allow_tensor_metadata_change();
  set_allow_tensor_metadata_change(true);
  set_sizes_and_strides(spec_->shape, spec_->stride);
  storage_offset_ = spec_->storage_offset;
  set_allow_tensor_metadata_change(allow);
}

template <class VersionCounter>
c10::intrusive_ptr<c10::TensorImpl> DTensorImpl::copy_impl(VersionCounter&& vc, bool allow) const {
  auto r = c10::make_intrusive<DTensorImpl>(local_, spec_);
  r->set_version_counter(std::forward<VersionCounter>(vc));
  r->set_allow_tensor_metadata_change(allow);
  r->copy_source_ = copy_source_;
  return r;
}

c10::intrusive_ptr<c10::TensorImpl> DTensorImpl::shallow_copy_and_detach(
    const c10::VariableVersion& version_counter, bool allow_tensor_metadata_change) const {
  return copy_impl(version_counter, allow_tensor_metadata_change);
}

c10::intrusive_ptr<c10::TensorImpl> DTensorImpl::shallow_copy_and_detach(
    c10::VariableVersion&& version_counter, bool allow_tensor_metadata_change) const {
  return copy_impl(std::move(version_counter), allow_tensor_metadata_change);
}

void DTensorImpl::shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) {
  auto* other = dynamic_cast<DTensorImpl*>(impl.get());
  TORCH_CHECK(other != nullptr, "hyper_parallel::DTensor::shallow_copy_from: cannot copy a plain tensor's metadata into a DTensor");
  copy_tensor_metadata(other, this, version_counter(), allow_tensor_metadata_change());
  local_ = other->local_;
  spec_ = other->spec_;
  copy_source_ = other->copy_source_;
}

void DTensorImpl::release_resources() {
  local_ = at::Tensor();
  c10::TensorImpl::release_resources();
}

at::Tensor make_dtensor(at::Tensor local, std::shared_ptr<const DTensorSpec> spec) {
  return at::detail::make_tensor<DTensorImpl>(std::move(local), std::move(spec));
}

}  // namespace hyper_parallel
