#pragma once
// Sharded checkpoints: every rank saves its own shards; loading reassembles whatever layout the
// target model has now (tp=2 -> tp=1, tp=1 -> tp=2, dp x tp -> tp, ...).
#include <torch/nn/module.h>
#include <torch/ordered_dict.h>

#include <string>

namespace hyper_parallel {

/// Options of save_sharded.
struct SaveOptions {
  /// Committed generations kept in the directory (the newest first); older ones are removed
  /// after the new one is committed, never before.
  int64_t keep = 1;
};

/// Saves every parameter and buffer of `model` as a transaction into directory `dir`: a new
/// generation `dir/gen_<n>/` is written beside the committed one (each rank: `rank_<r>.bin` with its
/// local shards' bytes, `rank_<r>.meta` with each piece's box, dtype, byte offset and CRC-32 and the
/// file's size; rank 0:
/// `metadata` with names, dtypes, global shapes, world size), every write checked and fsynced, every
/// file stamped with the checkpoint's id. Only when every rank has written successfully does rank 0
/// commit, by atomically replacing `dir/LATEST`. A crash, a full disk or an error on any rank at any
/// moment leaves the previous checkpoint current and loadable, and raises on every rank that is
/// still alive. Partial values are reduced first. Collective: every rank calls it. A model without
/// DTensors is written by rank 0 alone, as a 1-rank checkpoint.
/// e.g. `hp::save_sharded(*model, "ckpt");` (then `hp::load_sharded(*model, "ckpt");`)
void save_sharded(torch::nn::Module& model, const std::string& dir, const SaveOptions& options = {});

/// Loads the committed generation of `dir` into `model`'s current layout: each rank reads the
/// saved pieces that overlap its shards, and verifies every file's id, size and CRC and every
/// piece's CRC. All or nothing: the ranks agree before anyone writes, so if any rank cannot load
/// (a key the checkpoint lacks, a shape or dtype that differs, a missing, truncated, corrupted or
/// mixed-generation file, all named), every rank raises c10::ValueError and every model is
/// unchanged. Collective when a process group is initialized.
void load_sharded(torch::nn::Module& model, const std::string& dir);

/// The directory of the committed generation of checkpoint `dir` (e.g. to copy or archive it).
std::string checkpoint_generation_dir(const std::string& dir);

/// Every parameter and buffer whole, on rank 0 (other ranks get an empty dict); torch::save can
/// write the tensors. Collective over the meshes of DTensor parameters.
torch::OrderedDict<std::string, at::Tensor> full_state_dict(torch::nn::Module& model);

}  // namespace hyper_parallel
