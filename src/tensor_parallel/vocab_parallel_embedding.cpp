#include "vocab_parallel_embedding.h"

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/runtime/errors.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/generated/Functions.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <memory>
#include <string>
#include <type_traits>
#include <utility>

namespace hyper_parallel {
namespace {

// The gradient of the table's rows this rank holds, from the output's gradient and the ids.
// Per mesh dim, as the lookup was laid out: where the output is Partial the table is sharded on
// its rows (Shard(0)): every token of the group, this rank's rows; where it is sharded on its
// last dim the table is sharded on its columns (Shard(1)); elsewhere the table is replicated and
// the tokens may be split (a Partial gradient, summed by the parameter's own hook).
class VocabParallelEmbeddingBackward final : public torch::autograd::Node {
 public:
  VocabParallelEmbeddingBackward(const DTensor& output, const at::Tensor& ids, std::vector<int64_t> table_shape,
                                 int64_t padding_idx, bool scale_grad_by_freq)
      : ids_(ids, false), mesh_(output.device_mesh()), output_placements_(output.placements()),
        table_shape_(std::move(table_shape)), padding_idx_(padding_idx), scale_grad_by_freq_(scale_grad_by_freq) {}

  std::string name() const override { return "hyper_parallel::VocabParallelEmbeddingBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    const at::Tensor ids = ids_.unpack();
    if (!grads[0].defined()) return {at::Tensor()};
    HP_CHECK_T(c10::TypeError, is_dtensor(grads[0]), "hyper_parallel::RowwiseParallel: the gradient of a vocabulary-sharded "
               "Embedding's output must be a DTensor, got a plain tensor");
    const DTensor grad(grads[0]);
    const DTensor id = is_dtensor(ids) ? DTensor(ids) : DTensor::from_local(ids, mesh_, Placements(static_cast<size_t>(mesh_.ndim()), Replicate()));
    const int64_t last = grad.dim() - 1;
    const size_t n = static_cast<size_t>(mesh_.ndim());
    Placements pg(n), pi(n), out(n);
    for (size_t i = 0; i < n; ++i) {
      const Placement& o = output_placements_[i];
      const Placement& g = grad.placements()[i];
      if (o.is_partial()) {  // the table's rows: every token of the group, this rank's rows
        pg[i] = Replicate(); pi[i] = Replicate(); out[i] = Shard(0);
      } else if (o.is_shard(last)) {  // the table's columns
        pg[i] = o; pi[i] = Replicate(); out[i] = Shard(1);
      } else if (!scale_grad_by_freq_ && g.is_shard() && !g.is_shard(last)) {  // split tokens: each rank's share
        pg[i] = g; pi[i] = g; out[i] = Partial();
      } else if (!scale_grad_by_freq_ && g.is_partial() && g.reduce_op() == ReduceOp::SUM) {
        pg[i] = g; pi[i] = Replicate(); out[i] = Partial();
      } else {  // scale_grad_by_freq counts every token of the batch
        pg[i] = Replicate(); pi[i] = Replicate(); out[i] = Replicate();
      }
    }
    const at::Tensor g_local = grad.redistribute(pg).to_local();
    const at::Tensor ids_local = id.redistribute(pi).to_local();
    Placements rows_of(n);
    for (size_t i = 0; i < n; ++i) rows_of[i] = out[i].is_shard() ? out[i] : Replicate();
    const auto [local, offset] = compute_local_shape_and_offset(table_shape_, mesh_.shape(), *mesh_.get_coordinate(), rows_of);
    const int64_t begin = offset[0], rows = local[0];
    // Ids of other ranks' rows go to one extra row, dropped after: they contribute nothing here,
    // and scale_grad_by_freq's counts of this rank's rows stay those of the whole batch.
    const at::Tensor outside = (ids_local < begin).bitwise_or_(ids_local >= begin + rows);
    const at::Tensor local_ids = (ids_local - begin).masked_fill_(outside, rows);
    const int64_t padding = padding_idx_ >= begin && padding_idx_ < begin + rows ? padding_idx_ - begin : -1;
    const at::Tensor g = at::embedding_dense_backward(g_local, local_ids, rows + 1, padding, scale_grad_by_freq_).narrow(0, 0, rows);
    return {DTensor::from_local(g, mesh_, out, false, at::IntArrayRef(table_shape_))};
  }

  void release_variables() override { ids_.reset_data(); }

 private:
  torch::autograd::SavedVariable ids_;
  DeviceMesh mesh_;
  Placements output_placements_;
  std::vector<int64_t> table_shape_;
  int64_t padding_idx_;
  bool scale_grad_by_freq_;
};

// torch holds autograd nodes in std::shared_ptr up to 2.11 and in c10::intrusive_ptr since.
using NodePtr = std::decay_t<decltype(std::declval<const at::Tensor&>().grad_fn())>;
template <class Ptr>
struct NodeMaker;
template <>
struct NodeMaker<std::shared_ptr<torch::autograd::Node>> {
  template <class N, class... Args>
  static std::shared_ptr<torch::autograd::Node> make(Args&&... args) {
    return std::make_shared<N>(std::forward<Args>(args)...);
  }
};
template <class Ptr>
struct NodeMaker {  // c10::intrusive_ptr<Node>
  template <class N, class... Args>
  static Ptr make(Args&&... args) {
    return Ptr(c10::make_intrusive<N>(std::forward<Args>(args)...));
  }
};

}  // namespace

at::Tensor with_vocab_parallel_backward(const at::Tensor& output) {
  if (!is_dtensor(output) || !output.requires_grad() || output.grad_fn() == nullptr) return output;
  // Only the lookup's own node is rerouted, with what it saved (the ids it looked up, whatever the
  // module did to them first; its padding row and options): a module that computes after the
  // lookup (a scale) keeps autograd's backward.
  const auto* lookup = dynamic_cast<const torch::autograd::generated::EmbeddingBackward0*>(output.grad_fn().get());
  if (lookup == nullptr || lookup->sparse) return output;
  const DTensor out(output);
  bool vocab_sharded = false;
  for (const Placement& p : out.placements()) vocab_sharded = vocab_sharded || p.is_partial();
  if (!vocab_sharded) return output;
  // The lookup's one edge is the table's (the ids take no gradient). Whatever produced the table
  // (the parameter, or FSDP's gathered copy) keeps receiving its gradient.
  const torch::autograd::Edge& table = lookup->next_edge(0);
  if (!table.is_valid()) return output;
  const auto dims = table.function->input_metadata(table.input_nr).shape_as_dim_vector();
  std::vector<int64_t> table_shape;
  for (const auto& d : dims) table_shape.push_back(d.expect_int());
  if (table_shape.size() != 2) return output;
  const at::Tensor ids = lookup->indices_.unpack();
  NodePtr node = NodeMaker<NodePtr>::make<VocabParallelEmbeddingBackward>(out, ids, std::move(table_shape), lookup->padding_idx.expect_int(),
                                                                          lookup->scale_grad_by_freq);
  node->set_next_edges({table});
  at::Tensor rerouted = output.detach();
  torch::autograd::set_history(rerouted, node);
  return rerouted;
}

}  // namespace hyper_parallel
