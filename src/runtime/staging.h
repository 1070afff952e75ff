#pragma once
// Which tensors a transport takes, and staging the others through host memory (internal to
// runtime/): what the collectives' front and the point-to-point front share.
#include <ATen/ATen.h>

#include <hyper_parallel/runtime/errors.h>

#include "transport/transport.h"

namespace hyper_parallel {

// Whether the group's transport can take `t`: a tensor of its device, or (on a host transport)
// one of an accelerator, which is staged through host memory; anything else is refused, naming
// the op, the tensor's device and the transport.
inline void check_device(const at::Tensor& t, const Transport& tr, const char* what) {
  if (t.device().type() == tr.device_type()) return;
  HP_CHECK_T(c10::ValueError, tr.device_type() == c10::DeviceType::CPU && t.device().type() != c10::DeviceType::Meta,
             "hyper_parallel::", what, ": a tensor on ", t.device(), " cannot go through this group's ", tr.name(),
             " transport, which moves ", c10::DeviceTypeName(tr.device_type(), true),
             " tensors; move the tensor there or create the process group for its device");
}
// `t` as the group's transport moves it: on its device (the caller's device gets the result back).
inline at::Tensor on_transport(const at::Tensor& t, const Transport& tr, const char* what) {
  check_device(t, tr, what);
  return t.device().type() == tr.device_type() ? t : t.to(c10::DeviceType::CPU);
}

// `result` back on the caller's device.
inline at::Tensor back_to(const at::Tensor& result, const c10::Device& device) {
  return result.device() == device ? result : result.to(device);
}

}  // namespace hyper_parallel
