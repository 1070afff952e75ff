// The explicit-redistribution guard and the sharding trace: both describe a decision in the
// compact form of DTensorSpec::short_string.
#include "op_report.h"

#include <hyper_parallel/dtensor/explicit_redistribution.h>
#include <hyper_parallel/runtime/comm_debug_mode.h>
#include <hyper_parallel/runtime/errors.h>

#include <atomic>
#include <mutex>
#include <set>

#include "redistribute.h"

namespace hyper_parallel {
namespace {

// 0: no guard; 1 + Mode otherwise. Process-wide: backward may run on autograd's threads.
std::atomic<int> g_mode{0};

// Each redistributed input: "mat2: f32[16,4] S(0) -> R: all_gather over tp (256 B)".
std::string transitions(const OpInfo& info, const Decision& d) {
  std::string s;
  for (size_t k = 0; k < info.inputs().size(); ++k) {
    if (!d.redistribute[k]) continue;
    const DTensorSpec& in = *info.inputs()[k].spec;
    s += std::string(s.empty() ? "" : "; ") + info.input_name(k) + ": " + short_dtype_name(in.dtype) + " " +
         describe_redistribution(in, d.plans[k]);
  }
  if (!d.implicit_communication.empty()) s += std::string(s.empty() ? "" : "; ") + d.implicit_communication;
  return s;
}

std::string outputs(const Decision& d, const OpInfo& info) {
  std::string s;
  for (size_t r = 0; r < d.outputs.size(); ++r) {
    if (d.written_return_arg[r] >= 0) {
      s += std::string(s.empty() ? "" : ", ") + info.schema().arguments()[static_cast<size_t>(d.written_return_arg[r])].name() +
           " (in place)";
      continue;
    }
    for (const auto& o : d.outputs[r]) s += std::string(s.empty() ? "" : ", ") + (o ? o->short_string() : "None");
  }
  return s;
}

}  // namespace

ExplicitRedistribution::ExplicitRedistribution(Mode mode) : previous_(g_mode.exchange(1 + static_cast<int>(mode))) {}

ExplicitRedistribution::~ExplicitRedistribution() { g_mode.store(previous_); }

c10::optional<ExplicitRedistribution::Mode> ExplicitRedistribution::current() {
  const int m = g_mode.load();
  if (m == 0) return c10::nullopt;
  return static_cast<Mode>(m - 1);
}

void check_explicit_redistribution(const OpInfo& info, const Decision& d) {
  const int m = g_mode.load(std::memory_order_relaxed);
  if (C10_LIKELY(m == 0)) return;
  const std::string what = c10::str(info.describe(), " in ", call_context::describe_current_module(), " (",
                                    call_context::phase(), ") needs an implicit redistribution: ", transitions(info, d));
  if (static_cast<ExplicitRedistribution::Mode>(m - 1) == ExplicitRedistribution::Mode::warn) {
    static std::mutex mutex;
    static std::set<std::string> warned;
    std::lock_guard<std::mutex> lock(mutex);
    if (warned.insert(what).second) TORCH_WARN("hyper_parallel::ExplicitRedistribution: ", what);
    return;
  }
  HP_CHECK_T(c10::Error, false, "hyper_parallel::ExplicitRedistribution: ", what,
             ". Inside the guard only redistributions asked for by name run: redistribute the inputs first "
             "(DTensor::redistribute), or give the module the layouts it needs (a PrepareModuleInput / "
             "PrepareModuleOutput in the plan)");
}

void trace_op(const OpInfo& info, const Decision& d) {
  std::string line = std::string(call_context::in_backward() ? "[backward] " : "") + info.describe() + " -> " + outputs(d, info);
  if (d.any_redistribute) line += "; redistributes " + transitions(info, d);
  CommDebugMode::record_op(line);
}

void trace_redistribute(const DTensorSpec& src, const Placements& dst) {
  const auto steps = plan_redistribute(src.mesh.shape(), src.placements, dst, src.ndim());
  std::string shape;
  for (size_t i = 0; i < src.shape.size(); ++i) shape += (i ? "," : "") + std::to_string(src.shape[i]);
  CommDebugMode::record_op(std::string(call_context::in_backward() ? "[backward] " : "") + "DTensor::redistribute(" +
                           short_dtype_name(src.dtype) + "[" + shape + "]) " + describe_redistribution(src, steps));
}

}  // namespace hyper_parallel
