// The schedules' per-rank orders and their simulation with unit costs.
#include <hyper_parallel/pipelining/schedule_order.h>

#include <hyper_parallel/runtime/errors.h>

#include <algorithm>

namespace hyper_parallel {

ScheduleKind schedule_kind(const std::string& name) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (n == "gpipe") return ScheduleKind::GPipe;
  if (n == "1f1b") return ScheduleKind::OneFOneB;
  if (n == "interleaved_1f1b" || n == "interleaved1f1b") return ScheduleKind::Interleaved1F1B;
  HP_CHECK_T(c10::ValueError, false, "hyper_parallel::schedule_kind: unknown pipeline schedule '", name,
             "'; known: gpipe, 1f1b, interleaved_1f1b");
  return ScheduleKind::GPipe;
}

std::string schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::GPipe: return "gpipe";
    case ScheduleKind::OneFOneB: return "1f1b";
    case ScheduleKind::Interleaved1F1B: return "interleaved_1f1b";
  }
  return "?";
}

std::vector<std::vector<PipelineAction>> pipeline_order(ScheduleKind kind, int64_t p, int64_t m, int64_t v) {
  HP_CHECK_T(c10::ValueError, p >= 1 && m >= 1 && v >= 1, "hyper_parallel::pipeline_order: ranks (", p, "), microbatches (", m,
             ") and virtual stages (", v, ") must be at least 1");
  HP_CHECK_T(c10::ValueError, v == 1 || kind == ScheduleKind::Interleaved1F1B, "hyper_parallel::pipeline_order: ", schedule_name(kind),
             " runs one stage per rank; ", v, " virtual stages need interleaved_1f1b");
  using K = PipelineAction::Kind;
  std::vector<std::vector<PipelineAction>> order(static_cast<size_t>(p));
  for (int64_t r = 0; r < p; ++r) {
    auto& o = order[static_cast<size_t>(r)];
    if (kind == ScheduleKind::GPipe) {
      for (int64_t i = 0; i < m; ++i) o.push_back({r, K::forward, i});
      for (int64_t i = 0; i < m; ++i) o.push_back({r, K::backward, i});
      continue;
    }
    if (kind == ScheduleKind::OneFOneB) {
      // p - r - 1 forwards fill the pipeline below this rank; then one forward, one backward.
      const int64_t warmup = std::min(m, p - r - 1);
      for (int64_t i = 0; i < warmup; ++i) o.push_back({r, K::forward, i});
      for (int64_t i = 0; i < m - warmup; ++i) {
        o.push_back({r, K::forward, warmup + i});
        o.push_back({r, K::backward, i});
      }
      for (int64_t i = m - warmup; i < m; ++i) o.push_back({r, K::backward, i});
      continue;
    }
    // Interleaved: the k-th forward of this rank runs chunk (k / per_round) % v on microbatch
    // round * per_round + k % per_round; backwards walk the chunks in reverse (Megatron-LM's
    // order with rounds as PyTorch's ScheduleInterleaved1F1B).
    const int64_t rounds = std::max<int64_t>(1, m / p);
    HP_CHECK_T(c10::ValueError, m % rounds == 0, "hyper_parallel::pipeline_order: interleaved_1f1b runs ", m, " microbatches in ",
               rounds, " rounds of equal size over ", p, " ranks; use a microbatch count <= ", p, " or a multiple of ", p);
    const int64_t per_round = m / rounds, total = m * v;
    auto at = [&](int64_t k, bool forward) {
      const int64_t chunk_in_round = (k % (per_round * v)) / per_round;
      const int64_t chunk = forward ? chunk_in_round : v - 1 - chunk_in_round;
      const int64_t mb = (k / (per_round * v)) * per_round + k % per_round;
      return PipelineAction{chunk * p + r, forward ? K::forward : K::backward, mb};
    };
    const int64_t warmup = std::min(total, (v - 1) * per_round + 2 * (p - 1 - r));
    for (int64_t k = 0; k < warmup; ++k) o.push_back(at(k, true));
    for (int64_t i = 0; i < total - warmup; ++i) {
      o.push_back(at(warmup + i, true));
      o.push_back(at(i, false));
    }
    for (int64_t k = total - warmup; k < total; ++k) o.push_back(at(k, false));
  }
  return order;
}

