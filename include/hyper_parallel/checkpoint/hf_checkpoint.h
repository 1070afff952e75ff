#pragma once
// Hugging Face checkpoints (safetensors, one file or sharded with model.safetensors.index.json)
// read straight into a parallelized model's shards, and written from it as one consolidated
// checkpoint that transformers' from_pretrained loads.
#include <torch/nn/module.h>

#include <c10/util/Optional.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace hyper_parallel {

/// A model's parameter or buffer name (its FQN) to its name in the checkpoint; "" means the
/// checkpoint does not store it. Empty: the names are the same. A name with a `*` maps one
/// tensor to many: the checkpoint holds one tensor per index i of its dim 0, named with i in
/// place of the `*` (stacked experts [E, I, H] from HF's per-expert `experts.<e>.gate_proj.weight`
/// [I, H]); a rank reads and writes only the indices of its own shard. A name ending in `[a:b]`
/// maps the tensor to rows a..b-1 (dim 0) of one checkpoint tensor that several parameters share
/// (a fused projection held as separate parameters, e.g. the q, k and v sections of
/// `in_proj_qkv.weight[0:2048]`, `[2048:4096]`, `[4096:6144]`): the ranges of one name must tile
/// its rows exactly, and a save writes them as one tensor. `[:, a:b]` is the same for dim 1, on
/// load only (the gate and up halves of a fused `experts.gate_up_proj` [E, 2I, H]). A name may list
/// alternatives as `a|b`: a load reads the first one the checkpoint holds, a save writes the first.
/// e.g. `[](const std::string& fqn) { return fqn.rfind("lm_head", 0) == 0 ? fqn : "model." + fqn; }`
using CheckpointKeyMap = std::function<std::string(const std::string& fqn)>;

/// Options of load_hf_checkpoint.
struct HFLoadOptions {
  CheckpointKeyMap key_map;
  /// Tensors in the checkpoint that no parameter claims are an error (true) or skipped (false).
  bool strict = true;
  /// Regular expressions (ECMAScript, searched in the name, as transformers'
  /// `_keys_to_ignore_on_load_unexpected`): tensors that no parameter claims and whose name matches
  /// one are skipped, and counted in HFLoadReport::ignored, even when strict (a vision-language
  /// checkpoint's vision tower read into its text model: {"^model\\.visual\\.", "^mtp\\."}).
  std::vector<std::string> ignore;
  /// A load that takes more than a second prints its progress on rank 0's stderr, at most once a
  /// second ("files, GB done, GB/s"; this rank's bytes), and a last line when done.
  bool progress = true;
};

/// What one rank did in load_hf_checkpoint.
struct HFLoadReport {
  int64_t tensors = 0;      // parameters loaded (tied ones once)
  int64_t bytes_read = 0;   // bytes of this rank's slices in the files (in the files' dtypes)
  int64_t local_bytes = 0;  // bytes of this rank's local shards (in the model's dtypes)
  int64_t ignored = 0;      // checkpoint tensors skipped by HFLoadOptions::ignore
  std::vector<std::string> files;
};

/// Loads a Hugging Face safetensors checkpoint (`path` is a directory holding
/// model.safetensors.index.json or model.safetensors, or one .safetensors file) into `model`,
/// whatever its placements: each rank copies only the box of each tensor that its local shard
/// holds, straight from the memory-mapped file, casting element by element (a bf16 file into an
/// fp32 model is never materialised whole). Parameters that share one tensor (tied embeddings)
/// load once, from the first of their names that the checkpoint has. All or nothing: every file
/// header is validated, every key, shape and dtype kind checked, and the ranks agree, before any
/// parameter is written; a missing or unexpected key, a shape mismatch or a corrupt or truncated
/// file raises c10::ValueError on every rank naming the file and the tensor, and leaves every
/// model unchanged. Collective over the world when a process group is initialized and the model
/// holds DTensors; a model of plain tensors loads on the calling rank alone.
/// e.g. `hp::load_hf_checkpoint(*model, "Qwen3-0.6B", {qwen3::hf_key});`
HFLoadReport load_hf_checkpoint(torch::nn::Module& model, const std::string& path, const HFLoadOptions& options = {});

/// Options of save_hf_checkpoint.
struct HFSaveOptions {
  CheckpointKeyMap key_map;
  /// Files are split so that none holds more than this many bytes of tensors (a larger single
  /// tensor gets a file of its own), as transformers' max_shard_size.
  int64_t max_shard_size = 5'000'000'000;
  /// Floating-point tensors are written in this dtype (e.g. at::kBFloat16); default: their own.
  c10::optional<at::ScalarType> dtype;
  /// More files written into the checkpoint with it, in the same transaction (e.g. "config.json").
  std::map<std::string, std::string> extra_files;
  /// A save whose writes take more than a second print their progress on rank 0's stderr.
  bool progress = true;
};

/// What save_hf_checkpoint wrote.
struct HFSaveReport {
  int64_t bytes_written = 0;  // tensor bytes this rank wrote
  std::vector<std::string> files;
};

/// Writes every parameter and buffer of `model` (tied ones once) as one consolidated HF checkpoint
/// in directory `dir`: model.safetensors, or model-0000i-of-0000n.safetensors plus
/// model.safetensors.index.json. Each rank writes the boxes of its own shards into the shared files
/// (a replicated box by the lowest mesh coordinate only); nothing is gathered. A transaction: the
/// files are written and fsynced in a new directory beside `dir`, which then atomically replaces
/// `dir` (a rename exchange); files of the old `dir` that the new checkpoint does not replace
/// (a tokenizer.json, ...) are carried over. A crash, a full disk or an error on any rank leaves
/// the previous `dir` whole, and raises on every rank that is alive. `dir` must be on a file system
/// that every rank sees. Collective over the world when a process group is initialized and the
/// model holds DTensors; a model of plain tensors is saved by the calling rank alone.
/// e.g. `hp::save_hf_checkpoint(*model, "out", {qwen3::hf_key, 2'000'000'000, at::kBFloat16});`
HFSaveReport save_hf_checkpoint(torch::nn::Module& model, const std::string& dir, const HFSaveOptions& options = {});

}  // namespace hyper_parallel
