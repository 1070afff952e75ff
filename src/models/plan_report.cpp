#include <hyper_parallel/models/plan.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <sstream>

namespace hyper_parallel {
namespace models {
namespace {

// HF's torch_dtype names.
std::string dtype_label(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    default: return c10::toString(t);
  }
}

std::string human(int64_t b) {
  char buf[32];
  const double v = static_cast<double>(b);
  if (b < 1024) std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(b));
  else if (b < (int64_t{1} << 20)) std::snprintf(buf, sizeof buf, "%.1f KiB", v / 1024);
  else if (b < (int64_t{1} << 30)) std::snprintf(buf, sizeof buf, "%.1f MiB", v / (1 << 20));
  else std::snprintf(buf, sizeof buf, "%.2f GiB", v / (1 << 30));
  return buf;
}

}  // namespace

std::string PlanReport::to_table() const {
  std::ostringstream os;
  if (options.qwen3_5) {
    const qwen3_5::Config& c = *options.qwen3_5;
    int64_t full = 0;
    for (bool f : c.full_attention) full += f ? 1 : 0;
    os << "plan: Qwen3.5 " << c.num_layers << " layers (" << c.num_layers - full << " Gated DeltaNet, " << full << " gated attention), hidden "
       << c.hidden_size << ", " << c.num_heads << "/" << c.num_kv_heads << " heads, " << c.linear_num_key_heads << "/" << c.linear_num_value_heads
       << " linear key/value heads, " << dtype_label(c.dtype) << "; mesh";
  } else {
    const qwen3::Config& c = options.config;
    os << "plan: Qwen3" << (c.is_moe() ? "-MoE " : " ") << c.num_layers << " layers, hidden " << c.hidden_size << ", " << c.num_heads << "/"
       << c.num_kv_heads << " heads, ";
    if (c.is_moe()) os << c.num_experts << " experts (top-" << c.num_experts_per_tok << ", " << c.moe_intermediate_size << " wide), ";
    os << dtype_label(c.dtype) << "; mesh";
  }
  for (const auto& [n, s] : options.mesh) os << " " << n << "=" << s;
  os << " (" << world_size << " ranks)" << (options.sequence_parallel ? ", sequence parallel" : "") << (options.loss_parallel ? ", loss parallel" : "")
     << (options.mixed_precision ? ", mixed precision " + dtype_label(*options.mixed_precision) + "/float32" : std::string())
     << ", activation checkpointing " << options.activation_checkpointing.to_string() << "; batch "
     << options.batch << " x seq " << options.seq << " per dp rank; rank " << options.rank << "\n";
  char line[160];
  const auto row = [&](const char* what, int64_t b) {
    std::snprintf(line, sizeof line, "  %-24s %14s  (%lld)\n", what, human(b).c_str(), static_cast<long long>(b));
    os << line;
  };
  if (num_stages > 1) {
    std::snprintf(line, sizeof line, "pipeline: stage %lld of %lld, %s, %lld microbatches (%lld in flight here), bubble %.4f\n",
                  static_cast<long long>(stage), static_cast<long long>(num_stages), options.schedule.c_str(),
                  static_cast<long long>(options.microbatches), static_cast<long long>(microbatches_in_flight), bubble_fraction);
    os << line;
  }
  if (cp > 1) {
    if (linear_cp_mode.empty())
      std::snprintf(line, sizeof line, "context parallel: cp %lld, %s attention, %lld of %lld positions per rank (head-tail)\n",
                    static_cast<long long>(cp), cp_mode.c_str(), static_cast<long long>(options.seq / cp), static_cast<long long>(options.seq));
    else
      std::snprintf(line, sizeof line,
                    "context parallel: cp %lld, %s attention, %s Gated DeltaNet, %lld of %lld positions per rank (contiguous)\n",
                    static_cast<long long>(cp), cp_mode.c_str(), linear_cp_mode.c_str(), static_cast<long long>(options.seq / cp),
                    static_cast<long long>(options.seq));
    os << line;
  }
  os << "memory per rank:\n";
  row("parameters", param_bytes);
  if (kv_replica_bytes > 0) row("  of which KV replicas", kv_replica_bytes);
  row("gradients", grad_bytes);
  if (gdn_state_bytes > 0) row("Gated DeltaNet states (per microbatch)", gdn_state_bytes);
  row(optimizer_dtype_row().c_str(), optimizer_bytes);
  if (num_stages > 1) {
    row("saved per microbatch", microbatch_saved_bytes);
    row("p2p per microbatch", p2p_bytes_per_microbatch);
  }
  row("activation peak", activation_peak_bytes);
  row("step peak (all of it)", step_peak_bytes);
  os << "communication per step:\n";
  std::snprintf(line, sizeof line, "  %-10s %-16s %-9s %6s %14s %14s\n", "mesh_dim", "collective", "phase", "count", "bytes",
                "full_bytes");
  os << line;
  for (const CommEntry& e : comm) {
    std::snprintf(line, sizeof line, "  %-10s %-16s %-9s %6lld %14s %14s\n", e.mesh_dim.c_str(), e.collective.c_str(),
                  e.phase.c_str(), static_cast<long long>(e.count), human(e.bytes).c_str(), human(e.full_bytes).c_str());
    os << line;
  }
  std::snprintf(line, sizeof line, "%s in %.2f s\n", measured ? "measured (a real run on the CPU)" : "planned", seconds);
  os << line;
  return os.str();
}

