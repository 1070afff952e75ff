// The model's tensors as an HF checkpoint sees them (see hf_entries.h).
#include "hf_entries.h"

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/runtime/errors.h>

#include <algorithm>
#include <map>

#include "checkpoint_layout.h"

namespace hyper_parallel {
namespace hf_entries {

std::string Entry::key() const {
  for (const auto& k : keys)
    if (!k.empty()) return k;
  return "";
}

std::string Entry::fqn_list() const {
  std::string s;
  for (const auto& f : fqns) s += (s.empty() ? "'" : ", '") + f + "'";
  return s;
}

bool is_stacked(const std::string& key) { return key.find('*') != std::string::npos; }

std::string stacked_key(const std::string& key, int64_t index) {
  std::string out = key;
  const size_t at = out.find('*');
  return out.replace(at, 1, std::to_string(index));
}

RowRange row_range(const std::string& key) {
  RowRange r{key};
  if (key.empty() || key.back() != ']') return r;
  const size_t open = key.rfind('[');
  auto number = [&](size_t from, size_t to, int64_t& out) {
    if (from >= to) return false;
    out = 0;
    for (size_t i = from; i < to; ++i) {
      if (key[i] < '0' || key[i] > '9' || out > (int64_t{1} << 50)) return false;
      out = out * 10 + (key[i] - '0');
    }
    return true;
  };
  // Leading ":," (numpy's "all of this dim") move the range to a later dim: "[:, a:b]" is dim 1.
  size_t at = open == std::string::npos ? key.size() : open + 1;
  while (at + 1 < key.size() && key[at] == ':' && key[at + 1] == ',') {
    ++r.dim;
    at += 2;
    while (at < key.size() && key[at] == ' ') ++at;
  }
  const size_t colon = key.find(':', at);
  HP_CHECK_T(c10::ValueError,
             open != std::string::npos && open > 0 && colon != std::string::npos && number(at, colon, r.begin) &&
                 number(colon + 1, key.size() - 1, r.end) && r.begin < r.end,
             "hyper_parallel::CheckpointKeyMap: '", key, "' ends in ']' but not in a range [a:b] or [:, a:b] with a < b");
  r.name = key.substr(0, open);
  r.ranged = true;
  return r;
}

RowTiling row_tiling(std::vector<std::pair<int64_t, int64_t>>& ranges, int64_t rows) {
  std::sort(ranges.begin(), ranges.end());
  RowTiling t;
  int64_t next = 0;
  bool contiguous = true;
  for (const auto& [b, e] : ranges) {
    contiguous = contiguous && b == next;
    next = e;
    t.listed += (t.listed.empty() ? "" : ", ") + std::to_string(b) + ":" + std::to_string(e);
  }
  t.tiled = contiguous && next == rows;
  return t;
}

std::vector<Entry> entries_of(torch::nn::Module& model, const CheckpointKeyMap& key_map) {
  std::vector<Entry> out;
  std::map<const c10::TensorImpl*, size_t> seen;
  for (const auto& e : checkpoint_layout::entries_of(model)) {
    const std::string key = key_map ? key_map(e.name) : e.name;
    auto [it, fresh] = seen.emplace(e.value.unsafeGetTensorImpl(), out.size());
    if (fresh) out.push_back({e.value, {}, {}});
    out[it->second].fqns.push_back(e.name);
    // "a|b": alternative names, the first one a checkpoint holds being read, the first written.
    size_t from = 0;
    for (size_t bar = key.find('|'); ; bar = key.find('|', from)) {
      out[it->second].keys.push_back(key.substr(from, bar == std::string::npos ? std::string::npos : bar - from));
      if (bar == std::string::npos) break;
      from = bar + 1;
    }
  }
  return out;
}

bool holds_dtensor(const std::vector<Entry>& entries) {
  return std::any_of(entries.begin(), entries.end(), [](const Entry& e) { return is_dtensor(e.value); });
}

LocalBox local_box(const at::Tensor& value) {
  if (!is_dtensor(value)) return {value.detach(), std::vector<int64_t>(static_cast<size_t>(value.dim()), 0), true};
  DTensor d(value.detach());
  if (d.spec().has_partial()) d = d.redistribute(without_partial(d.placements()));  // a Partial has no box of its own
  const auto coord = *d.device_mesh().get_coordinate();
  LocalBox box{d.to_local(), d.spec().local_shape_and_offset(coord).second, true};
  const auto& placements = d.placements();
  for (size_t m = 0; m < placements.size(); ++m)
    if (!placements[m].is_shard() && coord[m] != 0) box.writer = false;
  return box;
}

}  // namespace hf_entries
}  // namespace hyper_parallel
