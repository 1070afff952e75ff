#pragma once
// A Qwen3 model from an HF checkpoint directory (config.json + safetensors), split over a
// tensor-parallel mesh when one is given: the model is built, parallelized, then every rank loads
// only its shards.
#include <hyper_parallel/checkpoint/hf_checkpoint.h>
#include <hyper_parallel/mesh/device_mesh.h>
#include <hyper_parallel/models/pretrained.h>

#include <string>

#include <hyper_parallel/models/qwen3/model.h>

namespace hyper_parallel {
namespace qwen3 {

using Pretrained = hyper_parallel::models::Pretrained<CausalLM>;

/// The model of `config` in `dtype` on the meta device (shapes only), with the Qwen TP plan
/// without sequence parallelism when `tp_mesh` is given: ready for to_empty or init_parameters.
/// A Qwen3-MoE model's experts are then split over the same ranks, which hold the same tokens:
/// ExpertParallel("all_reduce") when num_experts divides by tp, else expert TensorParallel.
CausalLM build_meta_model(const Config& config, const c10::optional<hyper_parallel::DeviceMesh>& tp_mesh,
                          at::ScalarType dtype = at::kFloat);

/// build_meta_model, then init_parameters on `device`: each rank allocates and draws only its
/// shards, which equal one process's for the same hyper_parallel::manual_seed.
CausalLM build_model(const Config& config, const c10::optional<hyper_parallel::DeviceMesh>& tp_mesh,
                     at::ScalarType dtype = at::kFloat, const std::string& device = "cpu");

/// Reads `dir`/config.json, builds the model on meta in `dtype`, applies the Qwen TP plan without
/// sequence parallelism (generation decodes one position at a time) when `tp_mesh` is given,
/// allocates this rank's shards on `device` and loads the checkpoint straight into them (a load
/// over a second prints its progress on rank 0 unless `progress` is false). The model is in eval mode, as transformers' (no dropout). e.g. `auto m = qwen3::from_pretrained("out", tp, at::kFloat);`
Pretrained from_pretrained(const std::string& dir, const c10::optional<hyper_parallel::DeviceMesh>& tp_mesh,
                           at::ScalarType dtype = at::kFloat, const std::string& device = "cpu", bool progress = true);

/// Saves `model` (parallelized or not) as an HF checkpoint in `dir` with its config.json, and
/// `tokenizer_json` as tokenizer.json when not empty. Collective.
hyper_parallel::HFSaveReport save_pretrained(CausalLMImpl& model, const std::string& dir, const std::string& tokenizer_json = "",
                                             c10::optional<at::ScalarType> dtype = c10::nullopt);

}  // namespace qwen3
}  // namespace hyper_parallel
