#pragma once
// A pipeline stage (PyTorch's torch.distributed.pipelining.PipelineStage): one contiguous part of
// a model on one rank of the pipeline group, and the transfers that connect it to its neighbours.
// The schedules (pipelining/schedules.h) drive it one microbatch at a time.
#include <ATen/core/Tensor.h>

#include <hyper_parallel/mesh/device_mesh.h>
#include <hyper_parallel/nn/module.h>
#include <hyper_parallel/runtime/collectives.h>
#include <hyper_parallel/runtime/process_group.h>

#include <map>
#include <memory>
#include <vector>

namespace hyper_parallel {

/// Options of PipelineStage.
struct PipelineStageOptions {
  /// The (global) shape of one microbatch's input, when declared (PyTorch's input_args): what
  /// the previous stage sends is checked against it. Empty: taken from what arrives, per step.
  std::vector<int64_t> input_shape;
  /// Where DTensors that cross this stage's boundaries are rebuilt (the stage's tensor-parallel
  /// sub-mesh): a DTensor output travels as its local shard with its placements and global shape.
  DeviceMesh device_mesh;
};

/// Stage `stage_index` of `num_stages`: `submodule`'s one-tensor forward (call_tensor, with its
/// hooks, so FSDP and activation checkpointing apply) maps the previous stage's output (the
/// first stage: the inputs) to this stage's output (the last stage: what the loss takes). The
/// stages are spread over `group` (the pipeline group) as PyTorch's loop placement: stage s lives
/// on group rank s % group.size(), so a rank holds num_stages / group.size() stages.
/// e.g. `hp::PipelineStage stage(model.ptr(), pp_rank, pp, mesh.get_group("pp"));`
class PipelineStage {
 public:
  PipelineStage(std::shared_ptr<nn::Module> submodule, int64_t stage_index, int64_t num_stages, Group group,
                PipelineStageOptions options = {});
  ~PipelineStage();
  PipelineStage(const PipelineStage&) = delete;
  PipelineStage& operator=(const PipelineStage&) = delete;

  int64_t stage_index() const { return stage_index_; }
  int64_t num_stages() const { return num_stages_; }
  bool is_first() const { return stage_index_ == 0; }
  bool is_last() const { return stage_index_ + 1 == num_stages_; }
  nn::Module& submod() const { return *submodule_; }
  const Group& group() const { return group_; }
  /// The group rank that holds stage `stage`.
  int64_t rank_of(int64_t stage) const { return stage % group_.size(); }

  // Called by the schedules, in a valid order, on every stage of the step.

  /// Starts a step of `num_microbatches`.
  void begin_step(int64_t num_microbatches);
  /// Runs microbatch `mb` forward: the first stage on `input`, the others on what the previous
  /// stage sent. Sends the output on (except from the last stage) and returns it.
  at::Tensor forward_one_chunk(int64_t mb, const at::Tensor& input = at::Tensor());
  /// Runs microbatch `mb` backward: the last stage from `loss` (already scaled), the others from
  /// the gradient the next stage sent; sends the input gradient back (except from the first).
  /// The last backward of the step lets FSDP reduce the accumulated gradients (once per step).
  void backward_one_chunk(int64_t mb, const at::Tensor& loss = at::Tensor());
  /// Waits for every transfer this stage issued in the step and drops what it kept.
  void end_step();

  /// How many microbatches have run forward and not yet backward (their activations are kept).
  int64_t microbatches_in_flight() const { return static_cast<int64_t>(outputs_.size()); }

 private:
  struct Boundary;  // the layout of what crosses a boundary (shape, dtype, DTensor spec)
  at::Tensor receive_input(int64_t mb);
  void send_output(int64_t mb, const at::Tensor& output);
  int64_t tag(int64_t receiver, int dir, int64_t mb) const;

  std::shared_ptr<nn::Module> submodule_;
  int64_t stage_index_, num_stages_;
  Group group_;
  PipelineStageOptions options_;
  int64_t num_microbatches_ = 0, backwards_done_ = 0;
  bool fully_sharded_ = false;
  c10::Device device_{c10::kCPU};
  std::unique_ptr<Boundary> input_layout_, output_layout_;
  std::map<int64_t, at::Tensor> inputs_, outputs_;  // per microbatch, until its backward
  std::vector<Work> sends_;
};

}  // namespace hyper_parallel
