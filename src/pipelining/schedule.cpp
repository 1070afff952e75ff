// The schedule executor: this rank's actions in order, microbatches split along dim 0.
#include <hyper_parallel/pipelining/schedules.h>

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/runtime/errors.h>

#include <ATen/ATen.h>

#include <algorithm>

namespace hyper_parallel {

PipelineSchedule::PipelineSchedule(std::vector<PipelineStage*> stages, int64_t n_microbatches, PipelineLossFn loss_fn, ScheduleKind kind)
    : stages_(std::move(stages)), n_microbatches_(n_microbatches), loss_fn_(std::move(loss_fn)), kind_(kind) {
  HP_CHECK_T(c10::ValueError, !stages_.empty(), "hyper_parallel::PipelineSchedule: no stage given");
  for (const PipelineStage* s : stages_) HP_CHECK_T(c10::ValueError, s != nullptr, "hyper_parallel::PipelineSchedule: a stage is null");
  HP_CHECK_T(c10::ValueError, n_microbatches_ >= 1, "hyper_parallel::PipelineSchedule: n_microbatches must be at least 1, got ", n_microbatches_);
  HP_CHECK_T(c10::ValueError, static_cast<bool>(loss_fn_), "hyper_parallel::PipelineSchedule: loss_fn is empty");
  const PipelineStage& first = *stages_.front();
  const int64_t p = first.group().size(), v = static_cast<int64_t>(stages_.size());
  HP_CHECK_T(c10::ValueError, v == 1 || kind_ == ScheduleKind::Interleaved1F1B, "hyper_parallel::PipelineSchedule: ", schedule_name(kind_), " runs one stage per rank, got ", v);
  HP_CHECK_T(c10::ValueError, first.num_stages() == p * v, "hyper_parallel::PipelineSchedule: the model has ", first.num_stages(), " stages, but ", v,
             " on each of the pipeline group's ", p, " ranks make ", p * v);
  for (int64_t i = 0; i < v; ++i) {
    const PipelineStage& s = *stages_[static_cast<size_t>(i)];
    HP_CHECK_T(c10::ValueError, s.group() == first.group() && s.num_stages() == first.num_stages(), "hyper_parallel::PipelineSchedule: "
               "every stage must be on one pipeline group and one stage count");
    HP_CHECK_T(c10::ValueError, s.stage_index() == first.group().rank() + i * p, "hyper_parallel::PipelineSchedule: this rank (pipeline rank ", first.group().rank(),
               ") holds stages ", first.group().rank(), ", ", first.group().rank() + p, ", ... in order; got stage ", s.stage_index(),
               " at position ", i);
  }
  actions_ = pipeline_order(kind_, p, n_microbatches_, v)[static_cast<size_t>(first.group().rank())];
}

at::Tensor PipelineSchedule::step(const at::Tensor& input, const at::Tensor& target, std::vector<at::Tensor>* losses) {
  const int64_t m = n_microbatches_, p = stages_.front()->group().size();
  auto stage_at = [&](int64_t index) -> PipelineStage& { return *stages_[static_cast<size_t>(index / p)]; };
  const bool has_first = stages_.front()->is_first(), has_last = stages_.back()->is_last();
  auto split = [&](const at::Tensor& t, const char* what, bool needed) {
    HP_CHECK_T(c10::ValueError, t.defined() == needed, "hyper_parallel::PipelineSchedule::step: this rank ",
               needed ? "holds" : "does not hold", " the ", std::string(what) == "input" ? "first" : "last", " stage, so `", what, "` must ",
               needed ? "be given" : "be undefined");
    std::vector<at::Tensor> parts;
    if (!needed) return parts;
    HP_CHECK_T(c10::ValueError, t.dim() >= 1 && t.size(0) % m == 0, "hyper_parallel::PipelineSchedule::step: the ", what,
               "'s batch dim (", t.dim() >= 1 ? t.size(0) : 0, ") must split into ", m, " equal microbatches");
    return t.chunk(m, 0);
  };
  const std::vector<at::Tensor> inputs = split(input, "input", has_first), targets = split(target, "target", has_last);
  for (PipelineStage* s : stages_) s->begin_step(m);
  std::vector<at::Tensor> mb_losses(static_cast<size_t>(has_last ? m : 0));
  max_in_flight_ = 0;
  for (const PipelineAction& a : actions_) {
    PipelineStage& s = stage_at(a.stage_index);
    if (a.kind == PipelineAction::Kind::forward) {
      at::Tensor out = s.forward_one_chunk(a.microbatch, s.is_first() ? inputs[static_cast<size_t>(a.microbatch)] : at::Tensor());
      if (s.is_last()) mb_losses[static_cast<size_t>(a.microbatch)] = loss_fn_(out, targets[static_cast<size_t>(a.microbatch)]);
      int64_t held = 0;
      for (const PipelineStage* t : stages_) held += t->microbatches_in_flight();
      max_in_flight_ = std::max(max_in_flight_, held);
    } else {
      // scale_grads: each microbatch's loss counts 1/m, so the gradients are the batch mean's.
      s.backward_one_chunk(a.microbatch,
                           s.is_last() ? mb_losses[static_cast<size_t>(a.microbatch)] / static_cast<double>(m) : at::Tensor());
    }
  }
  for (PipelineStage* s : stages_) s->end_step();
  if (!has_last) return at::Tensor();
  std::vector<at::Tensor> detached;
  for (const at::Tensor& l : mb_losses) detached.push_back(local_tensor(l).detach());
  if (losses) *losses = detached;
  return at::stack(detached).mean();
}

}  // namespace hyper_parallel
