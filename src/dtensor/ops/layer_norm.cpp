// native_layer_norm and its backward: the normalised (trailing) dims whole on every rank, any
// leading (batch / sequence) dim may stay sharded; the weight and bias replicated; their
// gradients Partial(sum) over the mesh dims that shard the batch/sequence.
#include "rule_utils.h"

namespace hyper_parallel {
namespace ops {
namespace {

// Input placements: Shards of normalised dims and Partials are removed.
Placements layer_norm_input(const DTensorSpec& in, int64_t normalized_ndim) {
  const int64_t first = in.ndim() - normalized_ndim;
  return without_partial(without_shards(in.placements, [first](int64_t d) { return d >= first; }));
}

std::vector<int64_t> stats_shape(const std::vector<int64_t>& shape, int64_t normalized_ndim) {
  std::vector<int64_t> s = shape;
  for (size_t k = shape.size() - static_cast<size_t>(normalized_ndim); k < shape.size(); ++k) s[k] = 1;
  return s;
}

// native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd)
OpSharding forward_rule(const OpInfo& info) {
  const DTensorSpec& in = info.input_spec(0);
  const int64_t nn = static_cast<int64_t>(int_list(info, 1).size());
  const Placements x = layer_norm_input(in, nn);
  OpSharding s;
  for (const auto& input : info.inputs()) s.input_placements.push_back(input.arg == 0 ? x : replicate(info));
  s.output_placements = {x, x, x};
  s.output_shapes = {in.shape, stats_shape(in.shape, nn), stats_shape(in.shape, nn)};
  return s;
}

// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?, bias?,
// output_mask) -> (grad_input, grad_weight, grad_bias)
OpSharding backward_rule(const OpInfo& info) {
  const DTensorSpec& in = info.input_spec(1);
  const auto normalized = int_list(info, 2);
  const int64_t nn = static_cast<int64_t>(normalized.size());
  const Placements x = layer_norm_input(in, nn);
  OpSharding s;
  for (const auto& input : info.inputs())
    s.input_placements.push_back(input.arg <= 4 ? x : replicate(info));
  // Each rank's weight gradient sums over its own rows only.
  Placements param(x.size());
  for (size_t i = 0; i < x.size(); ++i) param[i] = x[i].is_shard() ? Partial() : Replicate();
  s.output_placements = {x, param, param};
  s.output_shapes = {in.shape, normalized, normalized};
  return s;
}

struct LayerNormRegistrar {
  LayerNormRegistrar() {
    register_sharding_rule("aten::native_layer_norm", forward_rule);
    register_sharding_rule("aten::native_layer_norm_backward", backward_rule);
  }
} layer_norm_registrar;

}  // namespace
}  // namespace ops
}  // namespace hyper_parallel
