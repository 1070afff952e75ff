#pragma once
// Standard layers on hyper_parallel::nn::Module, with torch's option names, parameter names and
// default initialisation. Their forward reads the parameters from the registry on every call, so
// a parameter replaced by a DTensor is what forward uses.
#include <c10/util/Optional.h>

#include <string>
#include <vector>

#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>

#include <hyper_parallel/nn/module.h>

namespace hyper_parallel {
namespace nn {

/// While alive (on this thread), the layers below create their parameters with `options`' device
/// and dtype, as Python's `with torch.device("meta"):` does, plus a default dtype. A model built
/// under `at::kMeta` holds shapes only: no memory, instant for any size, and the styles and
/// fully_shard take it as they take a real one (a plan, or a model whose weights are loaded after
/// parallelize_module). Scopes nest; the innermost wins.
/// e.g. `{ hnn::ParameterScope meta(at::TensorOptions().device(at::kMeta)); model = qwen3::CausalLM(config); }`
class ParameterScope {
 public:
  explicit ParameterScope(at::TensorOptions options);
  ~ParameterScope();
  ParameterScope(const ParameterScope&) = delete;
  ParameterScope& operator=(const ParameterScope&) = delete;
  /// The options parameters are created with now (float32 on the CPU outside any scope).
  static at::TensorOptions current();

 private:
  at::TensorOptions previous_;
};

/// y = x W^T + b; weight [out_features, in_features], bias [out_features], both drawn from
/// torch's U(-1/sqrt(in_features), 1/sqrt(in_features)) by hyper_parallel's generator
/// (dtensor/random.h: seed it with hyper_parallel::manual_seed, not torch's).
/// e.g. `Linear proj(LinearOptions(64, 32).bias(false));`
struct LinearOptions {
  LinearOptions(int64_t in_features, int64_t out_features) : in_features_(in_features), out_features_(out_features) {}
  TORCH_ARG(int64_t, in_features);
  TORCH_ARG(int64_t, out_features);
  TORCH_ARG(bool, bias) = true;
};
/// Whether a Linear computes `input` times `weight`^T as (weight @ input^T)^T: float32 on the CPU,
/// in c10::InferenceMode (as `generate` decodes), 2 to 32 rows (the product of the leading dims).
/// MKL's kernel for a tall matrix times a thin one is 1.1-1.5x faster there than its x @ W^T
/// (`hp_bench linear_small_batch` measures both); one row and more than 32 gain nothing. A fixed
/// rule on the global shape, dtype and mode, never a timing, so every rank of a job makes the
/// same choice and replicated results stay bitwise equal across ranks. Not under a mere
/// NoGradGuard: activation checkpointing runs its first forward so and must recompute it bitwise.
bool small_batch_transposed_product(const at::Tensor& input, const at::Tensor& weight);

class LinearImpl : public ModuleBase<LinearImpl> {
 public:
  LinearImpl(int64_t in_features, int64_t out_features) : LinearImpl(LinearOptions(in_features, out_features)) {}
  explicit LinearImpl(const LinearOptions& options);
  void reset();
  void reset_parameters() override;
  at::Tensor forward(const at::Tensor& input);
  ModuleKind module_kind() const override { return ModuleKind::Linear; }
  const at::Tensor& weight() const { return parameter("weight"); }
  at::Tensor bias() const { return parameter_or_undefined("bias"); }
  LinearOptions options;
};
HP_MODULE(Linear);

/// A lookup table; weight [num_embeddings, embedding_dim] ~ N(0, 1) (hyper_parallel's generator),
/// the padding row zero.
struct EmbeddingOptions {
  EmbeddingOptions(int64_t num_embeddings, int64_t embedding_dim) : num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {}
  TORCH_ARG(int64_t, num_embeddings);
  TORCH_ARG(int64_t, embedding_dim);
  TORCH_ARG(c10::optional<int64_t>, padding_idx) = c10::nullopt;
};
class EmbeddingImpl : public ModuleBase<EmbeddingImpl> {
 public:
  EmbeddingImpl(int64_t num_embeddings, int64_t embedding_dim) : EmbeddingImpl(EmbeddingOptions(num_embeddings, embedding_dim)) {}
  explicit EmbeddingImpl(const EmbeddingOptions& options);
  void reset();
  void reset_parameters() override;
  at::Tensor forward(const at::Tensor& indices);
  ModuleKind module_kind() const override { return ModuleKind::Embedding; }
  const at::Tensor& weight() const { return parameter("weight"); }
  EmbeddingOptions options;
};
HP_MODULE(Embedding);

/// Layer normalisation over the trailing `normalized_shape` dims; weight ones, bias zeros.
struct LayerNormOptions {
  /* implicit */ LayerNormOptions(std::vector<int64_t> normalized_shape) : normalized_shape_(std::move(normalized_shape)) {}
  TORCH_ARG(std::vector<int64_t>, normalized_shape);
  TORCH_ARG(double, eps) = 1e-5;
  TORCH_ARG(bool, elementwise_affine) = true;
};
class LayerNormImpl : public ModuleBase<LayerNormImpl> {
 public:
  explicit LayerNormImpl(const LayerNormOptions& options);
  void reset();
  void reset_parameters() override;
  at::Tensor forward(const at::Tensor& input);
  LayerNormOptions options;
};
HP_MODULE(LayerNorm);

/// RMS normalisation over the last dim: x / sqrt(mean(x^2) + eps) * weight, computed in float32
/// and cast back (as Qwen/Llama do); weight ones.
struct RMSNormOptions {
  /* implicit */ RMSNormOptions(int64_t dim) : dim_(dim) {}
  TORCH_ARG(int64_t, dim);
  TORCH_ARG(double, eps) = 1e-6;
  /// Zero-centred (Gemma, Qwen3-Next and Qwen3.5): the weight starts at zeros and scales by
  /// (1 + w), in float32 with the norm, cast to the input's dtype last.
  TORCH_ARG(bool, zero_centered) = false;
};
class RMSNormImpl : public ModuleBase<RMSNormImpl> {
 public:
  explicit RMSNormImpl(const RMSNormOptions& options);
  void reset();
  void reset_parameters() override;
  at::Tensor forward(const at::Tensor& input);
  const at::Tensor& weight() const { return parameter("weight"); }
  RMSNormOptions options;
};
HP_MODULE(RMSNorm);

/// Zeroes elements with probability p in training mode and scales the rest by 1/(1-p).
class DropoutImpl : public ModuleBase<DropoutImpl> {
 public:
  explicit DropoutImpl(double p = 0.5) : p(p) {}
  at::Tensor forward(const at::Tensor& input);
  double p;
};
HP_MODULE(Dropout);

class ReLUImpl : public ModuleBase<ReLUImpl> {
 public:
  at::Tensor forward(const at::Tensor& input);
};
HP_MODULE(ReLU);

/// approximate: "none" or "tanh".
class GELUImpl : public ModuleBase<GELUImpl> {
 public:
  explicit GELUImpl(std::string approximate = "none") : approximate(std::move(approximate)) {}
  at::Tensor forward(const at::Tensor& input);
  std::string approximate;
};
HP_MODULE(GELU);

class SiLUImpl : public ModuleBase<SiLUImpl> {
 public:
  at::Tensor forward(const at::Tensor& input);
};
HP_MODULE(SiLU);

class IdentityImpl : public ModuleBase<IdentityImpl> {
 public:
  at::Tensor forward(const at::Tensor& input) { return input; }
};
HP_MODULE(Identity);

/// Calls its children in order, each through its hooks; children are named "0", "1", ...
class SequentialImpl : public ModuleBase<SequentialImpl> {
 public:
  SequentialImpl() = default;
  template <class... Holders>
  explicit SequentialImpl(Holders&&... modules) {
    (push_back(std::forward<Holders>(modules)), ...);
  }
  template <class Holder>
  void push_back(Holder&& module) {
    push_back_module(module.ptr());
  }
  void push_back_module(std::shared_ptr<Module> module);
  at::Tensor forward(const at::Tensor& input);
  size_t size() const { return children_.size(); }
  std::shared_ptr<Module> operator[](size_t i) const { return children_.at(i); }

