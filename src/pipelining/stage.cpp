// A pipeline stage: one microbatch forward and backward, and the transfers to the neighbours.
// Each step, the first microbatch's activation is preceded by a small message that describes
// it (shape, dtype, DTensor placements), so the receiver allocates its buffers from it and
// checks it against what it declared; gradients have the shape of the output they belong to.
#include <hyper_parallel/pipelining/stage.h>

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/fsdp/fully_shard.h>
#include <hyper_parallel/runtime/errors.h>
#include <hyper_parallel/runtime/point_to_point.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

namespace hyper_parallel {
namespace {

constexpr int64_t kMaxBoundaryDims = 8, kMaxMeshDims = 4, kMetaLength = 2 + 2 * kMaxBoundaryDims + 1 + kMaxMeshDims;
// Tags: (receiving stage, direction, microbatch + 1); slot 0 carries the description.
constexpr int64_t kMaxMicrobatches = 4096;
constexpr int kForward = 0, kBackward = 1;

int64_t placement_code(const Placement& p) {
  if (p.is_shard()) return p.dim();
  if (p.is_replicate()) return -1;
  return -2 - static_cast<int64_t>(p.reduce_op());
}
Placement placement_of(int64_t code) {
  if (code >= 0) return Shard(code);
  if (code == -1) return Replicate();
  return Partial(static_cast<ReduceOp>(-2 - code));
}

}  // namespace

struct PipelineStage::Boundary {
  std::vector<int64_t> shape, local_shape;
  at::ScalarType dtype = at::kFloat;
  Placements placements;  // empty: a plain tensor

