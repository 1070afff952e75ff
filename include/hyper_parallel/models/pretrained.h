#pragma once
// What every family's from_pretrained hands back.
#include <hyper_parallel/checkpoint/hf_checkpoint.h>

namespace hyper_parallel {
namespace models {

/// A model loaded from an HF checkpoint (this rank's shards) and what the load read.
template <class Model>
struct Pretrained {
  Model model{nullptr};
  hyper_parallel::HFLoadReport load;
};

}  // namespace models
}  // namespace hyper_parallel