 private:
  std::vector<std::shared_ptr<Module>> children_;
};
HP_MODULE(Sequential);

/// A list of modules that never calls them (a decoder's layers), as libtorch's ModuleList, except
/// that its elements are named from `first_index`: a pipeline stage that holds layers 4..7 of a
/// model names them "layers.4" .. "layers.7", so its FQNs, its checkpoints and its HF keys are the
/// whole model's (torchtitan deletes the other layers rather than renumbering).
/// e.g. `hnn::ModuleList layers(4); layers->push_back(block);  // registered as "4"`
class ModuleListImpl : public torch::nn::Module {
 public:
  using Iterator = std::vector<std::shared_ptr<torch::nn::Module>>::iterator;
  using ConstIterator = std::vector<std::shared_ptr<torch::nn::Module>>::const_iterator;
  explicit ModuleListImpl(int64_t first_index = 0);
  /// Appends `module`, registered under the name first_index() + its position.
  void push_back(std::shared_ptr<torch::nn::Module> module);
  template <class Impl>
  void push_back(const torch::nn::ModuleHolder<Impl>& holder) {
    push_back(std::static_pointer_cast<torch::nn::Module>(holder.ptr()));
  }
  Iterator begin() { return modules_.begin(); }
  Iterator end() { return modules_.end(); }
  ConstIterator begin() const { return modules_.begin(); }
  ConstIterator end() const { return modules_.end(); }
  /// The element at `position` (not its name's index: position 0 of a stage from layer 4 is "4").
  std::shared_ptr<torch::nn::Module> operator[](size_t position) const;
  size_t size() const { return modules_.size(); }
  bool is_empty() const { return modules_.empty(); }
  /// The index the first element is named with.
  int64_t first_index() const { return first_index_; }

 private:
  int64_t first_index_ = 0;
  std::vector<std::shared_ptr<torch::nn::Module>> modules_;
};
TORCH_MODULE(ModuleList);

/// A container that never calls its children: libtorch's own.
using ModuleDict = torch::nn::ModuleDict;

}  // namespace nn
}  // namespace hyper_parallel
