#include <hyper_parallel/runtime/agreement.h>
#include <hyper_parallel/runtime/c10d_interop.h>
#include <hyper_parallel/runtime/errors.h>

#include <ATen/ATen.h>

namespace hyper_parallel {

void check_agreement(const Group& group, const std::string& what, const std::string& description) {
  TORCH_CHECK(group.defined(), "hyper_parallel::check_agreement: the group is undefined");
  if (group.size() == 1) return;
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : description) h = (h ^ c) * 1099511628211ull;
  const at::Device device(group.device_type());
  at::Tensor mine = at::tensor({static_cast<int64_t>(h)}, at::kLong).to(device);
  at::Tensor all = at::empty({group.size()}, mine.options());
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int64_t r = 0; r < group.size(); ++r) outputs[0].push_back(all.narrow(0, r, 1));
  std::vector<at::Tensor> inputs{mine};
  wait_collective(group, "agreement check", c10d_group(group)->allgather(outputs, inputs));
  all = all.cpu();
  std::vector<int64_t> differ;
  for (int64_t r = 1; r < group.size(); ++r)
    if (all[r].item<int64_t>() != all[0].item<int64_t>()) differ.push_back(group.ranks()[static_cast<size_t>(r)]);
  HP_CHECK_T(c10::ValueError, differ.empty(), "hyper_parallel: ", what, ": the ranks disagree: rank(s) ",
             c10::IntArrayRef(differ), " differ from rank ", group.ranks()[0], " (every rank must call it with the ",
             "same arguments and shapes). Rank ", group.ranks()[static_cast<size_t>(group.rank())], " has: ",
             description);
}

}  // namespace hyper_parallel
