#pragma once
// A Qwen3.5 model from an HF checkpoint directory (config.json + safetensors, the text layout or
// the published vision-language one), split over a tensor-parallel mesh when one is given: built
// on meta, parallelized, then every rank loads only its shards. And back: a text checkpoint that
// transformers' Qwen3_5ForCausalLM loads.
#include <hyper_parallel/checkpoint/hf_checkpoint.h>
#include <hyper_parallel/mesh/device_mesh.h>
#include <hyper_parallel/models/pretrained.h>

#include <string>

#include <hyper_parallel/models/qwen3_5/model.h>

namespace hyper_parallel {
namespace qwen3_5 {

using Pretrained = hyper_parallel::models::Pretrained<CausalLM>;

/// The model of `config` in `dtype` on the meta device, with parallelize_qwen3_5_tp without
/// sequence parallelism when `tp_mesh` is given: ready for to_empty or init_parameters.
CausalLM build_meta_model(const Config& config, const c10::optional<hyper_parallel::DeviceMesh>& tp_mesh,
                          at::ScalarType dtype = at::kFloat);

/// Reads `dir`/config.json, builds the model on meta in `dtype` (split over `tp_mesh` when
/// given), allocates this rank's shards on `device` and loads the checkpoint straight into them
/// (hf_load_options: the vision tower and MTP head of a published checkpoint are skipped). The
/// model is in eval mode. e.g. `auto m = qwen3_5::from_pretrained("Qwen3.5-27B", tp);`
Pretrained from_pretrained(const std::string& dir, const c10::optional<hyper_parallel::DeviceMesh>& tp_mesh,
                           at::ScalarType dtype = at::kFloat, const std::string& device = "cpu", bool progress = true);

/// Saves `model` (parallelized or not) in `dir` as a text checkpoint (model.*, in_proj_qkv and
/// conv1d fused again from their q/k/v sections) with config_to_json's config.json, and
/// `tokenizer_json` as tokenizer.json when not empty. Collective.
hyper_parallel::HFSaveReport save_pretrained(CausalLMImpl& model, const std::string& dir, const std::string& tokenizer_json = "",
                                             c10::optional<at::ScalarType> dtype = c10::nullopt);

}  // namespace qwen3_5
}  // namespace hyper_parallel
