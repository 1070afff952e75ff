// Factory-likes (*_like, new_*), copy_, fill_, zero_, positional ops (triu/tril, cumsum,
// index_select), and the ops that leave DTensor land (item, equal).
#include "pointwise.h"

#include "../local_layout.h"

namespace hyper_parallel {
namespace ops {
namespace {

// zeros_like(self, ...): values do not depend on self: no communication, self's layout (a
// Partial becomes Replicate: every rank makes the whole value).
OpSharding like_rule(const OpInfo& info) {
  const DTensorSpec& self = info.input_spec(0);
  OpSharding s;
  for (const auto& in : info.inputs()) s.input_placements.push_back(in.spec->placements);
  s.output_placements = {without_partial(self.placements)};
  return s;
}

// new_zeros(self, size, ...): the given global size; self's layout when it is self's size,
// replicated otherwise. The size argument becomes the local size.
OpSharding new_rule(const OpInfo& info, bool strided) {
  const DTensorSpec& self = info.input_spec(0);
  const std::vector<int64_t> size = int_list(info, 1);
  // Uninitialised values may take a Partial layout too (as PyTorch's rule does): autograd's
  // AccumulateGrad builds a leaf's gradient with new_empty_strided(...).copy_(grad), which must
  // keep a Partial gradient Partial rather than reduce it.
  const bool empty = info.name() == "aten::new_empty" || info.name() == "aten::new_empty_strided";
  Placements out = size == self.shape ? (empty ? self.placements : without_partial(self.placements)) : replicate(info);
  OpSharding s;
  s.input_placements = {self.placements};
  s.output_placements = {out};
  s.output_shapes = {size};
  const std::vector<int64_t> local = local_shape(info, out, size);
  // new_empty_strided (autograd's CopySlices makes its gradient buffer so) gets the given global
  // strides, and a local piece laid out alike: the as_strided views autograd takes of it next
  // address the elements the global strides say.
  std::vector<int64_t> local_strides;
  if (strided) {
    const std::vector<int64_t> stride = int_list(info, 2);
    s.output_strides = {stride};
    local_strides = local_strides_like(size, stride, local);
    if (local_strides.empty()) local_strides = contiguous_strides(local);
  }
  s.adjust_args = [local, strided, local_strides](torch::jit::Stack& args) {
    args[1] = c10::IValue(local);
    if (strided) args[2] = c10::IValue(local_strides);
  };
  return s;
}

OpSharding keep_self_rule(const OpInfo& info) {
  const DTensorSpec& self = info.input_spec(0);
  OpSharding s;
  for (const auto& in : info.inputs()) s.input_placements.push_back(in.arg == 0 ? self.placements : replicate(info));
  s.output_placements = {self.placements};
  return s;
}

// fill_ of a Partial(sum) tensor: the value once, on coordinate 0 (the additive rule zeroes the
// scalar operand elsewhere).
OpSharding fill_rule(const OpInfo& info) {
  if (info.input_spec(0).has_partial()) return pointwise_sharding(info, Linearity::Additive);
  return keep_self_rule(info);
}

// copy_ overwrites self: the source takes self's layout (a Partial self gets a Partial source,
// a replicated source becomes Partial by zeros off coordinate 0). A Partial source copied across a
// cast that does not commute with the sum (into integers or bool) would truncate each addend.
OpSharding copy_rule(const OpInfo& info) {
  const DTensorSpec* self = info.spec(0);
  const DTensorSpec* src = info.spec(1);
  if (self != nullptr && src != nullptr && src->has_partial()) {
    HP_CHECK_T(c10::ValueError, !self->has_partial() || (is_float_like(self->dtype) && is_float_like(src->dtype)),
               "hyper_parallel::dispatch: ", info.describe(), ": copying a Partial value from ", src->dtype,
               " into a Partial ", self->dtype, " tensor would round each rank's addend on its own; "
               "redistribute the source to Replicate first");
  }
  return pointwise_sharding(info, Linearity::Additive);
}

// Whole-tensor consumers: gather everything, run locally.
OpSharding replicated_inputs(const OpInfo& info) {
  OpSharding s;
  s.input_placements.assign(info.inputs().size(), replicate(info));
  s.output_placements.assign(info.schema().returns().size(), replicate(info));
  return s;
}

// Ops whose result at a position depends on positions along `dims` (negative: from the end).
OpSharding positional_rule(const OpInfo& info, std::vector<int64_t> dims, bool linear) {
  const DTensorSpec& self = info.input_spec(0);
  for (auto& d : dims) d = wrap_dim(d, self.ndim());
  Placements want = without_shards(self.placements, [&](int64_t d) {
    return std::find(dims.begin(), dims.end(), d) != dims.end();
  });
  if (!linear) want = without_partial(want);
  OpSharding s;
  for (const auto& in : info.inputs()) s.input_placements.push_back(in.arg == 0 ? want : replicate(info));
  s.output_placements = {want};
  // Explicit: several of these (flip, index_select) have no meta kernel in libtorch 1.13.
  std::vector<int64_t> shape = self.shape;
  if (info.name() == "aten::index_select") shape[static_cast<size_t>(dims[0])] = info.spec(2) ? info.spec(2)->numel() : info.arg(2).toTensor().numel();
  s.output_shapes = {shape};
  return s;
}

// sort / topk: the values along `dim` must all be on one rank; other dims keep their shards.
// Several returns (values, indices) laid out alike; the shapes come from the meta kernels.
OpSharding along_dim_rule(const OpInfo& info, size_t dim_arg) {
  const DTensorSpec& self = info.input_spec(0);
  const int64_t dim = wrap_dim(info.arg(dim_arg).toInt(), self.ndim());
  Placements want = without_partial(without_shards(self.placements, [dim](int64_t d) { return d == dim; }));
  OpSharding s;
  s.input_placements = {want};
  s.output_placements.assign(info.schema().returns().size(), want);
  return s;
}

// Ops indexing with another tensor (gather, scatter, index_put_, index_add_, repeat): every input
// whole; the result replicated (shape given: several have no meta kernel in libtorch 1.13).
OpSharding indexed_rule(const OpInfo& info, std::vector<int64_t> shape) {
  OpSharding s = replicated_inputs(info);
  if (info.written_arg() < 0) s.output_shapes = {std::move(shape)};
  return s;
}

struct TensorOpsRegistrar {
  TensorOpsRegistrar() {
    register_sharding_rule("aten::sort", [](const OpInfo& i) { return along_dim_rule(i, 1); });
    register_sharding_rule("aten::sort.stable", [](const OpInfo& i) { return along_dim_rule(i, 2); });
    register_sharding_rule("aten::topk", [](const OpInfo& i) { return along_dim_rule(i, 2); });
    register_sharding_rule("aten::roll", [](const OpInfo& i) {
      std::vector<int64_t> dims = int_list(i, 2);
      if (dims.empty())  // roll of the flattened tensor
        for (int64_t d = 0; d < i.input_spec(0).ndim(); ++d) dims.push_back(d);
      return positional_rule(i, dims, true);
    });
    register_sharding_rule("aten::repeat", [](const OpInfo& i) {
      const auto reps = int_list(i, 1);
      std::vector<int64_t> shape = i.input_spec(0).shape;
      shape.insert(shape.begin(), reps.size() - std::min(reps.size(), shape.size()), 1);
      for (size_t k = 0; k < shape.size(); ++k) shape[k] *= reps[k];
      return indexed_rule(i, shape);
    });
    register_sharding_rule("aten::gather", [](const OpInfo& i) {
      const DTensorSpec* index = i.spec(2);
      return indexed_rule(i, index ? index->shape : i.arg(2).toTensor().sizes().vec());
    });
    for (const char* n : {"aten::scatter", "aten::scatter_add", "aten::scatter_", "aten::scatter_add_",
                          "aten::index_put_", "aten::index_put", "aten::_index_put_impl_", "aten::index_add",
                          "aten::index_add_", "aten::index_fill_", "aten::index_fill"})
      register_sharding_rule(n, [](const OpInfo& i) { return indexed_rule(i, i.input_spec(0).shape); });
    // rand_like and randn_like draw from the layout-independent generator (ops/random.cpp).
    for (const char* n : {"aten::empty_like", "aten::zeros_like", "aten::ones_like", "aten::full_like"})
      register_sharding_rule(n, like_rule);
    for (const char* n : {"aten::new_empty", "aten::new_zeros", "aten::new_ones", "aten::new_full"})
      register_sharding_rule(n, [](const OpInfo& i) { return new_rule(i, false); });
    register_sharding_rule("aten::new_empty_strided", [](const OpInfo& i) { return new_rule(i, true); });
    register_sharding_rule("aten::zero_", keep_self_rule);
    register_sharding_rule("aten::fill_", fill_rule);
    register_sharding_rule("aten::copy_", copy_rule);
    register_sharding_rule("aten::_local_scalar_dense", replicated_inputs);
    register_sharding_rule("aten::equal", replicated_inputs);
    register_sharding_rule("aten::allclose", replicated_inputs);
    register_sharding_rule("aten::triu", [](const OpInfo& i) { return positional_rule(i, {-2, -1}, true); });
    register_sharding_rule("aten::tril", [](const OpInfo& i) { return positional_rule(i, {-2, -1}, true); });
    register_sharding_rule("aten::triu_", [](const OpInfo& i) { return positional_rule(i, {-2, -1}, true); });
    register_sharding_rule("aten::tril_", [](const OpInfo& i) { return positional_rule(i, {-2, -1}, true); });
    register_sharding_rule("aten::cumsum", [](const OpInfo& i) { return positional_rule(i, {i.arg(1).toInt()}, true); });
    register_sharding_rule("aten::flip", [](const OpInfo& i) { return positional_rule(i, int_list(i, 1), true); });
    register_sharding_rule("aten::index_select", [](const OpInfo& i) { return positional_rule(i, {i.arg(1).toInt()}, true); });
  }
} tensor_ops_registrar;

}  // namespace
}  // namespace ops
}  // namespace hyper_parallel
