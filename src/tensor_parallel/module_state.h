#pragma once
// What tensor_parallel/ remembers about a module (kept in nn::Module::state<>()). Internal.
#include <string>

#include <hyper_parallel/nn/module.h>

namespace hyper_parallel {

/// A module's name for messages: its fqn, or "<root>" for the model itself.
inline std::string module_label(const std::string& fqn) { return fqn.empty() ? "<root>" : fqn; }

struct TpModuleState {
  bool distributed = false;  // distribute_module ran: parameters are distributed once
  std::string fqn;           // its name in the model (e.g. "layers.0.attn.q_proj"), for messages
};

}  // namespace hyper_parallel