std::string PlanReport::optimizer_dtype_row() const {
  return "optimizer (Adam, " + dtype_label(options.optimizer_dtype) + ")";
}

std::string PlanReport::to_json() const {
  nlohmann::json j;
  j["world_size"] = world_size;
  j["rank"] = options.rank;
  nlohmann::json mesh = nlohmann::json::object();
  for (const auto& [n, s] : options.mesh) mesh[n] = s;
  j["mesh"] = mesh;
  j["sequence_parallel"] = options.sequence_parallel;
  j["loss_parallel"] = options.loss_parallel;
  j["mixed_precision"] = options.mixed_precision ? dtype_label(*options.mixed_precision) : "none";
  j["activation_checkpointing"] = options.activation_checkpointing.to_string();
  j["batch"] = options.batch;
  j["seq"] = options.seq;
  j["model"] = options.qwen3_5 ? "qwen3_5" : options.config.is_moe() ? "qwen3_moe" : "qwen3";
  j["dtype"] = dtype_label(options.qwen3_5 ? options.qwen3_5->dtype : options.config.dtype);
  j["optimizer_dtype"] = dtype_label(options.optimizer_dtype);
  j["param_bytes"] = param_bytes;
  j["kv_replica_bytes"] = kv_replica_bytes;
  j["grad_bytes"] = grad_bytes;
  j["optimizer_bytes"] = optimizer_bytes;
  j["activation_peak_bytes"] = activation_peak_bytes;
  j["step_peak_bytes"] = step_peak_bytes;
  nlohmann::json list = nlohmann::json::array();
  for (const CommEntry& e : comm)
    list.push_back({{"mesh_dim", e.mesh_dim}, {"collective", e.collective}, {"phase", e.phase}, {"count", e.count},
                    {"bytes", e.bytes}, {"full_bytes", e.full_bytes}});
  j["comm"] = list;
  if (num_stages > 1) {
    j["pipeline"] = {{"stage", stage}, {"num_stages", num_stages}, {"schedule", options.schedule}, {"microbatches", options.microbatches},
                     {"microbatches_in_flight", microbatches_in_flight}, {"microbatch_saved_bytes", microbatch_saved_bytes},
                     {"p2p_bytes_per_microbatch", p2p_bytes_per_microbatch}, {"bubble_fraction", bubble_fraction}};
  }
  if (cp > 1) {
    j["context_parallel"] = {{"cp", cp}, {"mode", cp_mode}, {"positions_per_rank", options.seq / cp}};
    if (!linear_cp_mode.empty()) j["context_parallel"]["linear_mode"] = linear_cp_mode;
  }
  if (gdn_state_bytes > 0) j["gdn_state_bytes"] = gdn_state_bytes;
  j["seconds"] = seconds;
  j["measured"] = measured;
  return j.dump(2);
}

}  // namespace models
}  // namespace hyper_parallel
