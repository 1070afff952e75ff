#pragma once
// What tensor_parallel/ remembers about a module (kept in nn::Module::state<>()). Internal.
#include <string>

#include <hyper_parallel/nn/module.h>

namespace hyper_parallel {

struct TpModuleState {
  bool distributed = false;  // distribute_module ran: parameters are distributed once
  std::string fqn;           // its name in the model (e.g. "layers.0.attn.q_proj"), for messages
};

}  // namespace hyper_parallel
