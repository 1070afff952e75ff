#pragma once
// Activation checkpointing: a module keeps only its inputs (and, selectively, the outputs of
// chosen ops) from its forward and computes the rest again in backward, trading one more forward
// of the module for its activations' memory (PyTorch's checkpoint_wrapper and
// apply_activation_checkpointing, torchtitan's full / every n-th block / op-list selective AC).
//
//   hp::apply_activation_checkpointing(*model, hp::ActivationCheckpointPolicy::full());
//   hp::fully_shard(...);   // in either order with parallelize_module and fully_shard
//
// The recompute draws the same random numbers as the forward (torch's CPU generator, whose draws
// also key the layout-independent generator, is rewound for it and put back after), so gradients with
// checkpointing equal those without, dropout included. It composes with tensor parallelism,
// sequence parallelism and fully_shard: a fully_shard module's parameters, gathered again before
// its backward, serve the recompute, and it does not free them again until its backward is done.
// Collectives of a recomputed forward (tensor parallelism's) run again in backward, as in
// Megatron-LM's full recompute: keeping their outputs would keep what sequence parallelism frees.
//
// The recompute sees only what the call was given: every per-call input a checkpointed module
// reads (a padded batch's attention mask, the rotary tables) must be among its arguments, as a
// tensor or keyword, which the checkpoint keeps. An argument that is an object rather than a value
// (a generation cache, passed as a capsule) cannot be replayed and is refused by name while
// gradients are recorded; under at::NoGradGuard the module simply runs.
#include <torch/nn/module.h>

#include <functional>
#include <string>
#include <vector>

#include <hyper_parallel/nn/module.h>

namespace hyper_parallel {

/// What a checkpointed module keeps from its forward besides its inputs.
struct CheckpointOptions {
  /// Operator names whose outputs are kept in the forward and reused by the recompute instead of
  /// computed again (PyTorch's op-list selective activation checkpointing, MUST_SAVE), e.g.
  /// {"aten::mm"}: the projections are kept, attention scores, softmax, norms and activations
  /// are recomputed. Only ops that return new tensors are kept (views and in-place ops are always
  /// recomputed). Empty: everything is recomputed (full activation checkpointing).
  std::vector<std::string> save_ops;
  /// Rewind the random generators for the recompute (PyTorch's preserve_rng_state).
  bool preserve_rng_state = true;
};

/// Makes `module`'s forward checkpointed (its hooks run once, around it, as before). Applied to a
/// module that already is: its options are replaced. c10::TypeError for a plain torch::nn module
/// (no hooks). Returns `module`.
/// e.g. `for (auto& l : *model->layers) hp::checkpoint_wrapper(*l);`
torch::nn::Module& checkpoint_wrapper(torch::nn::Module& module, CheckpointOptions options = {});

/// Which blocks of a model are checkpointed, and how.
struct ActivationCheckpointPolicy {
  enum class Mode { None, Full, Selective };
  Mode mode = Mode::Full;
  /// Checkpoint every n-th block: the k-th block (counting from 1) when k % every == 0
  /// (torchtitan's ac_freq). 1: all of them.
  int64_t every = 1;
  /// Selective: the ops whose outputs are kept (CheckpointOptions::save_ops).
  std::vector<std::string> save_ops;
  /// Which modules are blocks, by FQN; unset: the elements of every ModuleList (a decoder's layers).
  std::function<bool(const std::string& fqn, const torch::nn::Module&)> is_block;

  /// No checkpointing.
  static ActivationCheckpointPolicy none();
  /// Every block keeps only its input.
  static ActivationCheckpointPolicy full(int64_t every = 1);
  /// Every block keeps its matmul outputs (the projections: aten::mm, aten::addmm) and recomputes
  /// the rest, attention scores, softmax and dropout among it (selective recompute in the sense
  /// of Korthikanti et al., 2022: the cheap-to-recompute, memory-heavy part).
  static ActivationCheckpointPolicy selective(std::vector<std::string> save_ops = {"aten::mm", "aten::addmm"});
  /// "none", "full", "selective", or "full:N" (every N-th block); c10::ValueError otherwise.
  static ActivationCheckpointPolicy parse(const std::string& text);
  /// The name parse reads ("full:2").
  std::string to_string() const;
};

/// Applies checkpoint_wrapper to the blocks of `model` that `policy` selects (in named_modules
/// order); returns their FQNs. Nothing for Mode::None.
/// e.g. `hp::apply_activation_checkpointing(*model, hp::ActivationCheckpointPolicy::parse("selective"));`
std::vector<std::string> apply_activation_checkpointing(torch::nn::Module& model, const ActivationCheckpointPolicy& policy);

/// Whether this thread is running a checkpointed module's recompute (in backward). fully_shard
/// asks it: a recompute must not free the parameters its backward is about to use.
bool is_recomputing();

/// Hands `value`, a tensor a module's forward makes for use after the forward (the router logits
/// that the load-balancing loss reads), to `deliver`. Outside checkpointing that is all. Inside a
/// checkpointed forward, which runs without autograd, `deliver` gets it as one more output of the
/// checkpoint's node instead, after the forward: a gradient that reaches it flows into the
/// recompute, as one reaching the module's return value does (a tensor kept aside otherwise
/// would silently get no gradient). The recompute must hand out as many side outputs.
/// e.g. `hp::checkpoint_side_output(logits, [this](const at::Tensor& t) { router_logits = t; });`
void checkpoint_side_output(const at::Tensor& value, const std::function<void(const at::Tensor&)>& deliver);

}  // namespace hyper_parallel
