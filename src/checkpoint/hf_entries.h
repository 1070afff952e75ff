#pragma once
// What the HF checkpoint load and save share (internal): the model's tensors, tied ones grouped,
// with their names in the checkpoint, and this rank's box of each.
#include <hyper_parallel/checkpoint/hf_checkpoint.h>

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace hyper_parallel {
namespace hf_entries {

// One tensor of the model: every FQN that refers to it (tied parameters share one tensor) and the
// checkpoint name of each ("" where the key map stores none).
struct Entry {
  at::Tensor value;
  std::vector<std::string> fqns, keys;
  // The first non-empty key; "" when the checkpoint stores none of the names.
  std::string key() const;
  std::string fqn_list() const;
};

// A key with '*' names one checkpoint tensor per index of the value's dim 0 (CheckpointKeyMap).
bool is_stacked(const std::string& key);
// `key` with `index` in place of its '*'.
std::string stacked_key(const std::string& key, int64_t index);

// A key that ends in "[a:b]": the checkpoint tensor `name`'s rows [begin, end) (CheckpointKeyMap);
// "[:, a:b]" the same range of dim 1 (`dim`). `ranged` false for any other key (name is the key
// itself). A malformed range raises ValueError.
struct RowRange {
  std::string name;
  bool ranged = false;
  int64_t begin = 0, end = 0;
  int64_t dim = 0;
};
RowRange row_range(const std::string& key);

// Whether the row ranges [begin, end) cover rows [0, rows) once each (sorted in place), and the
// ranges as "a:b, c:d" for a message.
struct RowTiling {
  bool tiled = false;
  std::string listed;
};
RowTiling row_tiling(std::vector<std::pair<int64_t, int64_t>>& ranges, int64_t rows);

std::vector<Entry> entries_of(torch::nn::Module& model, const CheckpointKeyMap& key_map);

// Whether any entry is a DTensor: only then are load and save collective.
bool holds_dtensor(const std::vector<Entry>& entries);

// This rank's local tensor of `value` and its offset in the global tensor. For a DTensor also
// whether this rank is the one that writes the box (the lowest coordinate along every mesh dim
// that does not shard it), so that replicas are written once.
struct LocalBox {
  at::Tensor local;
  std::vector<int64_t> offset;
  bool writer = true;
};
LocalBox local_box(const at::Tensor& value);

}  // namespace hf_entries
}  // namespace hyper_parallel
