#include <hyper_parallel/runtime/collective_label.h>

#include <utility>

#include "fnv1a.h"

namespace hyper_parallel {
namespace {
thread_local std::string t_label;
thread_local uint64_t t_hash = 0;
}  // namespace

CollectiveLabel::CollectiveLabel(std::string label) : previous_(std::move(t_label)), previous_hash_(t_hash) {
  t_label = std::move(label);
  // 0 stands for "no label": a label never hashes to it.
  t_hash = t_label.empty() ? 0 : detail::fnv1a(t_label.data(), t_label.size()) | 1;
}

CollectiveLabel::~CollectiveLabel() {
  t_label = std::move(previous_);
  t_hash = previous_hash_;
}

const std::string& current_collective_label() { return t_label; }

uint64_t current_collective_label_hash() { return t_hash; }

}  // namespace hyper_parallel
