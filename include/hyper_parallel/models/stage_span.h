#pragma once
// The part of a decoder-only model one pipeline stage holds, shared by the model families.
#include <cstdint>

namespace hyper_parallel {
namespace models {

/// Decoder layers [first_layer, end_layer), the token embedding (the first stage) and the final
/// norm and lm_head (the last). The default is the whole model.
struct StageSpan {
  int64_t first_layer = 0;
  int64_t end_layer = -1;  ///< -1: num_layers
  bool embedding = true;
  bool head = true;
};

/// Stage `stage` of `num_stages` of a model of `num_layers` layers: the layers split into
/// contiguous runs as evenly as possible (the earlier stages take one more), the embedding on
/// stage 0, norm and lm_head on the last. c10::ValueError, as hyper_parallel::<caller>, when a
/// stage would get no layer or the model ties lm_head to the embedding (the two would live on
/// different stages).
StageSpan pipeline_stage_span(int64_t num_layers, bool tie_word_embeddings, int64_t stage, int64_t num_stages,
                              const char* caller = "models::pipeline_stage_span");

}  // namespace models
}  // namespace hyper_parallel
