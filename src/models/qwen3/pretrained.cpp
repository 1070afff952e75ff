#include <hyper_parallel/models/qwen3/pretrained.h>

#include <ATen/ATen.h>

#include <hyper_parallel/nn/init_parameters.h>

#include <hyper_parallel/models/qwen3/config.h>
#include <hyper_parallel/models/qwen3/parallelize.h>

namespace hyper_parallel {
namespace qwen3 {

CausalLM build_meta_model(const Config& config, const c10::optional<hyper_parallel::DeviceMesh>& tp_mesh, at::ScalarType dtype) {
  CausalLM model{nullptr};
  {
    hnn::ParameterScope meta(at::TensorOptions().device(at::kMeta).dtype(dtype));
    model = CausalLM(config);
  }
  if (tp_mesh) {
    parallelize_qwen3_tp(*model, *tp_mesh, /*sequence_parallel=*/false);
    // Every tp rank holds the same tokens: its experts run on them and the outputs are summed
    // (vLLM's layout); experts that do not divide over tp are split by columns instead.
    if (config.is_moe() && tp_mesh->size() > 1)
      parallelize_qwen3_experts(*model, *tp_mesh, /*tensor_parallel=*/config.num_experts % tp_mesh->size() != 0, "all_reduce");
  }
  return model;
}

CausalLM build_model(const Config& config, const c10::optional<hyper_parallel::DeviceMesh>& tp_mesh, at::ScalarType dtype,
                     const std::string& device) {
  CausalLM model = build_meta_model(config, tp_mesh, dtype);
  hyper_parallel::init_parameters(*model, device);
  return model;
}

Pretrained from_pretrained(const std::string& dir, const c10::optional<hyper_parallel::DeviceMesh>& tp_mesh, at::ScalarType dtype,
                           const std::string& device, bool progress) {
  Pretrained out;
  // Shapes first, then this rank's shards only, which the checkpoint fills: no whole tensor and
  // no float32 copy of a 16-bit model is ever made.
  out.model = build_meta_model(load_config(dir + "/config.json"), tp_mesh, dtype);
  hyper_parallel::to_empty(*out.model, device);
  hyper_parallel::HFLoadOptions options;
  options.key_map = hf_key;
  options.progress = progress;
  out.load = hyper_parallel::load_hf_checkpoint(*out.model, dir, options);
  out.model->eval();  // as transformers' from_pretrained: no dropout until train() is called
  return out;
}

hyper_parallel::HFSaveReport save_pretrained(CausalLMImpl& model, const std::string& dir, const std::string& tokenizer_json,
                                             c10::optional<at::ScalarType> dtype) {
  hyper_parallel::HFSaveOptions options;
  options.key_map = hf_key;
  Config c = model.config;
  c.dtype = dtype ? *dtype : model.embed_tokens->weight().scalar_type();
  options.dtype = dtype;
  options.extra_files["config.json"] = config_to_json(c);
  if (!tokenizer_json.empty()) options.extra_files["tokenizer.json"] = tokenizer_json;
  return hyper_parallel::save_hf_checkpoint(model, dir, options);
}

}  // namespace qwen3
}  // namespace hyper_parallel
