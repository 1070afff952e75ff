#pragma once
// The backward of an embedding whose table is sharded on its vocabulary (internal to
// tensor_parallel/): each rank computes only the gradient rows it holds, as a Shard(0) gradient.
// Autograd's own backward of the lookup (embedding_dense_backward) sees the vocabulary's size but
// not which rows this rank holds, so it would build the whole vocabulary's gradient on every rank.
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace hyper_parallel {

/// `output`, a vocabulary-sharded lookup of `ids` (a DTensor that is Partial on the mesh dims
/// that shard the table's rows), with its gradient edge to the table rerouted through a backward
/// that computes this rank's rows only. `padding_idx` (-1 for none) and `scale_grad_by_freq` are
/// the lookup's. Returns `output` unchanged when it carries no gradient or is not such a lookup.
at::Tensor with_vocab_parallel_backward(const at::Tensor& output, const at::Tensor& ids, int64_t padding_idx,
                                        bool scale_grad_by_freq);

}  // namespace hyper_parallel
