#pragma once
// PyTorch's loss_parallel: the loss ops on class-sharded logits take plain targets.

namespace hyper_parallel {

/// RAII (PyTorch's `loss_parallel()` context): while alive, the plain tensors that the loss ops
/// take beside DTensor (log-)probabilities, nll_loss's and nll_loss2d's targets and class
/// weights (which cross_entropy reaches), are taken as Replicate: the same on every rank. Any
/// other op that mixes a plain tensor of one or more dimensions with a DTensor is still refused,
/// so a per-rank tensor elsewhere in the block is never silently taken as replicated. The loss on
/// a class-sharded input itself needs no guard: it is always reduced exactly once. Per thread
/// (autograd's backward replicates libtorch's own plain tensors anyway); guards nest.
/// e.g. `{ hp::LossParallelGuard loss_parallel; loss = at::cross_entropy_loss(logits, targets); }`
class LossParallelGuard {
 public:
  LossParallelGuard();
  ~LossParallelGuard();
  LossParallelGuard(const LossParallelGuard&) = delete;
  LossParallelGuard& operator=(const LossParallelGuard&) = delete;
  static bool enabled();

 private:
  bool previous_;
};

}  // namespace hyper_parallel
