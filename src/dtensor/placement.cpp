#include <hyper_parallel/dtensor/placement.h>
#include <hyper_parallel/runtime/errors.h>

namespace hyper_parallel {

Placement Placement::normalized(int64_t ndim) const {
  if (kind_ != Kind::Shard) return *this;
  return Placement::shard(wrap_dim(dim_, ndim, to_string().c_str()));
}

std::string Placement::to_string() const {
  switch (kind_) {
    case Kind::Shard: return "Shard(dim=" + std::to_string(dim_) + ")";
    case Kind::Replicate: return "Replicate()";
    case Kind::Partial: return std::string("Partial(") + reduce_op_name(op_) + ")";
  }
  return "?";
}

std::string Placement::short_string() const {
  switch (kind_) {
    case Kind::Shard: return "S(" + std::to_string(dim_) + ")";
    case Kind::Replicate: return "R";
    case Kind::Partial: return std::string("P(") + reduce_op_name(op_) + ")";
  }
  return "?";
}

std::string short_string(const Placements& placements) {
  std::string s;
  for (const auto& p : placements) s += p.short_string();
  return s;
}

std::ostream& operator<<(std::ostream& os, const Placement& p) { return os << p.to_string(); }

std::string to_string(const Placements& placements) {
  std::string s = "(";
  for (size_t i = 0; i < placements.size(); ++i) s += (i ? ", " : "") + placements[i].to_string();
  return s + (placements.size() == 1 ? ",)" : ")");
}

Placements without_partial(Placements placements) {
  for (auto& p : placements)
    if (p.is_partial()) p = Replicate();
  return placements;
}

Placements normalize_placements(const Placements& placements, int64_t ndim) {
  Placements out;
  out.reserve(placements.size());
  for (const auto& p : placements) out.push_back(p.normalized(ndim));
  return out;
}

}  // namespace hyper_parallel
