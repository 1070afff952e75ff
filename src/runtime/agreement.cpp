#include <hyper_parallel/runtime/agreement.h>
#include <hyper_parallel/runtime/control.h>
#include <hyper_parallel/runtime/errors.h>

#include <c10/util/ArrayRef.h>

#include <cstring>

#include "fnv1a.h"

namespace hyper_parallel {
namespace {

// Of a description, what the error quotes for every rank (the hash decided; this only names).
constexpr size_t kQuotedBytes = 240;

std::vector<int64_t> packed(const std::string& text) {
  std::vector<int64_t> words(kQuotedBytes / sizeof(int64_t), 0);
  std::memcpy(words.data(), text.data(), std::min(text.size(), kQuotedBytes - 1));
  return words;
}

std::string unpacked(const std::vector<int64_t>& words) {
  const char* p = reinterpret_cast<const char*>(words.data());
  return std::string(p, strnlen(p, words.size() * sizeof(int64_t)));
}

}  // namespace

void check_agreement(const Group& group, const std::string& what, const std::string& description) {
  TORCH_CHECK(group.defined(), "hyper_parallel::check_agreement: the group is undefined");
  if (group.size() == 1) return;
  const uint64_t h = detail::fnv1a(description.data(), description.size());
  const auto all = control_all_gather(group, {static_cast<int64_t>(h)});
  std::vector<int64_t> differ;
  for (int64_t r = 1; r < group.size(); ++r)
    if (all[static_cast<size_t>(r)][0] != all[0][0]) differ.push_back(group.ranks()[static_cast<size_t>(r)]);
  if (differ.empty()) return;
  // Every rank saw the same hashes, so every rank takes this second exchange: each one's error
  // can then say what every rank was about to do, not only its own part.
  const auto texts = control_all_gather(group, packed(description));
  std::string each;
  for (int64_t r = 0; r < group.size(); ++r)
    each += c10::str(r ? "; rank " : "rank ", group.ranks()[static_cast<size_t>(r)], ": ", unpacked(texts[static_cast<size_t>(r)]));
  HP_CHECK_T(c10::ValueError, false, "hyper_parallel::", what, ": the ranks disagree: rank(s) ", c10::IntArrayRef(differ),
             " differ from rank ", group.ranks()[0], " (every rank must call it with the same arguments and shapes). ",
             "Rank ", group.ranks()[static_cast<size_t>(group.rank())], " has: ", description, ". Every rank: ", each);
}

Verdicts gather_verdicts(const Group& group, int64_t code, const std::string& my_message) {
  TORCH_CHECK(group.defined(), "hyper_parallel::gather_verdicts: the group is undefined");
  Verdicts v;
  if (group.size() == 1) {
    v.codes = {code};
  } else {
    for (const auto& c : control_all_gather(group, {code})) v.codes.push_back(c[0]);
  }
  for (size_t r = 0; r < v.codes.size() && v.first < 0; ++r)
    if (v.codes[r] != 0) v.first = static_cast<int64_t>(r);
  if (v.first < 0) return v;
  v.message = group.size() == 1 ? my_message : control_broadcast_string(group, my_message.substr(0, 2047), v.first);
  return v;
}

}  // namespace hyper_parallel
