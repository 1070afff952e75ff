#pragma once
// One models::CausalLMForGeneration for every model family whose CausalLMImpl has make_cache()
// and forward(ids, models::ForwardContext<its cache>) (internal to the models library).
#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/models/generate.h>

namespace hyper_parallel {
namespace models {

template <class Model, class Cache>
class Generating final : public CausalLMForGeneration {
 public:
  explicit Generating(Model& model) : model_(model) {}
  int64_t vocab_size() const override { return model_.config.vocab_size; }
  int64_t max_position_embeddings() const override { return model_.config.max_position_embeddings; }
  at::Device device() const override { return local_tensor(model_.embed_tokens->weight()).device(); }
  void reset_cache(int64_t batch, int64_t capacity) override { cache_ = model_.make_cache(batch, capacity); }
  at::Tensor forward_step(const at::Tensor& input_ids, const at::Tensor& position_ids, const at::Tensor& key_mask) override {
    ForwardContext<Cache> ctx;  // the model moves its tensors to its device
    ctx.position_ids = position_ids;
    ctx.key_mask = key_mask;
    ctx.cache = &cache_;
    ctx.last_position_only = true;
    return model_.forward(input_ids, ctx);
  }

 private:
  Model& model_;
  Cache cache_;
};

}  // namespace models
}  // namespace hyper_parallel
