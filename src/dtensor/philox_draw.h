#pragma once
// The counter-based draw behind every random op (internal; the values are documented in
// include/hyper_parallel/dtensor/random.h). Element i of call c under seed s takes its random bits
// from Philox4x32-10 with key s and counter (i / k, c), lanes (i % k) * (4 / k) onward, where k is
// how many elements share one 128-bit block (4 for 32-bit draws, 2 for 64-bit ones, 1 for 128).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace hyper_parallel {

struct DrawParams {
  enum class Kind { Uniform, Normal, Bernoulli, Exponential, RandomInt, UniformForBernoulli };
  Kind kind = Kind::Uniform;
  double a = 0.0, b = 1.0;  // uniform: from, to; normal: mean, std; bernoulli: p; exponential: lambd
  int64_t from = 0;         // random_: [from, from + range)
  uint64_t range = 0;
};

/// The next call number (every random op takes one, on every rank alike) and the current seed.
uint64_t next_random_call();
uint64_t random_seed();
/// The number the next call will take, and setting it (activation checkpointing replays a
/// forward's draws: it rewinds the count before the recompute and puts it back after).
uint64_t random_call_count();
void set_random_call_count(uint64_t count);

/// Fills `out`, the piece at `offset` of a tensor of `global_shape` (out's sizes are the piece's),
/// with the values of call `call`. `out` may have any layout and floating or integral dtype.
void philox_draw(const at::Tensor& out, const std::vector<int64_t>& global_shape, const std::vector<int64_t>& offset,
                 const DrawParams& params, uint64_t call);

}  // namespace hyper_parallel
