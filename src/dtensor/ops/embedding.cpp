// Embedding lookups: a replicated table follows the indices' sharding; a table sharded on the
// embedding dim (Colwise) gives a result sharded on its last dim; a table sharded on the vocab
// (Rowwise) is looked up with a mask so that the Partial(sum) result is exact.
#include <hyper_parallel/runtime/device_checks.h>

#include "rule_utils.h"

namespace hyper_parallel {
namespace ops {
namespace {

// embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse)
OpSharding embedding_rule(const OpInfo& info) {
  const DTensorSpec& w = info.input_spec(0);
  const DTensorSpec* idx = info.spec(1);
  HP_CHECK_T(c10::ValueError, idx != nullptr, "hyper_parallel::dispatch: ", info.describe(),
             ": the indices must be a DTensor too (e.g. DTensor::from_local(ids, mesh, {Replicate()}))");
  const size_t nmesh = w.placements.size();
  const int64_t out_nd = idx->ndim() + 1;
  Placements pw(nmesh), pi(nmesh), out(nmesh);
  bool vocab_sharded = false;
  for (size_t i = 0; i < nmesh; ++i) {
    const Placement& a = w.placements[i];
    const Placement& b = idx->placements[i];
    if (a.is_shard(0)) {
      pw[i] = a; pi[i] = Replicate(); out[i] = Partial();
      vocab_sharded = true;
    } else if (a.is_shard(1)) {
      pw[i] = a; pi[i] = Replicate(); out[i] = Shard(out_nd - 1);
    } else {
      pw[i] = Replicate();
      pi[i] = b.is_shard() ? b : Replicate();
      out[i] = pi[i];
    }
  }
  OpSharding s;
  s.input_placements = {pw, pi};
  s.output_placements = {out};
  std::vector<int64_t> shape = idx->shape;
  shape.push_back(w.shape[1]);
  s.output_shapes = {shape};
  if (vocab_sharded) {
    auto [local, offset] = compute_local_shape_and_offset(w.shape, info.mesh_shape(), info.coordinate(), pw);
    const int64_t begin = offset[0], rows = local[0], vocab = w.shape[0];
    s.kernel = kernel_returning([begin, rows, vocab](const torch::jit::Stack& a) {
      const at::Tensor& weight = a[0].toTensor();
      const at::Tensor& ids = a[1].toTensor();
      // The ids are replicated, so every rank reaches the same verdict; as plain libtorch, an id
      // outside the vocabulary is an IndexError (not a row of zeros); on an accelerator without a
      // host sync (see check_index). Meta ids have no values to check.
      if (ids.numel() > 0 && !ids.is_meta())
        check_index(ids.min().ge(0).logical_and_(ids.max().lt(vocab)), [vocab] {
          return c10::str("index out of range in self: an embedding id is outside [0, ", vocab, ") (vocab-sharded Embedding)");
        });
      // Rows this rank does not hold contribute exact zeros to the sum.
      // bitwise_or: it has a meta kernel (logical_or has none in C++), the same on bools.
      at::Tensor outside = (ids < begin).bitwise_or_(ids >= begin + rows);
      std::vector<int64_t> shape = ids.sizes().vec();
      shape.push_back(weight.size(1));
      if (rows == 0) return at::zeros(shape, weight.options());
      at::Tensor local_ids = (ids - begin).masked_fill_(outside, 0);
      return at::embedding(weight, local_ids).masked_fill_(outside.unsqueeze(-1), 0);
    });
  }
  return s;
}

// embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq)
OpSharding embedding_backward_rule(const OpInfo& info) {
  const DTensorSpec& g = info.input_spec(0);
  const DTensorSpec* idx = info.spec(1);
  HP_CHECK_T(c10::ValueError, idx != nullptr, "hyper_parallel::dispatch: ", info.describe(), ": indices must be a DTensor");
  const size_t nmesh = g.placements.size();
  const int64_t last = g.ndim() - 1;
  Placements pg(nmesh), pi(nmesh), out(nmesh);
  for (size_t i = 0; i < nmesh; ++i) {
    const Placement& a = g.placements[i];
    if (a.is_shard(last)) { pg[i] = a; pi[i] = Replicate(); out[i] = Shard(1); }
    else if (a.is_shard()) { pg[i] = a; pi[i] = a; out[i] = Partial(); }  // each rank's rows
    else if (a.is_partial() && a.reduce_op() == ReduceOp::SUM) { pg[i] = a; pi[i] = Replicate(); out[i] = Partial(); }
    else { pg[i] = Replicate(); pi[i] = Replicate(); out[i] = Replicate(); }
  }
  OpSharding s;
  s.input_placements = {pg, pi};
  s.output_placements = {out};
  s.output_shapes = {{info.arg(2).toInt(), g.shape.back()}};
  return s;
}

struct EmbeddingRegistrar {
  EmbeddingRegistrar() {
    register_sharding_rule("aten::embedding", embedding_rule);
    register_sharding_rule("aten::embedding_dense_backward", embedding_backward_rule);
  }
} embedding_registrar;

}  // namespace
}  // namespace ops
}  // namespace hyper_parallel
