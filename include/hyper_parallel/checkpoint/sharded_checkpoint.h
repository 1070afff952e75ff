#pragma once
// Sharded checkpoints: every rank saves its own shards; loading reassembles whatever layout the
// target model has now (tp=2 -> tp=1, tp=1 -> tp=2, dp x tp -> tp, ...).
#include <torch/nn/module.h>
#include <torch/ordered_dict.h>

#include <string>

namespace hyper_parallel {

/// Writes `dir/rank_<r>.pt` (this rank's local shards of every parameter and buffer) and
/// `dir/rank_<r>.meta` (for each shard: name, dtype, global shape, offset and shape of the piece,
/// and the byte size of the .pt file); rank 0 also writes `dir/metadata` (names, dtypes, global
/// shapes, world size). Partial values are reduced first. Collective: every rank calls it. A model
/// without DTensors is written by rank 0 alone, as a 1-rank checkpoint.
/// e.g. `hp::save_sharded(*model, "ckpt/step_100");`
void save_sharded(torch::nn::Module& model, const std::string& dir);

/// Loads `dir` into `model`'s current layout: each rank reads the saved pieces that overlap its
/// shards. Everything is checked and read before anything is written, so a failure leaves the
/// model as it was: a key the checkpoint lacks, a shape or dtype that differs (named with both
/// shapes), pieces missing for part of a tensor (a rank file absent: another world layout), or a
/// truncated/corrupt file (named) raise c10::ValueError.
void load_sharded(torch::nn::Module& model, const std::string& dir);

/// Every parameter and buffer whole, on rank 0 (other ranks get an empty dict); torch::save can
/// write the tensors. Collective over the meshes of DTensor parameters.
torch::OrderedDict<std::string, at::Tensor> full_state_dict(torch::nn::Module& model);

}  // namespace hyper_parallel
