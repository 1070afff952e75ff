#pragma once
// The MLP every Qwen family's decoder layer shares, now nn::SwiGLUMlp (the mixture-of-experts
// block's shared expert is one too); these names stay for one release.
#include <hyper_parallel/nn/swiglu_mlp.h>

namespace hyper_parallel {
namespace models {

using SwiGLUMlpImpl [[deprecated("use hyper_parallel::nn::SwiGLUMlpImpl")]] = nn::SwiGLUMlpImpl;
using SwiGLUMlp [[deprecated("use hyper_parallel::nn::SwiGLUMlp")]] = nn::SwiGLUMlp;

}  // namespace models
}  // namespace hyper_parallel
