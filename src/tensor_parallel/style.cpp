#include <hyper_parallel/platform/platform.h>
#include <hyper_parallel/runtime/errors.h>
#include <hyper_parallel/tensor_parallel/distribute_module.h>
#include <hyper_parallel/tensor_parallel/style.h>

#include "module_state.h"
#include "vocab_parallel_embedding.h"

#include <ATen/ATen.h>

namespace hyper_parallel {

ParallelStyle::~ParallelStyle() = default;

namespace {

// The module's FQN when parallelize_module recorded it, else its type.
std::string name_of(const torch::nn::Module& m) {
  const auto* hp = dynamic_cast<const nn::Module*>(&m);
  const TpModuleState* st = hp != nullptr ? hp->find_state<TpModuleState>() : nullptr;
  return st != nullptr && !st->fqn.empty() ? st->fqn : m.name();
}

void check_mesh(const DeviceMesh& mesh, const std::string& style) {
  HP_CHECK_T(c10::ValueError, mesh.defined() && mesh.ndim() == 1, "hyper_parallel::", style, ": needs a 1-D DeviceMesh, but got a ",
             mesh.defined() ? mesh.ndim() : 0, "-D one; pass device_mesh[\"tp\"]");
}

void check_hookable_and_fresh(torch::nn::Module& module, const std::string& fqn, const ParallelStyle& style) {
  platform::hookable(module, fqn);
  if (style.distributes_module())
    TORCH_CHECK(!distribute_module_applied(module), "hyper_parallel::", style.name(), ": distribute_module was already applied to module '",
                module_label(fqn), "'; a module can be distributed once (apply PrepareModuleInput/Output on top instead)");
}

// The named parameter must split evenly over the mesh along `dim` (the styles never pad).
void check_divisible(torch::nn::Module& module, const std::string& fqn, const std::string& style,
                     const std::string& param, int64_t dim, const char* what, int64_t tp) {
  auto params = module.named_parameters(/*recurse=*/false);
  HP_CHECK_T(c10::ValueError, params.contains(param), "hyper_parallel::", style, ": module '", module_label(fqn), "' has no parameter '", param, "'");
  const at::Tensor& p = params[param];
  HP_CHECK_T(c10::ValueError, p.dim() > dim, "hyper_parallel::", style, ": parameter '", module_label(fqn), ".", param, "' of shape ", p.sizes(),
             " has no dim ", dim);
  HP_CHECK_T(c10::ValueError, p.size(dim) % tp == 0, "hyper_parallel::", style, ": module '", module_label(fqn), "' parameter '", param,
             "' of shape ", p.sizes(), " would be sharded on dim ", dim, " (", what, " = ", p.size(dim),
             "), which is not divisible by the tensor-parallel size ", tp);
}

// A global dim that a hook is about to shard must divide too.
void check_shardable(const at::Tensor& t, const Placement& p, const DeviceMesh& mesh, const std::string& qualified_where) {
  if (!p.is_shard()) return;
  const int64_t d = p.normalized(t.dim()).dim();
  HP_CHECK_T(c10::ValueError, t.size(d) % mesh.size(0) == 0, qualified_where, ": dim ", d, " of size ", t.size(d),
             " (shape ", t.sizes(), ") is not divisible by the tensor-parallel size ", mesh.size(0),
             " (a sequence-parallel plan needs every sequence length divisible by it; to generate, where a decode step has one "
             "token, parallelize with a plan without sequence parallelism: from Python plan_from_transformers(model) for a "
             "transformers model, in C++ parallelize_qwen3_tp / parallelize_qwen3_5_tp with sequence_parallel = false)");
}

// `d` redistributed to `desired` (the sharded dim checked to divide), local when `use_local`.
at::Tensor to_layout(DTensor d, const Placement& desired, const DeviceMesh& mesh, bool use_local, const std::string& qualified_where) {
  const Placements want{desired.normalized(d.dim())};
  if (d.placements() != want) {
    check_shardable(d, desired, mesh, qualified_where);
    d = d.redistribute(want);
  }
  return use_local ? d.to_local() : at::Tensor(d);
}

// A tensor input as the module expects it: plain tensors are annotated with `layout`, then
// redistributed to `desired`.
at::Tensor prepare_input(const at::Tensor& t, const Placement& layout, const Placement& desired,
                         const DeviceMesh& mesh, bool use_local, const std::string& qualified_where) {
  return to_layout(is_dtensor(t) ? DTensor(t) : DTensor::from_local(t, mesh, {layout}), desired, mesh, use_local, qualified_where);
}

// A module output as the next one expects it; Partial values reduce in reduce_dtype (each
// addend is upcast before the sum).
at::Tensor prepare_output(const DTensor& out, const Placement& desired, c10::optional<at::ScalarType> reduce_dtype,
                          const DeviceMesh& mesh, bool use_local, const std::string& qualified_where) {
  DTensor d = out;
  if (reduce_dtype && d.spec().has_partial() && d.scalar_type() != *reduce_dtype &&
      d.placements() != Placements{desired.normalized(d.dim())})
    d = DTensor(d.to(*reduce_dtype));
  return to_layout(d, desired, mesh, use_local, qualified_where);
}

// What every style that calls distribute_module needs: a 1-D mesh, a hookable module not
// distributed yet.
void validate_distributable(torch::nn::Module& module, const std::string& fqn, const DeviceMesh& mesh,
                            const ParallelStyle& style) {
  check_mesh(mesh, style.name());
  check_hookable_and_fresh(module, fqn, style);
}

// Colwise/Rowwise: only Linear- and Embedding-like modules, whose weight splits
// evenly along the dim the style shards (given for each kind with the dim's name).
struct ShardedDim {
  int64_t dim;
  const char* what;
};
void validate_linear_or_embedding(torch::nn::Module& module, const std::string& fqn, const DeviceMesh& mesh,
                                  const ParallelStyle& style, ShardedDim linear_dim, ShardedDim embedding_dim) {
  validate_distributable(module, fqn, mesh, style);
  const bool linear = platform::is_linear_module(module), embedding = platform::is_embedding_module(module);
  HP_CHECK_T(c10::NotImplementedError, linear || embedding, "hyper_parallel::", style.name(), ": ", style.name(), " currently only supports Linear and Embedding "
             "modules, but module '", module_label(fqn), "' is a ", platform::module_type_name(module));
  const ShardedDim d = linear ? linear_dim : embedding_dim;
  check_divisible(module, fqn, style.name(), "weight", d.dim, d.what, mesh.size(0));
}

const at::Tensor& first_tensor(const std::vector<c10::IValue>& inputs, const std::string& qualified_where) {
  HP_CHECK_T(c10::ValueError, !inputs.empty(), qualified_where, ": forward got no positional input");
  HP_CHECK_T(c10::TypeError, inputs[0].isTensor(), qualified_where, ": the first positional input must be a tensor or DTensor, got ",
             inputs[0].tagKind());
  return inputs[0].toTensor();
}

std::vector<c10::IValue> with_first(const std::vector<c10::IValue>& inputs, at::Tensor first) {
  std::vector<c10::IValue> out = inputs;
  out[0] = std::move(first);
  return out;
}

// The input hook of Colwise/Rowwise/NoParallel: only the first positional input is prepared,
// annotated with `layout` when plain and redistributed to `desired`.
InputFn first_input_fn(const char* style, Placement layout, Placement desired) {
  return [style, layout, desired](nn::Module& m, const std::vector<c10::IValue>& inputs, const DeviceMesh& mesh)
             -> c10::optional<std::vector<c10::IValue>> {
    const std::string qualified_where = "hyper_parallel::" + std::string(style) + ": input of '" + name_of(m) + "'";
    return with_first(inputs, prepare_input(first_tensor(inputs, qualified_where), layout, desired, mesh, false, qualified_where));
  };
}

}  // namespace

// ---- ColwiseParallel

void ColwiseParallel::validate(torch::nn::Module& module, const std::string& fqn, const DeviceMesh& mesh) const {
  validate_linear_or_embedding(module, fqn, mesh, *this, {0, "out_features"}, {1, "embedding_dim"});
}

torch::nn::Module& ColwiseParallel::apply(torch::nn::Module& module, const DeviceMesh& mesh) {
  validate(module, name_of(module), mesh);
  const bool linear = platform::is_linear_module(module);
  const auto src = src_data_rank;
  auto partition = [linear, src](const std::string& name, torch::nn::Module& m, const DeviceMesh& mesh) {
    if (!name.empty()) return;
    for (const auto& p : m.named_parameters(false)) {
      // Linear: weight and bias on out_features; Embedding: weight on embedding_dim.
      const Placement pl = linear ? Shard(0) : Shard(1);
      nn::replace_parameter(m, p.key(), distribute_parameter(p.value(), mesh, {pl}, src));
    }
  };
  const Placement in = input_layouts_, desired = desired_input_layouts(), out = output_layouts_;
  const bool local = use_local_output_;
  const InputFn input_fn = first_input_fn("ColwiseParallel", in, desired);
  auto output_fn = [out, local](nn::Module& m, const c10::IValue& output, const DeviceMesh& mesh) -> c10::optional<c10::IValue> {
    const std::string qualified_where = "hyper_parallel::ColwiseParallel: output of '" + name_of(m) + "'";
    HP_CHECK_T(c10::TypeError, output.isTensor() && is_dtensor(output.toTensor()), qualified_where, " is not a DTensor");
    return c10::IValue(prepare_output(DTensor(output.toTensor()), out, c10::nullopt, mesh, local, qualified_where));
  };
  return distribute_module(module, mesh, partition, input_fn, output_fn, src_data_rank);
}

// ---- RowwiseParallel

void RowwiseParallel::validate(torch::nn::Module& module, const std::string& fqn, const DeviceMesh& mesh) const {
  validate_linear_or_embedding(module, fqn, mesh, *this, {1, "in_features"}, {0, "num_embeddings"});
}

torch::nn::Module& RowwiseParallel::apply(torch::nn::Module& module, const DeviceMesh& mesh) {
  validate(module, name_of(module), mesh);
  const bool embedding = platform::is_embedding_module(module);
  // An Embedding looks up replicated indices (the ids are never sharded).
  desired_input_layouts_ = embedding ? Replicate() : Shard(-1);
  const auto src = src_data_rank;
  auto partition = [embedding, src](const std::string& name, torch::nn::Module& m, const DeviceMesh& mesh) {
    if (!name.empty()) return;
    for (const auto& p : m.named_parameters(false)) {
      // Linear: weight on in_features, bias replicated; Embedding: weight on the vocabulary.
      const Placement pl = embedding ? Shard(0) : (p.key() == "weight" ? Shard(1) : Replicate());
      nn::replace_parameter(m, p.key(), distribute_parameter(p.value(), mesh, {pl}, src));
    }
  };
  const Placement in = input_layouts_, desired = desired_input_layouts_, out = output_layouts_;
  const bool local = use_local_output_;
  const auto reduce = reduce_dtype_;
  const InputFn input_fn = first_input_fn("RowwiseParallel", in, desired);
  auto output_fn = [out, local, reduce, embedding](nn::Module& m, const c10::IValue& output, const DeviceMesh& mesh)
      -> c10::optional<c10::IValue> {
    const std::string qualified_where = "hyper_parallel::RowwiseParallel: output of '" + name_of(m) + "'";
    HP_CHECK_T(c10::TypeError, output.isTensor(), qualified_where, " is not a tensor");
    const at::Tensor& t = output.toTensor();
    DTensor d;
    // A lookup in the vocabulary-sharded table: its backward makes this rank's rows of the
    // table's gradient only (vocab_parallel_embedding.h).
    if (is_dtensor(t) && embedding) d = DTensor(with_vocab_parallel_backward(t));
    else if (is_dtensor(t)) d = DTensor(t);
    else if (embedding) d = DTensor::from_local(t, mesh, {Partial()});  // each rank looked up its rows
    else HP_CHECK_T(c10::TypeError, false, qualified_where, " is a plain tensor, expected a DTensor (a Linear-like module must "
                    "compute with its DTensor parameters)");
    return c10::IValue(prepare_output(d, out, reduce, mesh, local, qualified_where));
  };
  return distribute_module(module, mesh, partition, input_fn, output_fn, src_data_rank);
}

// ---- SequenceParallel

void SequenceParallel::validate(torch::nn::Module& module, const std::string& fqn, const DeviceMesh& mesh) const {
  validate_distributable(module, fqn, mesh, *this);
}

torch::nn::Module& SequenceParallel::apply(torch::nn::Module& module, const DeviceMesh& mesh) {
  validate(module, name_of(module), mesh);
  const int64_t seq = sequence_dim_;
  const bool local = use_local_output_;
  auto input_fn = [seq](nn::Module& m, const std::vector<c10::IValue>& inputs, const DeviceMesh& mesh)
      -> c10::optional<std::vector<c10::IValue>> {
    HP_CHECK_T(c10::ValueError, !inputs.empty() && inputs[0].isTensor(), "hyper_parallel::SequenceParallel: expecting the input of '",
               name_of(m), "' to be a tensor or DTensor, but got ", inputs.empty() ? "nothing" : inputs[0].tagKind());
    const at::Tensor& t = inputs[0].toTensor();
    if (is_dtensor(t)) {
      // As PyTorch's: a DTensor laid out otherwise is redistributed to the sequence sharding.
      const DTensor d(t);
      const Placements want{Shard(seq)};
      if (d.placements() == want || d.device_mesh() != mesh) return c10::nullopt;
      return with_first(inputs, d.redistribute(mesh, want));
    }
    return with_first(inputs, DTensor::from_local(t, mesh, {Shard(seq)}));
  };
  OutputFn output_fn;
  if (local)
    output_fn = [](nn::Module&, const c10::IValue& output, const DeviceMesh&) -> c10::optional<c10::IValue> {
      if (!output.isTensor() || !is_dtensor(output.toTensor())) return c10::nullopt;
      return c10::IValue(DTensor(output.toTensor()).to_local());
    };
  return distribute_module(module, mesh, nullptr, input_fn, output_fn, src_data_rank);
}

// ---- NoParallel

void NoParallel::validate(torch::nn::Module& module, const std::string& fqn, const DeviceMesh& mesh) const {
  validate_distributable(module, fqn, mesh, *this);
}

torch::nn::Module& NoParallel::apply(torch::nn::Module& module, const DeviceMesh& mesh) {
  validate(module, name_of(module), mesh);
  const Placement in = input_layout_, desired = desired_input_layout_, out = output_layout_;
  const bool local = use_local_output_;
  const InputFn input_fn = first_input_fn("NoParallel", in, desired);
  auto output_fn = [out, local](nn::Module& m, const c10::IValue& output, const DeviceMesh& mesh) -> c10::optional<c10::IValue> {
    const std::string qualified_where = "hyper_parallel::NoParallel: output of '" + name_of(m) + "'";
    HP_CHECK_T(c10::TypeError, output.isTensor(), qualified_where, " is not a tensor");
    const at::Tensor& t = output.toTensor();
    DTensor d = is_dtensor(t) ? DTensor(t) : DTensor::from_local(t, mesh, {out});
    return c10::IValue(prepare_output(d, out, c10::nullopt, mesh, local, qualified_where));
  };
  return distribute_module(module, mesh, nullptr, input_fn, output_fn, src_data_rank);
}

// ---- PrepareModuleInput

PrepareModuleInput::PrepareModuleInput(c10::optional<Layouts> input_layouts, c10::optional<Layouts> desired_input_layouts,
                                       c10::optional<KwargLayouts> input_kwarg_layouts,
                                       c10::optional<KwargLayouts> desired_input_kwarg_layouts, bool use_local_output)
    : input_layouts_(std::move(input_layouts)),
      desired_input_layouts_(std::move(desired_input_layouts)),
      input_kwarg_layouts_(input_kwarg_layouts.value_or(KwargLayouts{})),
      desired_input_kwarg_layouts_(desired_input_kwarg_layouts.value_or(KwargLayouts{})),
      use_local_output_(use_local_output) {
  if (input_layouts_) {
    HP_CHECK_T(AssertionError, desired_input_layouts_.has_value(),
               "hyper_parallel::PrepareModuleInput: desired_input_layouts must be given with input_layouts");
    HP_CHECK_T(AssertionError, input_layouts_->size() == desired_input_layouts_->size(),
               "hyper_parallel::PrepareModuleInput: input_layouts and desired_input_layouts should have same length! got ",
               input_layouts_->size(), " and ", desired_input_layouts_->size());
  }
  HP_CHECK_T(AssertionError, input_kwarg_layouts_.size() == desired_input_kwarg_layouts_.size(),
             "hyper_parallel::PrepareModuleInput: input_kwarg_layouts and desired_input_kwarg_layouts should have same length! got ",
             input_kwarg_layouts_.size(), " and ", desired_input_kwarg_layouts_.size());
}

void PrepareModuleInput::validate(torch::nn::Module& module, const std::string& fqn, const DeviceMesh& mesh) const {
  check_mesh(mesh, name());
  platform::hookable(module, fqn);
}

namespace {
// One slot of PrepareModuleInput/Output: nullopt layouts pass through; a layout on a non-tensor
// is an AssertionError.
c10::IValue prepare_slot(const c10::IValue& v, const c10::optional<Placement>& layout,
                         const c10::optional<Placement>& desired, const DeviceMesh& mesh, bool use_local,
                         const std::string& qualified_where) {
  if (!layout) return v;
  HP_CHECK_T(AssertionError, v.isTensor(), qualified_where, " has layout ", layout->to_string(),
             " but is not a tensor (got ", v.tagKind(), ")");
  return prepare_input(v.toTensor(), *layout, desired.value_or(*layout), mesh, use_local, qualified_where);
}
}  // namespace

torch::nn::Module& PrepareModuleInput::apply(torch::nn::Module& module, const DeviceMesh& mesh) {
  validate(module, name_of(module), mesh);
  const auto in = input_layouts_, desired = desired_input_layouts_;
  const auto kin = input_kwarg_layouts_, kdesired = desired_input_kwarg_layouts_;
  const bool local = use_local_output_;
  auto prepare_args = [in, desired, local](nn::Module& m, const std::vector<c10::IValue>& args, const DeviceMesh& mesh) {
    if (!in) return args;
    HP_CHECK_T(c10::ValueError, args.size() == in->size(), "hyper_parallel::PrepareModuleInput: module inputs and input_layouts should have "
               "same length! '", name_of(m), "' got ", args.size(), " inputs for ", in->size(), " layouts");
    std::vector<c10::IValue> out(args.size());
    for (size_t i = 0; i < args.size(); ++i)
      out[i] = prepare_slot(args[i], (*in)[i], (*desired)[i], mesh, local,
                            "hyper_parallel::PrepareModuleInput: input " + std::to_string(i) + " of '" + name_of(m) + "'");
    return out;
  };
  if (kin.empty()) {
    platform::register_forward_pre_hook(module, [prepare_args, mesh](nn::Module& m, const std::vector<c10::IValue>& args)
                                                    -> c10::optional<std::vector<c10::IValue>> {
      return prepare_args(m, args, mesh);
    });
  } else {
    platform::register_forward_pre_hook(
        module,
        [prepare_args, kin, kdesired, local, mesh](nn::Module& m, const std::vector<c10::IValue>& args, const nn::Kwargs& kwargs)
            -> c10::optional<std::pair<std::vector<c10::IValue>, nn::Kwargs>> {
          nn::Kwargs out = kwargs;
          for (auto& [key, value] : out) {
            auto it = kin.find(key);
            if (it == kin.end()) continue;
            auto d = kdesired.find(key);
            value = prepare_slot(value, it->second, d == kdesired.end() ? c10::nullopt : d->second, mesh, local,
                                 "hyper_parallel::PrepareModuleInput: keyword input '" + key + "' of '" + name_of(m) + "'");
          }
          return std::make_pair(prepare_args(m, args, mesh), std::move(out));
        },
        /*with_kwargs=*/true);
  }
  return module;
}

// ---- PrepareModuleOutput

PrepareModuleOutput::PrepareModuleOutput(Layouts output_layouts, Layouts desired_output_layouts, bool use_local_output,
                                         c10::optional<at::ScalarType> reduce_dtype)
    : output_layouts_(std::move(output_layouts)),
      desired_output_layouts_(std::move(desired_output_layouts)),
      use_local_output_(use_local_output),
      reduce_dtype_(reduce_dtype) {
  HP_CHECK_T(AssertionError, output_layouts_.size() == desired_output_layouts_.size(),
             "hyper_parallel::PrepareModuleOutput: output_layouts and desired_output_layouts should have same length! got ",
             output_layouts_.size(), " and ", desired_output_layouts_.size());
}

void PrepareModuleOutput::validate(torch::nn::Module& module, const std::string& fqn, const DeviceMesh& mesh) const {
  check_mesh(mesh, name());
  platform::hookable(module, fqn);
}

torch::nn::Module& PrepareModuleOutput::apply(torch::nn::Module& module, const DeviceMesh& mesh) {
  validate(module, name_of(module), mesh);
  const Layouts out = output_layouts_, desired = desired_output_layouts_;
  const bool local = use_local_output_;
  const auto reduce = reduce_dtype_;
  platform::register_forward_hook(module, [out, desired, local, reduce, mesh](nn::Module& m, const std::vector<c10::IValue>&,
                                                                              const c10::IValue& output) -> c10::optional<c10::IValue> {
    const bool tuple = output.isTuple();
    std::vector<c10::IValue> items = tuple ? output.toTupleRef().elements().vec() : std::vector<c10::IValue>{output};
    HP_CHECK_T(c10::ValueError, items.size() == out.size(), "hyper_parallel::PrepareModuleOutput: module outputs and output_layouts should "
               "have same length! '", name_of(m), "' returned ", items.size(), " outputs for ", out.size(), " layouts");
    for (size_t i = 0; i < items.size(); ++i) {
      if (!out[i]) continue;
      const std::string qualified_where = "hyper_parallel::PrepareModuleOutput: output " + std::to_string(i) + " of '" + name_of(m) + "'";
      HP_CHECK_T(AssertionError, items[i].isTensor(), qualified_where, " has layout ", out[i]->to_string(), " but is not a tensor");
      const at::Tensor& t = items[i].toTensor();
      DTensor d = is_dtensor(t) ? DTensor(t) : DTensor::from_local(t, mesh, {*out[i]});
      items[i] = prepare_output(d, desired[i].value_or(*out[i]), reduce, mesh, local, qualified_where);
    }
    return tuple ? c10::IValue(c10::ivalue::Tuple::create(std::move(items))) : items[0];
  });
  return module;
}

// ---- PrepareModuleInputOutput

PrepareModuleInputOutput::PrepareModuleInputOutput(c10::optional<Layouts> input_layouts,
                                                   c10::optional<Layouts> desired_input_layouts, Layouts output_layouts,
                                                   Layouts desired_output_layouts,
                                                   c10::optional<KwargLayouts> input_kwarg_layouts,
                                                   c10::optional<KwargLayouts> desired_input_kwarg_layouts,
                                                   bool use_local_input, bool use_local_output,
                                                   c10::optional<at::ScalarType> reduce_dtype)
    : input_(std::move(input_layouts), std::move(desired_input_layouts), std::move(input_kwarg_layouts),
             std::move(desired_input_kwarg_layouts), use_local_input),
      output_(std::move(output_layouts), std::move(desired_output_layouts), use_local_output, reduce_dtype) {}

void PrepareModuleInputOutput::validate(torch::nn::Module& module, const std::string& fqn, const DeviceMesh& mesh) const {
  input_.validate(module, fqn, mesh);
  output_.validate(module, fqn, mesh);
}

torch::nn::Module& PrepareModuleInputOutput::apply(torch::nn::Module& module, const DeviceMesh& mesh) {
  validate(module, name_of(module), mesh);
  input_.apply(module, mesh);
  return output_.apply(module, mesh);
}

}  // namespace hyper_parallel