ScheduleTimeline simulate_schedule(const std::vector<std::vector<PipelineAction>>& order, int64_t m, int64_t v, double forward_cost,
                                   double backward_cost) {
  const int64_t p = static_cast<int64_t>(order.size());
  HP_CHECK_T(c10::ValueError, p >= 1 && m >= 1 && v >= 1, "hyper_parallel::simulate_schedule: needs at least one rank, microbatch and stage");
  const int64_t stages = p * v;
  // Finish times; < 0: not run yet.
  std::vector<double> fwd(static_cast<size_t>(stages * m), -1), bwd(static_cast<size_t>(stages * m), -1);
  auto slot = [&](int64_t s, int64_t mb) { return static_cast<size_t>(s * m + mb); };
  ScheduleTimeline t;
  t.busy.assign(static_cast<size_t>(p), 0);
  t.max_in_flight.assign(static_cast<size_t>(p), 0);
  std::vector<double> free_at(static_cast<size_t>(p), 0);
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::vector<int64_t> in_flight(static_cast<size_t>(p), 0);
  for (const auto& o : order)
    for (const PipelineAction& a : o)
      HP_CHECK_T(c10::ValueError, a.stage_index >= 0 && a.stage_index < stages && a.microbatch >= 0 && a.microbatch < m,
                 "hyper_parallel::simulate_schedule: action of stage ", a.stage_index, ", microbatch ", a.microbatch,
                 " is outside ", stages, " stages and ", m, " microbatches");
  for (bool progress = true; progress;) {
    progress = false;
    for (int64_t r = 0; r < p; ++r) {
      const auto& o = order[static_cast<size_t>(r)];
      auto& i = next[static_cast<size_t>(r)];
      while (i < o.size()) {
        const PipelineAction& a = o[i];
        double ready = 0;
        if (a.kind == PipelineAction::Kind::forward) {
          if (a.stage_index > 0) ready = fwd[slot(a.stage_index - 1, a.microbatch)];
        } else {
          // Its own forward, and the gradient from the next stage (the last stage has its loss).
          const double own = fwd[slot(a.stage_index, a.microbatch)];
          const double grad = a.stage_index + 1 < stages ? bwd[slot(a.stage_index + 1, a.microbatch)] : 0.0;
          ready = own < 0 || grad < 0 ? -1 : std::max(own, grad);
        }
        if (ready < 0) break;
        const bool forward = a.kind == PipelineAction::Kind::forward;
        const double cost = forward ? forward_cost : backward_cost;
        const double start = std::max(free_at[static_cast<size_t>(r)], ready);
        free_at[static_cast<size_t>(r)] = start + cost;
        (forward ? fwd : bwd)[slot(a.stage_index, a.microbatch)] = start + cost;
        t.busy[static_cast<size_t>(r)] += cost;
        in_flight[static_cast<size_t>(r)] += forward ? 1 : -1;
        t.max_in_flight[static_cast<size_t>(r)] = std::max(t.max_in_flight[static_cast<size_t>(r)], in_flight[static_cast<size_t>(r)]);
        ++i;
        progress = true;
      }
    }
  }
  std::string stuck;
  for (int64_t r = 0; r < p; ++r) {
    const auto& o = order[static_cast<size_t>(r)];
    const size_t i = next[static_cast<size_t>(r)];
    if (i < o.size())
      stuck += c10::str(stuck.empty() ? "" : "; ", "rank ", r, " at ", o[i].kind == PipelineAction::Kind::forward ? "F" : "B",
                        " of stage ", o[i].stage_index, ", microbatch ", o[i].microbatch);
  }
  HP_CHECK_T(c10::ValueError, stuck.empty(), "hyper_parallel::simulate_schedule: the order deadlocks: ", stuck);
  t.makespan = *std::max_element(free_at.begin(), free_at.end());
  for (int64_t r = 0; r < p; ++r) t.idle_fraction.push_back(t.makespan > 0 ? 1.0 - t.busy[static_cast<size_t>(r)] / t.makespan : 0.0);
  return t;
}

double bubble_fraction(ScheduleKind kind, int64_t p, int64_t m, int64_t v) {
  HP_CHECK_T(c10::ValueError, p >= 1 && m >= 1 && v >= 1, "hyper_parallel::bubble_fraction: ranks, microbatches and virtual stages must be at least 1");
  const double pm1 = static_cast<double>(p - 1);
  if (kind == ScheduleKind::Interleaved1F1B) return pm1 / (static_cast<double>(v * m) + pm1);
  return pm1 / (static_cast<double>(m) + pm1);
}

}  // namespace hyper_parallel
