#pragma once
// A decoder's load-balancing loss of one step (internal to the models library): the router
// statistics its sparse blocks gathered, over the ranks that hold the step's other tokens.
#include <hyper_parallel/context_parallel/context_parallel.h>
#include <hyper_parallel/models/stage_span.h>
#include <hyper_parallel/nn/moe.h>
#include <hyper_parallel/runtime/errors.h>

#include <algorithm>

namespace hyper_parallel {
namespace models {

/// Refuses (as hyper_parallel::<caller>), before the statistics are taken, a pipeline stage
/// (transformers pools every layer's statistics before its product: no sum of stages' losses is
/// that objective) and, under context parallelism, a data group without this rank's cp ranks
/// (they hold the same sequences' other tokens).
inline void check_load_balancing_layout(const torch::nn::Module& model, const StageSpan& span, int64_t num_layers,
                                        const Group& data_group, const char* caller) {
  HP_CHECK_T(c10::ValueError, span.first_layer == 0 && span.end_layer == num_layers, "hyper_parallel::", caller,
             ": this pipeline stage holds layers [", span.first_layer, ", ", span.end_layer, ") of ", num_layers,
             "; transformers' load-balancing loss pools every layer's router statistics before its product, so it is no sum ",
             "over stages: train pipeline stages on the cross-entropy alone");
  if (const auto cp = context_parallel_mesh(model); cp && cp->size() > 1) {
    const std::vector<int64_t>& cp_ranks = cp->get_group(0).ranks();
    bool inside = data_group.defined();
    for (int64_t r : cp_ranks)
      inside = inside && std::find(data_group.ranks().begin(), data_group.ranks().end(), r) != data_group.ranks().end();
    HP_CHECK_T(c10::ValueError, inside, "hyper_parallel::", caller, ": the model runs under context parallelism over ranks ",
               c10::IntArrayRef(cp_ranks), ", which hold other tokens of the same sequences, so data_group must contain them ",
               "(e.g. the group of mesh[{\"dp\", \"cp\"}], or of the cp mesh alone); got ",
               data_group.defined() ? c10::str("ranks ", c10::IntArrayRef(data_group.ranks())) : std::string("none"));
  }
}

/// The router statistics every sparse block (`DecoderLayerImpl::moe`) of `layers` gathered, summed
/// over the layers and taken (each block starts afresh).
template <class DecoderLayerImpl>
nn::RouterStatistics take_router_statistics(const nn::ModuleList& layers) {
  nn::RouterStatistics s;
  for (const auto& layer : *layers)
    if (auto moe = layer->template as<DecoderLayerImpl>()->moe) s.add(moe->take_statistics());
  return s;
}

}  // namespace models
}  // namespace hyper_parallel
