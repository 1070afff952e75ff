#pragma once
// The check that every rank's all_to_all_single sizes agree with its peers' (internal to
// runtime/): the shared-memory transport runs it on every call, the front under
// HP_DEBUG_COLLECTIVES on the other host transports. Every rank runs it on the same table, so a
// disagreement raises alike on all of them.
#include <hyper_parallel/runtime/errors.h>

#include <cstdint>
#include <vector>

namespace hyper_parallel {

// `rows_of(p, j)`: row j of rank p's published sizes, rows sent to rank j for j < g, rows
// expected from rank j - g after; `ranks`: the group's global ranks.
template <class RowsOf>
void check_split_agreement(int64_t g, const std::vector<int64_t>& ranks, const RowsOf& rows_of) {
  for (int64_t p = 0; p < g; ++p)
    for (int64_t q = 0; q < g; ++q) {
      const int64_t sent = rows_of(p, q), expected = rows_of(q, g + p);
      HP_CHECK_T(c10::ValueError, sent == expected, "hyper_parallel::all_to_all_single: rank ", ranks[static_cast<size_t>(p)], " sends ",
                 sent, " rows to rank ", ranks[static_cast<size_t>(q)], ", which expects ", expected,
                 " (output_split_sizes must equal the peers' input_split_sizes)");
    }
}

}  // namespace hyper_parallel
