#include <hyper_parallel/runtime/agreement.h>
#include <hyper_parallel/runtime/control.h>
#include <hyper_parallel/runtime/errors.h>

#include <c10/util/ArrayRef.h>

#include "fnv1a.h"

namespace hyper_parallel {

void check_agreement(const Group& group, const std::string& what, const std::string& description) {
  TORCH_CHECK(group.defined(), "hyper_parallel::check_agreement: the group is undefined");
  if (group.size() == 1) return;
  const uint64_t h = detail::fnv1a(description.data(), description.size());
  const auto all = control_all_gather(group, {static_cast<int64_t>(h)});
  std::vector<int64_t> differ;
  for (int64_t r = 1; r < group.size(); ++r)
    if (all[static_cast<size_t>(r)][0] != all[0][0]) differ.push_back(group.ranks()[static_cast<size_t>(r)]);
  HP_CHECK_T(c10::ValueError, differ.empty(), "hyper_parallel::", what, ": the ranks disagree: rank(s) ",
             c10::IntArrayRef(differ), " differ from rank ", group.ranks()[0], " (every rank must call it with the ",
             "same arguments and shapes). Rank ", group.ranks()[static_cast<size_t>(group.rank())], " has: ",
             description);
}

}  // namespace hyper_parallel
