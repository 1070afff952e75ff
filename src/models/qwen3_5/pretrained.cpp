#include <hyper_parallel/models/qwen3_5/pretrained.h>

#include <ATen/ATen.h>

#include <hyper_parallel/nn/init_parameters.h>

#include <hyper_parallel/models/qwen3_5/config.h>
#include <hyper_parallel/models/qwen3_5/parallelize.h>

namespace hyper_parallel {
namespace qwen3_5 {

CausalLM build_meta_model(const Config& config, const c10::optional<hyper_parallel::DeviceMesh>& tp_mesh, at::ScalarType dtype) {
  CausalLM model{nullptr};
  {
    hnn::ParameterScope meta(at::TensorOptions().device(at::kMeta).dtype(dtype));
    model = CausalLM(config);
  }
  // Generation decodes one position at a time: no sequence parallelism.
  if (tp_mesh) parallelize_qwen3_5_tp(*model, *tp_mesh, /*sequence_parallel=*/false);
  // Every tp rank holds the same tokens: its experts run on them and the outputs are summed;
  // experts that do not divide over tp are split by columns instead.
  if (tp_mesh && config.is_moe())
    parallelize_qwen3_5_experts(*model, *tp_mesh, /*tensor_parallel=*/config.num_experts % tp_mesh->size() != 0, "all_reduce");
  return model;
}

Pretrained from_pretrained(const std::string& dir, const c10::optional<hyper_parallel::DeviceMesh>& tp_mesh, at::ScalarType dtype,
                           const std::string& device, bool progress) {
  Pretrained out;
  const Config config = load_config(dir + "/config.json");
  out.model = build_meta_model(config, tp_mesh, dtype);
  hyper_parallel::to_empty(*out.model, device);
  hyper_parallel::HFLoadOptions options = hf_load_options(config);
  options.progress = progress;
  out.load = hyper_parallel::load_hf_checkpoint(*out.model, dir, options);
  out.model->eval();
  return out;
}

hyper_parallel::HFSaveReport save_pretrained(CausalLMImpl& model, const std::string& dir, const std::string& tokenizer_json,
                                             c10::optional<at::ScalarType> dtype) {
  Config c = model.config;
  c.vision_language = false;  // the text model alone, as Qwen3_5ForCausalLM saves it
  c.dtype = dtype ? *dtype : model.embed_tokens->weight().scalar_type();
  hyper_parallel::HFSaveOptions options;
  options.key_map = hf_key_map(c);
  options.dtype = dtype;
  options.extra_files["config.json"] = config_to_json(c);
  if (!tokenizer_json.empty()) options.extra_files["tokenizer.json"] = tokenizer_json;
  return hyper_parallel::save_hf_checkpoint(model, dir, options);
}

}  // namespace qwen3_5
}  // namespace hyper_parallel
