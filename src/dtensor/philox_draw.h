#pragma once
// The counter-based draw behind every random op (internal; the values are documented in
// include/hyper_parallel/dtensor/random.h). Element i of a call with key K takes its random bits
// from Philox4x32-10 with key K and counter (i / k, 0), lanes (i % k) * (4 / k) onward, where k is
// how many elements share one 128-bit block (4 for 32-bit draws, 2 for 64-bit ones, 1 for 128).
// K is one 64-bit draw of torch's default CPU generator, so torch::manual_seed decides every key,
// and rewinding that generator (activation checkpointing's recompute, a resumed train state)
// replays the same draws.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace hyper_parallel {

struct DrawParams {
  enum class Kind { Uniform, Normal, Bernoulli, Exponential, RandomInt, UniformForBernoulli };
  Kind kind = Kind::Uniform;
  double a = 0.0, b = 1.0;  // uniform: from, to; normal: mean, std; bernoulli: p; exponential: lambd
  int64_t from = 0;         // random_: [from, from + range)
  uint64_t range = 0;
};

class DeviceMesh;

/// The key of the next random call: one 64-bit draw of torch's default CPU generator.
uint64_t next_random_key();
/// The same for a draw on a DTensor over `mesh`, whose pieces must come from one key on every
/// rank: at the first such draw after a seeding (hyper_parallel::manual_seed, or torch's seed
/// changing) the ranks of each mesh dimension compare their keys, and ranks seeded otherwise are
/// named (c10::ValueError as hyper_parallel::<what>) on every rank.
uint64_t next_random_key(const DeviceMesh& mesh, const std::string& what);
/// The seed of torch's default CPU generator.
uint64_t random_seed();

/// Fills `out`, the piece at `offset` of a tensor of `global_shape` (out's sizes are the piece's),
/// with the values of the call with key `key`. `out` may have any layout and floating or integral dtype.
void philox_draw(const at::Tensor& out, const std::vector<int64_t>& global_shape, const std::vector<int64_t>& offset,
                 const DrawParams& params, uint64_t key);

}  // namespace hyper_parallel
