// Random ops (native_dropout, bernoulli_, uniform_, normal_; dropout on CPU decomposes into
// bernoulli_). Ranks holding the same piece of a tensor draw the same numbers: the device's
// generator is seeded from the mesh's shared seed, a per-mesh call counter and the index of the
// piece, then restored, so replicated dropout masks agree everywhere.
#include "rule_utils.h"

#include <ATen/core/Generator.h>

#include <mutex>
#include <unordered_map>

namespace hyper_parallel {
namespace ops {
namespace {

uint64_t next_call(const DeviceMesh& mesh) {
  static std::mutex m;
  static std::unordered_map<const void*, uint64_t> counters;
  std::lock_guard<std::mutex> lock(m);
  return counters[mesh.impl()]++;
}

// Index of this rank's piece: ranks that differ only along Replicate/Partial mesh dims share it.
uint64_t piece_index(const OpInfo& info, const Placements& placements) {
  uint64_t idx = 0;
  for (size_t i = 0; i < placements.size(); ++i)
    idx = idx * static_cast<uint64_t>(info.mesh_shape()[i]) +
          (placements[i].is_shard() ? static_cast<uint64_t>(info.coordinate()[i]) : 0);
  return idx;
}

// The local op with the device's default generator seeded for this call from the mesh's shared
// seed, a per-mesh call counter and the piece index; params: {piece, generator argument or -1}.
void seeded_random(const c10::OperatorHandle& op, torch::jit::Stack* stack, const DeviceMesh& mesh,
                   const std::vector<int64_t>& params) {
  const uint64_t piece = static_cast<uint64_t>(params[0]);
  const int64_t generator_arg = params[1];
  const size_t nargs = op.schema().arguments().size();
  const c10::IValue& first = (*stack)[stack->size() - nargs];
  if (generator_arg >= 0 && !(*stack)[stack->size() - nargs + static_cast<size_t>(generator_arg)].isNone()) {
    op.callBoxed(stack);  // the caller chose a generator
    return;
  }
  const uint64_t base = mesh.shared_seed();
  const uint64_t call = next_call(mesh);
  at::Generator gen = at::globalContext().defaultGenerator(first.toTensor().device());
  // The kernels lock the generator themselves: hold its mutex only around our own accesses.
  at::Tensor saved;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    saved = gen.get_state();
    gen.set_current_seed(base * 1000003ull + call * 7919ull + piece);
  }
  auto restore = [&] {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(saved);
  };
  try {
    op.callBoxed(stack);
  } catch (...) {
    restore();
    throw;
  }
  restore();
}

void use_seeded(OpSharding& s, const OpInfo& info, const Placements& placements, int64_t generator_arg) {
  s.handler = "hp::seeded_random";
  s.handler_params = {static_cast<int64_t>(piece_index(info, placements)), generator_arg};
}

int64_t generator_arg_of(const OpInfo& info) {
  const auto& args = info.schema().arguments();
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i].name() == "generator") return static_cast<int64_t>(i);
  return -1;
}

// native_dropout(input, p, train) -> (output, mask)
OpSharding native_dropout_rule(const OpInfo& info) {
  const DTensorSpec& in = *info.spec(0);
  const Placements x = without_partial(in.placements);
  OpSharding s;
  s.input_placements = {x};
  s.output_placements = {x, x};
  s.output_shapes = {in.shape, in.shape};
  use_seeded(s, info, x, -1);
  return s;
}

// In-place fills: self keeps its layout; a Partial self cannot hold random values.
OpSharding fill_random_rule(const OpInfo& info) {
  const DTensorSpec& self = *info.spec(0);
  HP_CHECK_T(c10::ValueError, !self.has_partial(), "hyper_parallel: ", info.describe(),
             ": cannot fill a Partial DTensor with random values");
  OpSharding s;
  for (const auto& in : info.inputs())
    s.input_placements.push_back(in.arg == 0 ? self.placements : replicate(info));
  s.output_placements = {self.placements};
  use_seeded(s, info, self.placements, generator_arg_of(info));
  return s;
}

struct Registrar {
  Registrar() {
    register_op_handler("hp::seeded_random", seeded_random);
    register_sharding_rule("aten::native_dropout", native_dropout_rule);
    for (const char* n : {"aten::bernoulli_", "aten::uniform_", "aten::normal_", "aten::random_",
                          "aten::exponential_"})
      register_sharding_rule(n, fill_random_rule);
  }
} registrar;

}  // namespace
}  // namespace ops
}  // namespace hyper_parallel
