#pragma once
// parallelize_module: applies styles to a module tree.
#include <c10/util/Optional.h>

#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <hyper_parallel/tensor_parallel/style.h>

namespace hyper_parallel {

/// One plan entry: a module path (FQN with fnmatch wildcards per '.'-separated atom, e.g.
/// "layers.*.attn.q_proj") and the style for the modules it matches.
struct PlanEntry {
  template <class Style, class = std::enable_if_t<std::is_base_of_v<ParallelStyle, std::decay_t<Style>>>>
  PlanEntry(std::string path, Style&& style)
      : path(std::move(path)), style(std::make_shared<std::decay_t<Style>>(std::forward<Style>(style))) {}
  PlanEntry(std::string path, std::shared_ptr<ParallelStyle> style) : path(std::move(path)), style(std::move(style)) {}
  std::string path;
  std::shared_ptr<ParallelStyle> style;
};

/// A style for the root module, or an ordered {path: style} plan.
/// e.g. `ParallelizePlan(ColwiseParallel())` or `{{"attn.q_proj", ColwiseParallel()}, {"attn.o_proj", RowwiseParallel()}}`.
class ParallelizePlan {
 public:
  template <class Style, class = std::enable_if_t<std::is_base_of_v<ParallelStyle, std::decay_t<Style>>>>
  /* implicit */ ParallelizePlan(Style&& style)
      : single_(std::make_shared<std::decay_t<Style>>(std::forward<Style>(style))), is_single_(true) {}
  template <class Style, class = std::enable_if_t<std::is_base_of_v<ParallelStyle, Style>>>
  /* implicit */ ParallelizePlan(std::shared_ptr<Style> style) : single_(std::move(style)), is_single_(true) {}
  /* implicit */ ParallelizePlan(std::initializer_list<PlanEntry> entries) : entries_(entries) {}
  /* implicit */ ParallelizePlan(std::vector<PlanEntry> entries) : entries_(std::move(entries)) {}

  bool is_single() const { return is_single_; }
  /// The single style (shared: parallelize_module writes src_data_rank into it, as the seed's
  /// Python does into the object it is given).
  const std::shared_ptr<ParallelStyle>& style() const { return single_; }
  const std::vector<PlanEntry>& entries() const { return entries_; }

 private:
  std::shared_ptr<ParallelStyle> single_;
  bool is_single_ = false;
  std::vector<PlanEntry> entries_;
};

/// Applies `parallelize_plan` to `module` on the 1-D `device_mesh` (or the current MeshScope's
/// mesh when nullopt), writing `src_data_rank` into every style first. The whole plan is
/// validated before anything changes (types, paths, module kinds, hookability, divisibility),
/// so a failure leaves the module as it was. Errors: an N-D mesh -> c10::ValueError
/// naming device_mesh["tp"]; a null style -> c10::TypeError; an empty path or empty atom ->
/// c10::ValueError (the seed's case A4; PyTorch takes "" as the module itself); a path that
/// matches nothing -> a warning, skipped; no plan -> a warning and the module unchanged. A tied parameter
/// stays one parameter when its owners get the same layout, is refused when they get different
/// ones, and leaves the tie (a warning) for an owner no style lays out, as in PyTorch.
/// e.g. `hp::parallelize_module(*model, tp, {{"layers.*.mlp.gate_proj", hp::ColwiseParallel()}});`
torch::nn::Module& parallelize_module(torch::nn::Module& module, const c10::optional<DeviceMesh>& device_mesh,
                                      const ParallelizePlan& parallelize_plan, c10::optional<int64_t> src_data_rank = 0);
/// Without a plan (seed A12): warns and returns the module unchanged.
torch::nn::Module& parallelize_module(torch::nn::Module& module,
                                      const c10::optional<DeviceMesh>& device_mesh = c10::nullopt);


}  // namespace hyper_parallel
