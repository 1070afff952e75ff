// Bitwise agreement of parameter replicas across ranks (nn/replica_check.h).
#include <hyper_parallel/nn/replica_check.h>

#include <ATen/ATen.h>

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/runtime/control.h>
#include <hyper_parallel/runtime/errors.h>

#include "../runtime/fnv1a.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <sstream>

namespace hyper_parallel {
namespace {

using detail::fnv1a;

uint64_t fnv1a(const std::vector<int64_t>& v, uint64_t h) { return fnv1a(v.data(), v.size() * sizeof(int64_t), h); }

// One piece of a parameter this rank holds: which elements (the key) and their bytes (the hash).
struct Piece {
  std::string name;
  std::vector<int64_t> offset, sizes;
  uint64_t key = 0, bytes = 0;
};

std::vector<Piece> pieces_of(const torch::nn::Module& module) {
  at::NoGradGuard no_grad;
  std::vector<Piece> out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    Piece piece;
    piece.name = item.key();
    at::Tensor local;
    if (is_dtensor(p)) {
      const DTensor d(p);
      if (d.spec().has_partial()) continue;
      const auto coordinate = d.device_mesh().get_coordinate();
      if (!coordinate) continue;  // not on this rank's mesh
      std::tie(piece.sizes, piece.offset) = d.spec().local_shape_and_offset(*coordinate);
      local = d.to_local();
    } else {
      piece.sizes = p.sizes().vec();
      piece.offset.assign(piece.sizes.size(), 0);
      local = p;
    }
    if (local.numel() == 0) continue;
    uint64_t key = fnv1a(piece.name.data(), piece.name.size());
    key = fnv1a(piece.sizes, fnv1a(piece.offset, key));
    const int8_t dtype = static_cast<int8_t>(local.scalar_type());
    piece.key = fnv1a(&dtype, 1, key);
    const at::Tensor bytes = local.detach().cpu().contiguous();
    piece.bytes = fnv1a(bytes.data_ptr(), static_cast<size_t>(bytes.numel()) * bytes.element_size());
    out.push_back(std::move(piece));
  }
  return out;
}

}  // namespace

std::vector<ReplicaMismatch> find_replica_mismatches(const torch::nn::Module& module, const Group& group) {
  HP_CHECK_T(c10::ValueError, group.defined(), "hyper_parallel::find_replica_mismatches: the group is undefined");
  const std::vector<Piece> mine = pieces_of(module);
  if (group.size() == 1) return {};
  // Ranks may hold different numbers of pieces (pipeline stages): agree on the longest list first.
  const auto counts = control_all_gather(group, {static_cast<int64_t>(mine.size())});
  int64_t longest = 0;
  for (const auto& c : counts) longest = std::max(longest, c[0]);
  std::vector<int64_t> flat(static_cast<size_t>(2 * longest), 0);
  for (size_t i = 0; i < mine.size(); ++i) {
    flat[2 * i] = static_cast<int64_t>(mine[i].key);
    flat[2 * i + 1] = static_cast<int64_t>(mine[i].bytes);
  }
  const auto all = control_all_gather(group, flat);
  // Each key's (group rank, bytes hash) pairs.
  std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> holders;
  for (size_t r = 0; r < all.size(); ++r)
    for (int64_t i = 0; i < counts[r][0]; ++i)
      holders[all[r][static_cast<size_t>(2 * i)]].emplace_back(static_cast<int64_t>(r), all[r][static_cast<size_t>(2 * i + 1)]);
  // Each rank names the mismatches of the pieces it holds, against the lowest rank holding them;
  // the lowest holder's names are what every rank reports, so the lists agree: gather them.
  std::vector<ReplicaMismatch> found;
  for (const Piece& p : mine) {
    const auto& h = holders.at(static_cast<int64_t>(p.key));
    if (h.front().first != group.rank()) continue;  // a lower rank reports this piece
    for (size_t j = 1; j < h.size(); ++j)
      if (h[j].second != h.front().second)
        found.push_back({p.name, p.offset, p.sizes, group.ranks()[static_cast<size_t>(h.front().first)],
                         group.ranks()[static_cast<size_t>(h[j].first)]});
  }
  // Every rank learns every report: the reporters' descriptions, one broadcast per reporting rank.
  const auto reported = control_all_gather(group, {static_cast<int64_t>(found.size())});
  std::vector<ReplicaMismatch> result;
  for (int64_t r = 0; r < group.size(); ++r) {
    if (reported[static_cast<size_t>(r)][0] == 0) continue;
    std::ostringstream text;
    if (r == group.rank())
      for (const auto& m : found) {
        text << m.name << '\t' << m.rank << '\t' << m.other_rank << '\t' << m.offset.size();
        for (size_t d = 0; d < m.offset.size(); ++d) text << '\t' << m.offset[d] << '\t' << m.sizes[d];
        text << '\n';
      }
    std::istringstream in(control_broadcast_string(group, text.str(), r));
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream f(line);
      ReplicaMismatch m;
      size_t ndim = 0;
      std::getline(f, m.name, '\t');
      f >> m.rank >> m.other_rank >> ndim;
      m.offset.resize(ndim);
      m.sizes.resize(ndim);
      for (size_t d = 0; d < ndim; ++d) f >> m.offset[d] >> m.sizes[d];
      result.push_back(std::move(m));
    }
  }
  std::sort(result.begin(), result.end(), [](const ReplicaMismatch& a, const ReplicaMismatch& b) {
    return std::tie(a.name, a.rank, a.other_rank, a.offset) < std::tie(b.name, b.rank, b.other_rank, b.offset);
  });
  return result;
}

void check_replicas_equal(const torch::nn::Module& module, const Group& group) {
  const auto mismatches = find_replica_mismatches(module, group);
  if (mismatches.empty()) return;
  std::vector<std::string> items;
  for (const auto& m : mismatches)
    items.push_back(c10::str("'", m.name, "' at offset ", c10::IntArrayRef(m.offset), " sizes ", c10::IntArrayRef(m.sizes),
                             " differs between ranks ", m.rank, " and ", m.other_rank));
  HP_CHECK_T(c10::Error, false, "hyper_parallel::check_replicas_equal: ", mismatches.size(),
             " parameter replica(s) are not bitwise equal on the ranks that hold them (a gradient reduced over the wrong ranks?): ",
             join_listed(items));
}

}  // namespace hyper_parallel
