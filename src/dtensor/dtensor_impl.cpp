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
  set_geometry_from_spec();
  set_storage_access_should_throw();
  check_dtensor_key_is_ours();
}

// The first DTensor of a spec derives the element count and contiguity flags as any TensorImpl
// does; the spec keeps them, and the next DTensors (every result of a cached decision) copy them
// instead of deriving them again. They depend on the sizes and strides alone, which a spec held
// by a DTensor never changes.
void DTensorImpl::set_geometry_from_spec() {
  const detail::SpecGeometry& g = spec_->geometry;
  const uint32_t flags = g.flags.value.load(std::memory_order_acquire);
  if (flags == 0) {
    set_sizes_and_strides(spec_->shape, spec_->stride);
    bool negative = false;  // set_sizes_and_strides rewrites negative strides: not cached
    for (int64_t s : spec_->stride) negative = negative || s < 0;
    if (!negative) {
      g.numel.value.store(numel_, std::memory_order_relaxed);
      g.flags.value.store(1u | (is_contiguous_ << 1) | (is_channels_last_ << 2) | (is_channels_last_contiguous_ << 3) |
                        (is_channels_last_3d_ << 4) | (is_channels_last_3d_contiguous_ << 5) |
                        (is_non_overlapping_and_dense_ << 6),
                    std::memory_order_release);
    }
  } else {
    sizes_and_strides_.set_sizes(spec_->shape);
    sizes_and_strides_.set_strides(spec_->stride);
    numel_ = g.numel.value.load(std::memory_order_relaxed);
    is_contiguous_ = (flags >> 1) & 1;
    is_channels_last_ = (flags >> 2) & 1;
    is_channels_last_contiguous_ = (flags >> 3) & 1;
    is_channels_last_3d_ = (flags >> 4) & 1;
    is_channels_last_3d_contiguous_ = (flags >> 5) & 1;
    is_non_overlapping_and_dense_ = (flags >> 6) & 1;
  }
  storage_offset_ = spec_->storage_offset;
}

void DTensorImpl::set_local_and_spec(at::Tensor local, std::shared_ptr<const DTensorSpec> spec) {
  local_ = std::move(local);
  spec_ = std::move(spec);
  // An in-place view op changes metadata by definition; the flag guards .data/.detach() aliases
  // against *other* metadata changes, which this is not.
  const bool allow = allow_tensor_metadata_change();
  set_allow_tensor_metadata_change(true);
  set_geometry_from_spec();
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
