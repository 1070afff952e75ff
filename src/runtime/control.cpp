#include <hyper_parallel/runtime/control.h>
#include <hyper_parallel/runtime/errors.h>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <cstring>

#include "group_impl.h"

namespace hyper_parallel {
namespace {

// Host values as a tensor on the transport's device (the current device of an accelerator); a
// fake world's transport takes them where they are, as it touches no device.
at::Tensor on_device(const Transport& tr, const std::vector<int64_t>& values) {
  const at::Tensor host = at::tensor(values, at::kLong);
  return tr.capabilities().simulated ? host : host.to(c10::Device(tr.device_type()));
}

std::vector<int64_t> to_host(const at::Tensor& t) {
  const at::Tensor h = t.to(at::kCPU).contiguous();
  const int64_t* p = h.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + h.numel());
}

void finish(const Completion& done) {
  if (done) done();
}

}  // namespace

std::vector<std::vector<int64_t>> control_all_gather(const Group& group, const std::vector<int64_t>& values) {
  TORCH_CHECK(group.defined(), "hyper_parallel::control_all_gather: the group is undefined");
  if (group.size() == 1) return {values};
  const c10::InferenceMode normal(false);
  Transport& tr = transport_of(group);
  const int64_t n = static_cast<int64_t>(values.size());
  if (n == 0) return std::vector<std::vector<int64_t>>(static_cast<size_t>(group.size()));
  const at::Tensor mine = on_device(tr, values);
  const at::Tensor all = at::empty({group.size(), n}, mine.options());
  finish(tr.all_gather(mine, all));
  const std::vector<int64_t> flat = to_host(all);
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(group.size()));
  for (int64_t r = 0; r < group.size(); ++r) out[static_cast<size_t>(r)].assign(flat.begin() + r * n, flat.begin() + (r + 1) * n);
  return out;
}

std::vector<int64_t> control_broadcast(const Group& group, const std::vector<int64_t>& values, int64_t src) {
  TORCH_CHECK(group.defined(), "hyper_parallel::control_broadcast: the group is undefined");
  HP_CHECK_T(c10::ValueError, src >= 0 && src < group.size(), "hyper_parallel::control_broadcast: src ", src,
             " is not a rank of a group of size ", group.size());
  if (group.size() == 1 || values.empty()) return values;
  const c10::InferenceMode normal(false);
  Transport& tr = transport_of(group);
  const at::Tensor buf = on_device(tr, values);
  finish(tr.broadcast(buf, src));
  return to_host(buf);
}

std::string control_broadcast_string(const Group& group, const std::string& text, int64_t src) {
  const int64_t length = control_broadcast(group, {static_cast<int64_t>(text.size())}, src)[0];
  if (group.size() == 1) return text;  // src is the only rank
  if (length == 0) return {};
  const c10::InferenceMode normal(false);
  Transport& tr = transport_of(group);
  at::Tensor bytes = at::zeros({length}, at::kByte);
  if (group.rank() == src) std::memcpy(bytes.data_ptr(), text.data(), text.size());
  if (!tr.capabilities().simulated) bytes = bytes.to(c10::Device(tr.device_type()));
  finish(tr.broadcast(bytes, src));
  const at::Tensor h = bytes.to(at::kCPU);
  return std::string(static_cast<const char*>(h.data_ptr()), static_cast<size_t>(length));
}

}  // namespace hyper_parallel
