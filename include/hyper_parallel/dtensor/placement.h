#pragma once
// Placements: how a DTensor's data lies along one mesh dimension (PyTorch's Shard, Replicate,
// Partial).
#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include <hyper_parallel/runtime/reduce_op.h>

namespace hyper_parallel {

/// One mesh dimension's layout of a tensor. Build with Shard(dim), Replicate() or Partial(op).
class Placement {
 public:
  enum class Kind : uint8_t { Replicate, Shard, Partial };

  Placement() = default;  ///< Replicate()
  static Placement shard(int64_t dim) { return Placement(Kind::Shard, dim, ReduceOp::SUM); }
  static Placement replicate() { return Placement(); }
  static Placement partial(ReduceOp op = ReduceOp::SUM) { return Placement(Kind::Partial, 0, op); }

  Kind kind() const { return kind_; }
  bool is_shard() const { return kind_ == Kind::Shard; }
  /// A Shard on exactly this (normalised) tensor dimension.
  bool is_shard(int64_t dim) const { return kind_ == Kind::Shard && dim_ == dim; }
  bool is_replicate() const { return kind_ == Kind::Replicate; }
  bool is_partial() const { return kind_ == Kind::Partial; }
  /// The sharded tensor dimension (may be negative until normalised against a tensor's rank).
  int64_t dim() const { return dim_; }
  ReduceOp reduce_op() const { return op_; }
  /// Negative Shard dims wrapped against a tensor of `ndim` dimensions; c10::IndexError when out
  /// of range.
  Placement normalized(int64_t ndim) const;
  /// "Shard(dim=0)", "Replicate()", "Partial(sum)", as PyTorch prints them.
  std::string to_string() const;
  /// The compact form of traces and errors: "S(0)", "R", "P(sum)".
  std::string short_string() const;
  size_t hash() const {
    return (static_cast<size_t>(kind_) << 16) ^ (static_cast<size_t>(dim_ + 64) << 4) ^ static_cast<size_t>(op_);
  }
  bool operator==(const Placement& o) const {
    return kind_ == o.kind_ && (kind_ != Kind::Shard || dim_ == o.dim_) &&
           (kind_ != Kind::Partial || op_ == o.op_);
  }
  bool operator!=(const Placement& o) const { return !(*this == o); }

 private:
  Placement(Kind k, int64_t dim, ReduceOp op) : kind_(k), dim_(dim), op_(op) {}
  Kind kind_ = Kind::Replicate;
  int64_t dim_ = 0;
  ReduceOp op_ = ReduceOp::SUM;
};

/// The tensor is split along `dim` (torch.chunk pieces) across the mesh dimension.
/// e.g. `Shard(0)`, `Shard(-1)` (the last dimension).
inline Placement Shard(int64_t dim) { return Placement::shard(dim); }
/// Every rank of the mesh dimension holds the whole tensor.
inline Placement Replicate() { return Placement::replicate(); }
/// Every rank holds a partial value; the tensor is their reduction (`op`, sum by default).
inline Placement Partial(ReduceOp op = ReduceOp::SUM) { return Placement::partial(op); }

/// One placement per mesh dimension.
using Placements = std::vector<Placement>;

std::ostream& operator<<(std::ostream& os, const Placement& p);
/// "(Shard(dim=0), Replicate())".
std::string to_string(const Placements& placements);
/// The compact form: one placement per mesh dimension, run together: "S(0)", "S(0)R", "RP(sum)".
std::string short_string(const Placements& placements);
/// `placements` with every Partial turned into Replicate (what a reduction leaves, and the
/// placements a gradient takes for a Partial value).
Placements without_partial(Placements placements);

/// Every placement normalised against `ndim` (see Placement::normalized).
Placements normalize_placements(const Placements& placements, int64_t ndim);

}  // namespace hyper_parallel

template <>
struct std::hash<hyper_parallel::Placement> {
  size_t operator()(const hyper_parallel::Placement& p) const { return p.hash(); }
};
