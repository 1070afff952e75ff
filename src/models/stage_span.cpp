#include <hyper_parallel/models/stage_span.h>

#include <hyper_parallel/runtime/errors.h>

#include <algorithm>

namespace hyper_parallel {
namespace models {

StageSpan pipeline_stage_span(int64_t num_layers, bool tie_word_embeddings, int64_t stage, int64_t num_stages, const char* caller) {
  HP_CHECK_T(c10::ValueError, num_stages >= 1 && stage >= 0 && stage < num_stages, "hyper_parallel::", caller, ": stage ", stage,
             " is outside 0 .. ", num_stages - 1);
  HP_CHECK_T(c10::ValueError, num_layers >= num_stages, "hyper_parallel::", caller, ": ", num_layers, " decoder layers cannot give each of ",
             num_stages, " stages at least one");
  HP_CHECK_T(c10::ValueError, !tie_word_embeddings || num_stages == 1, "hyper_parallel::", caller, ": the model ties ",
             "lm_head to embed_tokens (tie_word_embeddings), which would live on the first and the last of ", num_stages,
             " stages; pipeline parallelism needs untied weights");
  const int64_t base = num_layers / num_stages, extra = num_layers % num_stages;
  StageSpan s;
  s.first_layer = stage * base + std::min(stage, extra);
  s.end_layer = s.first_layer + base + (stage < extra ? 1 : 0);
  s.embedding = stage == 0;
  s.head = stage + 1 == num_stages;
  return s;
}

}  // namespace models
}  // namespace hyper_parallel
