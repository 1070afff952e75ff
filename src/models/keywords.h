#pragma once
// HF's keyword arguments of a causal LM's forward (internal to the models library).
#include <hyper_parallel/nn/module.h>
#include <hyper_parallel/runtime/errors.h>

namespace hyper_parallel {
namespace models {

/// The position_ids [B or 1, S] among `kwargs` (undefined when absent); any other keyword, or a
/// value that is no tensor, is refused as hyper_parallel::<caller>.
inline at::Tensor position_ids_keyword(const nn::Kwargs& kwargs, const char* caller) {
  at::Tensor positions;
  for (const auto& [name, value] : kwargs) {
    HP_CHECK_T(c10::ValueError, name == "position_ids" && value.isTensor(), "hyper_parallel::", caller, ": takes the keyword ",
               "position_ids (a tensor) only, got '", name, "'");
    positions = value.toTensor();
  }
  return positions;
}

}  // namespace models
}  // namespace hyper_parallel
