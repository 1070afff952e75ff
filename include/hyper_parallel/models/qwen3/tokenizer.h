#pragma once
// Deprecated: the tokenizer serves every model family now (models/tokenizer.h). These names stay
// for one release.
#include <hyper_parallel/models/tokenizer.h>

namespace hyper_parallel {
namespace qwen3 {

using Tokenizer = hyper_parallel::models::Tokenizer;
using hyper_parallel::models::byte_tokenizer_json;

}  // namespace qwen3
}  // namespace hyper_parallel
