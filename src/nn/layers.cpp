#include <hyper_parallel/nn/layers.h>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/dtensor/random.h>
#include <hyper_parallel/runtime/errors.h>

#include <cmath>

namespace hyper_parallel {
namespace nn {

namespace {
thread_local at::TensorOptions t_parameter_options = at::TensorOptions().dtype(at::kFloat).device(at::kCPU);
}  // namespace

ParameterScope::ParameterScope(at::TensorOptions options) : previous_(t_parameter_options) {
  t_parameter_options = t_parameter_options.device(options.device()).dtype(options.dtype());
}
ParameterScope::~ParameterScope() { t_parameter_options = previous_; }
at::TensorOptions ParameterScope::current() { return t_parameter_options; }

LinearImpl::LinearImpl(const LinearOptions& options_) : options(options_) { reset(); }

void LinearImpl::reset() {
  register_parameter("weight", at::empty({options.out_features(), options.in_features()}, ParameterScope::current()));
  if (options.bias()) register_parameter("bias", at::empty({options.out_features()}, ParameterScope::current()));
  reset_parameters();
}

// torch::nn::Linear's distributions: kaiming_uniform_(a = sqrt(5)) is U(-1/sqrt(fan_in),
// 1/sqrt(fan_in)), and so is the bias. Drawn by the layout-independent generator: a shard of the
// weight holds the elements one process draws.
void LinearImpl::reset_parameters() {
  at::NoGradGuard no_grad;
  const double bound = options.in_features() > 0 ? 1.0 / std::sqrt(static_cast<double>(options.in_features())) : 0.0;
  at::Tensor w = parameter("weight");
  hyper_parallel::uniform_(w, -bound, bound);
  if (at::Tensor b = bias(); b.defined()) hyper_parallel::uniform_(b, -bound, bound);
}

bool small_batch_transposed_product(const at::Tensor& input, const at::Tensor& weight) {
  if (!c10::InferenceMode::is_enabled() || input.dim() < 2 || weight.dim() != 2 || input.scalar_type() != at::kFloat ||
      weight.scalar_type() != at::kFloat || !input.device().is_cpu())
    return false;
  const int64_t k = input.size(-1);
  if (k == 0) return false;
  const int64_t rows = input.numel() / k;
  if (rows < 2 || rows > 32) return false;
  // Flattening the rows and transposing must stay local: a DTensor input qualifies when it is
  // replicated or sharded on its features only (as tensor parallelism gives a Linear), so the
  // product takes the same collectives as linear's.
  if (is_dtensor(input))
    for (const Placement& p : DTensor(input).placements())
      if (!(p.is_replicate() || p.is_shard(input.dim() - 1))) return false;
  return true;
}

at::Tensor LinearImpl::forward(const at::Tensor& input) {
  const at::Tensor& w = weight();
  if (!small_batch_transposed_product(input, w)) return at::linear(input, w, bias());
  std::vector<int64_t> shape(input.sizes().begin(), input.sizes().end());
  shape.back() = w.size(0);
  at::Tensor y = at::mm(w, input.reshape({-1, input.size(-1)}).t()).t();
  if (const at::Tensor b = bias(); b.defined()) y = y + b;
  return y.reshape(shape);
}

EmbeddingImpl::EmbeddingImpl(const EmbeddingOptions& options_) : options(options_) { reset(); }

void EmbeddingImpl::reset() {
  register_parameter("weight", at::empty({options.num_embeddings(), options.embedding_dim()}, ParameterScope::current()));
  reset_parameters();
}

void EmbeddingImpl::reset_parameters() {
  at::NoGradGuard no_grad;
  at::Tensor w = parameter("weight");
  hyper_parallel::normal_(w);
  if (options.padding_idx()) w[*options.padding_idx()].fill_(0);
}

at::Tensor EmbeddingImpl::forward(const at::Tensor& indices) {
  return at::embedding(weight(), indices, options.padding_idx().value_or(-1));
}

LayerNormImpl::LayerNormImpl(const LayerNormOptions& options_) : options(options_) { reset(); }

void LayerNormImpl::reset() {
  if (!options.elementwise_affine()) return;
  register_parameter("weight", at::empty(options.normalized_shape(), ParameterScope::current()));
  register_parameter("bias", at::empty(options.normalized_shape(), ParameterScope::current()));
  reset_parameters();
}

void LayerNormImpl::reset_parameters() {
  at::NoGradGuard no_grad;
  if (at::Tensor w = parameter_or_undefined("weight"); w.defined()) w.fill_(1);
  if (at::Tensor b = parameter_or_undefined("bias"); b.defined()) b.fill_(0);
}

at::Tensor LayerNormImpl::forward(const at::Tensor& input) {
  return at::layer_norm(input, options.normalized_shape(), parameter_or_undefined("weight"),
                        parameter_or_undefined("bias"), options.eps());
}

RMSNormImpl::RMSNormImpl(const RMSNormOptions& options_) : options(options_) { reset(); }

void RMSNormImpl::reset() {
  register_parameter("weight", at::empty({options.dim()}, ParameterScope::current()));
  reset_parameters();
}

void RMSNormImpl::reset_parameters() {
  at::NoGradGuard no_grad;
  parameter("weight").fill_(options.zero_centered() ? 0 : 1);
}

at::Tensor RMSNormImpl::forward(const at::Tensor& input) {
  const auto dtype = input.scalar_type();
  at::Tensor x = dtype == at::kFloat ? input : input.to(at::kFloat);
  at::Tensor normed = x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + options.eps());
  if (options.zero_centered()) {
    const at::Tensor w = weight().scalar_type() == at::kFloat ? weight() : weight().to(at::kFloat);
    const at::Tensor y = normed * (w + 1.0);
    return dtype == at::kFloat ? y : y.to(dtype);
  }
  if (dtype != at::kFloat) normed = normed.to(dtype);
  return weight() * normed;
}

at::Tensor DropoutImpl::forward(const at::Tensor& input) { return hyper_parallel::dropout(input, p, is_training()); }
at::Tensor ReLUImpl::forward(const at::Tensor& input) { return at::relu(input); }
at::Tensor GELUImpl::forward(const at::Tensor& input) { return at::gelu(input, approximate); }
at::Tensor SiLUImpl::forward(const at::Tensor& input) { return at::silu(input); }

void SequentialImpl::push_back_module(std::shared_ptr<Module> module) {
  register_module(std::to_string(children_.size()), module);
  children_.push_back(std::move(module));
}

at::Tensor SequentialImpl::forward(const at::Tensor& input) {
  at::Tensor x = input;
  for (auto& child : children_) x = child->call_tensor(x);
  return x;
}

ModuleListImpl::ModuleListImpl(int64_t first_index) : first_index_(first_index) {
  HP_CHECK_T(c10::ValueError, first_index >= 0, "hyper_parallel::nn::ModuleList: first_index must be >= 0, got ", first_index);
}

void ModuleListImpl::push_back(std::shared_ptr<torch::nn::Module> module) {
  register_module(std::to_string(first_index_ + static_cast<int64_t>(modules_.size())), module);
  modules_.push_back(std::move(module));
}

std::shared_ptr<torch::nn::Module> ModuleListImpl::operator[](size_t position) const {
  HP_CHECK_T(c10::IndexError, position < modules_.size(), "hyper_parallel::nn::ModuleList: position ", position,
             " is out of range for a list of ", modules_.size(), " modules");
  return modules_[position];
}

}  // namespace nn
}  // namespace hyper_parallel
