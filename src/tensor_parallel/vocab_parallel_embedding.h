#pragma once
// The backward of an embedding whose table is sharded on its vocabulary (internal to
// tensor_parallel/): each rank computes only the gradient rows it holds, as a Shard(0) gradient.
// Autograd's own backward of the lookup (embedding_dense_backward) sees the vocabulary's size but
// not which rows this rank holds, so it would build the whole vocabulary's gradient on every rank.
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace hyper_parallel {

/// `output`, a vocabulary-sharded lookup (a DTensor made by at::embedding, Partial on the mesh dims
/// that shard the table's rows), with its gradient edge to the table rerouted through a backward
/// that computes this rank's rows only, from the ids, padding row and options the lookup itself
/// saved. Returns `output` unchanged when it carries no gradient, is not the lookup's own result
/// (a module that computes after it) or is a sparse lookup.
at::Tensor with_vocab_parallel_backward(const at::Tensor& output);

}  // namespace hyper_parallel