  static Boundary of(const at::Tensor& t) {
    Boundary b;
    b.shape = t.sizes().vec();
    b.dtype = t.scalar_type();
    if (is_dtensor(t)) {
      DTensor d(t);
      b.placements = d.placements();
      b.local_shape = d.to_local().sizes().vec();
    } else {
      b.local_shape = b.shape;
    }
    return b;
  }
  at::Tensor encode(int64_t stage) const {
    HP_CHECK_T(c10::ValueError, static_cast<int64_t>(shape.size()) <= kMaxBoundaryDims && static_cast<int64_t>(placements.size()) <= kMaxMeshDims,
               "hyper_parallel::PipelineStage: stage ", stage, " outputs a tensor of ", shape.size(), " dims on a ", placements.size(),
               "-D mesh; a stage boundary carries at most ", kMaxBoundaryDims, " dims and ", kMaxMeshDims, " mesh dims");
    std::vector<int64_t> m(static_cast<size_t>(kMetaLength), 0);
    m[0] = static_cast<int64_t>(shape.size());
    m[1] = static_cast<int64_t>(placements.size());
    for (size_t i = 0; i < shape.size(); ++i) {
      m[2 + i] = shape[i];
      m[2 + kMaxBoundaryDims + i] = local_shape[i];
    }
    m[2 + 2 * kMaxBoundaryDims] = static_cast<int64_t>(dtype);
    for (size_t i = 0; i < placements.size(); ++i) m[3 + 2 * kMaxBoundaryDims + i] = placement_code(placements[i]);
    return at::tensor(m, at::kLong);
  }
  static Boundary decode(const at::Tensor& meta) {
    const int64_t* m = meta.data_ptr<int64_t>();
    Boundary b;
    b.shape.assign(m + 2, m + 2 + m[0]);
    b.local_shape.assign(m + 2 + kMaxBoundaryDims, m + 2 + kMaxBoundaryDims + m[0]);
    b.dtype = static_cast<at::ScalarType>(m[2 + 2 * kMaxBoundaryDims]);
    for (int64_t i = 0; i < m[1]; ++i) b.placements.push_back(placement_of(m[3 + 2 * kMaxBoundaryDims + i]));
    return b;
  }
  std::string describe() const {
    return c10::str(dtype, c10::IntArrayRef(shape), placements.empty() ? "" : " " + to_string(placements));
  }
};

PipelineStage::PipelineStage(std::shared_ptr<nn::Module> submodule, int64_t stage_index, int64_t num_stages, Group group,
                             PipelineStageOptions options)
    : submodule_(std::move(submodule)), stage_index_(stage_index), num_stages_(num_stages), group_(std::move(group)),
      options_(std::move(options)) {
  HP_CHECK_T(c10::ValueError, submodule_ != nullptr, "hyper_parallel::PipelineStage: the submodule is null");
  HP_CHECK_T(c10::ValueError, group_.defined() && group_.size() >= 2, "hyper_parallel::PipelineStage: the pipeline group needs at least 2 ranks",
             group_.defined() ? c10::str(", got ", group_.size()) : std::string(", got an undefined group"),
             " (with one rank, run the model without stages)");
  HP_CHECK_T(c10::ValueError, num_stages_ >= group_.size() && num_stages_ % group_.size() == 0, "hyper_parallel::PipelineStage: ",
             num_stages_, " stages do not spread evenly over the pipeline group's ", group_.size(), " ranks");
  HP_CHECK_T(c10::ValueError, stage_index_ >= 0 && stage_index_ < num_stages_, "hyper_parallel::PipelineStage: stage_index ", stage_index_,
             " is outside 0 .. ", num_stages_ - 1);
  HP_CHECK_T(c10::ValueError, rank_of(stage_index_) == group_.rank(), "hyper_parallel::PipelineStage: stage ", stage_index_,
             " belongs on pipeline rank ", rank_of(stage_index_), " (stage % ", group_.size(), "), but this is pipeline rank ", group_.rank());
  HP_CHECK_T(c10::ValueError, num_stages_ * 2 * (kMaxMicrobatches + 1) < (int64_t{1} << 31), "hyper_parallel::PipelineStage: ",
             num_stages_, " stages are too many to tag their transfers");
  fully_sharded_ = has_fully_shard(*submodule_);
  // Activations arrive on the device the stage's parameters live on.
  for (const at::Tensor& p : submodule_->parameters()) {
    device_ = local_tensor(p).device();
    break;
  }
}

PipelineStage::~PipelineStage() = default;

int64_t PipelineStage::tag(int64_t receiver, int dir, int64_t mb) const {
  return (receiver * 2 + dir) * (kMaxMicrobatches + 1) + mb + 1;
}

void PipelineStage::begin_step(int64_t num_microbatches) {
  HP_CHECK_T(c10::ValueError, num_microbatches >= 1 && num_microbatches <= kMaxMicrobatches, "hyper_parallel::PipelineStage: ",
             num_microbatches, " microbatches; a step runs 1 .. ", kMaxMicrobatches);
  num_microbatches_ = num_microbatches;
  backwards_done_ = 0;
  inputs_.clear();
  outputs_.clear();
  sends_.clear();
}

at::Tensor PipelineStage::receive_input(int64_t mb) {
  const int64_t from = rank_of(stage_index_ - 1);
  if (mb == 0 || !input_layout_) {
    at::Tensor meta = at::empty({kMetaLength}, at::kLong);
    recv(meta, from, group_, tag(stage_index_, kForward, -1));
    input_layout_ = std::make_unique<Boundary>(Boundary::decode(meta));
    const Boundary& b = *input_layout_;
    HP_CHECK_T(c10::ValueError, options_.input_shape.empty() || options_.input_shape == b.shape, "hyper_parallel::PipelineStage: stage ",
               stage_index_, " declared inputs of shape ", c10::IntArrayRef(options_.input_shape), " (input_shape), but stage ",
               stage_index_ - 1, " sends ", b.describe());
    HP_CHECK_T(c10::ValueError, b.placements.empty() || options_.device_mesh.defined(), "hyper_parallel::PipelineStage: stage ",
               stage_index_ - 1, " sends a DTensor (", b.describe(), ") but stage ", stage_index_,
               " has no device_mesh to rebuild it on (PipelineStageOptions::device_mesh)");
    HP_CHECK_T(c10::ValueError, b.placements.empty() || static_cast<int64_t>(b.placements.size()) == options_.device_mesh.ndim(),
               "hyper_parallel::PipelineStage: stage ", stage_index_ - 1, " sends a DTensor on a ", b.placements.size(),
               "-D mesh, but stage ", stage_index_, "'s device_mesh is ", options_.device_mesh.ndim(), "-D");
  }
  const Boundary& b = *input_layout_;
  // A leaf of this stage's graph: its gradient is what goes back to the previous stage.
  at::Tensor local = at::empty(b.local_shape, at::TensorOptions().dtype(b.dtype).device(device_));
  recv(local, from, group_, tag(stage_index_, kForward, mb));
  local.requires_grad_(at::isFloatingType(b.dtype));
  inputs_[mb] = local;
  if (b.placements.empty()) return local;
  return DTensor::from_local(local, options_.device_mesh, b.placements, /*run_check=*/false, c10::IntArrayRef(b.shape));
}

void PipelineStage::send_output(int64_t mb, const at::Tensor& output) {
  const int64_t to = rank_of(stage_index_ + 1);
  const Boundary now = Boundary::of(output);
  if (mb == 0 || !output_layout_) {
    output_layout_ = std::make_unique<Boundary>(now);
    sends_.push_back(isend(output_layout_->encode(stage_index_), to, group_, tag(stage_index_ + 1, kForward, -1)));
  }
  HP_CHECK_T(c10::ValueError, now.shape == output_layout_->shape && now.dtype == output_layout_->dtype &&
                                  now.placements == output_layout_->placements,
             "hyper_parallel::PipelineStage: stage ", stage_index_, " output ", now.describe(), " for microbatch ", mb,
             " but ", output_layout_->describe(), " for microbatch 0; the microbatches of a step must have one shape");
  sends_.push_back(isend(local_tensor(output).detach().contiguous(), to, group_, tag(stage_index_ + 1, kForward, mb)));
}

at::Tensor PipelineStage::forward_one_chunk(int64_t mb, const at::Tensor& input) {
  HP_CHECK_T(c10::ValueError, mb >= 0 && mb < num_microbatches_, "hyper_parallel::PipelineStage: microbatch ", mb,
             " is outside this step's ", num_microbatches_, " (call begin_step first)");
  HP_CHECK_T(c10::ValueError, is_first() == input.defined(), "hyper_parallel::PipelineStage: stage ", stage_index_,
             is_first() ? " is the first and needs the microbatch's input" : " takes its input from the previous stage, not from the caller");
  const at::Tensor x = is_first() ? input : receive_input(mb);
  at::Tensor out = submodule_->call_tensor(x);
  if (!is_last()) send_output(mb, out);
  outputs_[mb] = out;
  return out;
}

void PipelineStage::backward_one_chunk(int64_t mb, const at::Tensor& loss) {
  const auto it = outputs_.find(mb);
  HP_CHECK_T(c10::ValueError, it != outputs_.end(), "hyper_parallel::PipelineStage: stage ", stage_index_, " runs backward of microbatch ",
             mb, " before its forward");
  HP_CHECK_T(c10::ValueError, is_last() == loss.defined(), "hyper_parallel::PipelineStage: stage ", stage_index_,
             is_last() ? " is the last and needs the microbatch's loss" : " takes its gradient from the next stage, not from the caller");
  // FSDP reduces what the step accumulated once, in the last backward (FSDP2's
  // set_requires_gradient_sync over microbatches).
  if (fully_sharded_) set_requires_gradient_sync(*submodule_, backwards_done_ + 1 == num_microbatches_);
  if (is_last()) {
    torch::autograd::backward({loss});
  } else {
    const Boundary& b = *output_layout_;
    at::Tensor grad = at::empty(b.local_shape, at::TensorOptions().dtype(b.dtype).device(local_tensor(it->second).device()));
    recv(grad, rank_of(stage_index_ + 1), group_, tag(stage_index_, kBackward, mb));
    if (!b.placements.empty()) {
      const DTensor out(it->second);
      grad = DTensor::from_local(grad, out.device_mesh(), b.placements, /*run_check=*/false, c10::IntArrayRef(b.shape));
    }
    torch::autograd::backward({it->second}, {grad});
  }
  ++backwards_done_;
  outputs_.erase(it);
  if (!is_first()) {
    at::Tensor input = inputs_.at(mb);
    at::Tensor g = input.grad();
    if (!g.defined()) g = at::zeros_like(input);  // an input the stage did not use
    sends_.push_back(isend(g.detach().contiguous(), rank_of(stage_index_ - 1), group_, tag(stage_index_ - 1, kBackward, mb)));
    inputs_.erase(mb);
  }
}

void PipelineStage::end_step() {
  for (Work& w : sends_) w.wait();
  sends_.clear();
  HP_CHECK_T(c10::ValueError, outputs_.empty(), "hyper_parallel::PipelineStage: stage ", stage_index_, " ends a step with ",
             outputs_.size(), " microbatch(es) that ran forward but not backward");
}

}  // namespace hyper_parallel
