// Losses on replicated logits: nll_loss (what cross_entropy decomposes into), mse_loss.
#include "rule_utils.h"

namespace hyper_parallel {
namespace ops {
namespace {

OpSharding all_replicated(const OpInfo& info) {
  OpSharding s;
  s.input_placements.assign(info.inputs().size(), replicate(info));
  s.output_placements.assign(info.schema().returns().size(), replicate(info));
  return s;
}

struct Registrar {
  Registrar() {
    for (const char* n : {"aten::nll_loss_forward", "aten::nll_loss_backward", "aten::nll_loss2d_forward",
                          "aten::nll_loss2d_backward", "aten::mse_loss", "aten::mse_loss_backward",
                          "aten::binary_cross_entropy", "aten::binary_cross_entropy_backward"})
      register_sharding_rule(n, all_replicated);
  }
} registrar;

}  // namespace
}  // namespace ops
}  // namespace hyper_parallel
