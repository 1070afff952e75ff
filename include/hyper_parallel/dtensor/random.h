#pragma once
// Random numbers that do not depend on the layout. Every random op on a DTensor (uniform_,
// normal_, bernoulli_, exponential_, random_, native_dropout, rand_like/randn_like, and dropout,
// which decomposes into bernoulli_) and the functions below give element i of a tensor a value
// that depends only on (K, i): K, the call's key, and i, the element's row-major index in the
// tensor's *global* shape. The generator is counter-based (Philox4x32-10): each rank evaluates it
// for its own elements only, so a tensor sharded over any mesh, replicated, or plain in one
// process holds the same values, and a run's losses do not depend on the tensor-parallel degree.
//
// The seeding rule, in one sentence: every random call takes its key K as one 64-bit draw from
// torch's default CPU generator, so torch::manual_seed (or hyper_parallel::manual_seed, which is
// torch's) decides our values exactly as it decides torch's own, e.g.
// `torch::manual_seed(7); torch::rand({1}); hnn::Linear a;` gives the same `a` every time.
// Plain tensors and parallelize_module never look at seeds (a per-rank seed, base + rank, is
// fine for data and for src_data_rank = None). A random op on a DTensor needs one key on every
// rank of its mesh: the first one after a seeding compares the ranks' keys and names the ranks
// that were seeded otherwise (PyTorch broadcasts rank 0's state or lets replicas diverge; we
// refuse instead).
//
// What is drawn, per element (u: the element's uniform number in [0, 1)):
// - uniform_(from, to): from + u * (to - from), u from 24 bits (53 for double);
// - normal_(mean, std): mean + std * sqrt(-2 ln(1 - u1)) * cos(2 pi u2), u1, u2 from 32 bits each;
// - bernoulli_(p): 1 when u < p, u from 32 bits; dropout keeps an element when its bernoulli_(1 - p)
//   is 1 and scales it by 1 / (1 - p);
// - exponential_(lambd): -log(1 - u) / lambd, u from 53 bits;
// - random_(from, to): from + (64 random bits mod (to - from)).
// This is not the stream of torch's CPU or CUDA generator: plain tensors draw these values only
// through the functions here (and the layers built on them, e.g. hyper_parallel::nn::Dropout);
// at::dropout on a plain tensor still uses torch's generator.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include <hyper_parallel/dtensor/dtensor.h>

namespace hyper_parallel {

/// torch::manual_seed(seed) (the keys are torch's draws); the next random op on a DTensor then
/// compares the ranks' keys over its mesh. e.g. `hp::manual_seed(42);`
void manual_seed(uint64_t seed);
/// The seed of torch's default CPU generator.
uint64_t initial_seed();

/// In-place fills of plain tensors and DTensors alike, with the values described above. A meta
/// tensor is left as it is and takes no call number (as torch's generators on meta), so a model
/// built on meta and materialised by init_parameters draws what eager construction draws.
at::Tensor& uniform_(at::Tensor& t, double from = 0.0, double to = 1.0);
at::Tensor& normal_(at::Tensor& t, double mean = 0.0, double std = 1.0);
at::Tensor& bernoulli_(at::Tensor& t, double p = 0.5);

/// Dropout with the layout-independent mask: `input` when `!train` or `p == 0`, else
/// input * bernoulli(1 - p) / (1 - p), computed as at::dropout computes it on the CPU.
/// e.g. `probs = hp::dropout(probs, 0.1, is_training());`
at::Tensor dropout(const at::Tensor& input, double p, bool train);

/// A DTensor of `shape` laid out by `placements`, with uniform [0, 1) or standard normal values:
/// each rank draws only its own piece (PyTorch's torch.distributed.tensor.rand/randn).
/// e.g. `auto w = hp::randn({1024, 256}, tp, {hp::Shard(0)});`
DTensor rand(const std::vector<int64_t>& shape, const DeviceMesh& mesh, const Placements& placements,
             const at::TensorOptions& options = {});
DTensor randn(const std::vector<int64_t>& shape, const DeviceMesh& mesh, const Placements& placements,
              const at::TensorOptions& options = {});

}  // namespace hyper_parallel
