// Sharding rules are pure functions of (op, arguments, input specs, mesh shape, coordinate):
// tested here table-driven in one process, without a process group or a mesh.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <hyper_parallel/dtensor/sharding_rule.h>
#include <hyper_parallel/runtime/errors.h>

#include <memory>

namespace hp = hyper_parallel;
using hp::Partial;
using hp::Placements;
using hp::Replicate;
using hp::Shard;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_unit_dtensor_sharding_rules_test {
namespace {

// One call: DTensor arguments are given by their specs; other arguments as values.
struct Call {
  c10::OperatorHandle op;
  std::vector<c10::IValue> args;
  std::vector<std::unique_ptr<hp::DTensorSpec>> specs;
  std::vector<hp::OpInfo::TensorInput> inputs;

  Call(const char* name, const char* overload) : op(c10::Dispatcher::singleton().findSchemaOrThrow(name, overload)) {}
  Call& dt(const Placements& p, std::vector<int64_t> shape, at::ScalarType dtype = at::kFloat) {
    specs.push_back(std::make_unique<hp::DTensorSpec>(hp::DeviceMesh(), p, shape, dtype));
    inputs.push_back({args.size(), -1, specs.back().get()});
    args.emplace_back(at::empty(shape, at::TensorOptions().dtype(dtype).device(at::kMeta)));
    return *this;
  }
  Call& value(c10::IValue v) {
    args.push_back(std::move(v));
    return *this;
  }
  hp::OpSharding rule(std::vector<int64_t> mesh_shape, std::vector<int64_t> coordinate) const {
    hp::OpInfo info(op, args.data(), args.size(), inputs, std::move(mesh_shape), std::move(coordinate));
    return hp::apply_sharding_rule(info);
  }
};

struct Case {
  const char* what;
  std::function<Call()> call;
  std::vector<int64_t> mesh_shape, coordinate;
  std::vector<Placements> want_inputs;  // empty: inputs kept as they are
  Placements want_output;
};

}  // namespace

TEST(ShardingRules, TableOfPlacements) {
  const std::vector<Case> cases = {
      {"mm colwise: R @ S(1) -> S(1)", [] { return std::move(Call("aten::mm", "").dt({Replicate()}, {4, 6}).dt({Shard(1)}, {6, 8})); },
       {2}, {0}, {}, {Shard(1)}},
      {"mm rowwise: S(1) @ S(0) -> Partial", [] { return std::move(Call("aten::mm", "").dt({Shard(1)}, {4, 6}).dt({Shard(0)}, {6, 8})); },
       {2}, {1}, {}, {Partial()}},
      {"mm batch: S(0) @ R -> S(0)", [] { return std::move(Call("aten::mm", "").dt({Shard(0)}, {4, 6}).dt({Replicate()}, {6, 8})); },
       {2}, {0}, {}, {Shard(0)}},
      {"mm 2-D mesh: (S(0), S(1)) @ (R, S(0)) -> (S(0), Partial)",
       [] { return std::move(Call("aten::mm", "").dt({Shard(0), Shard(1)}, {4, 6}).dt({Replicate(), Shard(0)}, {6, 8})); },
       {2, 2}, {1, 0}, {}, {Shard(0), Partial()}},
      {"add: S(0) + R -> S(0), the replicated operand chunked locally",
       [] { return std::move(Call("aten::add", "Tensor").dt({Shard(0)}, {4, 6}).dt({Replicate()}, {4, 6}).value(1)); },
       {2}, {0}, {{Shard(0)}, {Shard(0)}}, {Shard(0)}},
      {"add: S(0) + broadcast R row -> S(0)",
       [] { return std::move(Call("aten::add", "Tensor").dt({Shard(0)}, {4, 6}).dt({Replicate()}, {6}).value(1)); }, {2}, {1}, {}, {Shard(0)}},
      {"add: S(0) + S(1) -> the second follows the first",
       [] { return std::move(Call("aten::add", "Tensor").dt({Shard(0)}, {4, 6}).dt({Shard(1)}, {4, 6}).value(1)); },
       {2}, {0}, {{Shard(0)}, {Shard(0)}}, {Shard(0)}},
      {"add: Partial + Partial stays Partial",
       [] { return std::move(Call("aten::add", "Tensor").dt({Partial()}, {4}).dt({Partial()}, {4}).value(1)); }, {2}, {1}, {}, {Partial()}},
      {"mul: Partial * Partial reduces first",
       [] { return std::move(Call("aten::mul", "Tensor").dt({Partial()}, {4}).dt({Partial()}, {4})); }, {2}, {0},
       {{Replicate()}, {Replicate()}}, {Replicate()}},
      {"sum over the sharded dim -> Partial",
       [] { return std::move(Call("aten::sum", "dim_IntList").dt({Shard(1)}, {4, 6}).value(std::vector<int64_t>{1}).value(false).value(c10::IValue())); },
       {2}, {0}, {}, {Partial()}},
      {"sum over another dim keeps the shard (renumbered)",
       [] { return std::move(Call("aten::sum", "dim_IntList").dt({Shard(1)}, {4, 6}).value(std::vector<int64_t>{0}).value(false).value(c10::IValue())); },
       {2}, {0}, {}, {Shard(0)}},
      {"softmax along an unsharded dim keeps the shard",
       [] { return std::move(Call("aten::_softmax", "").dt({Shard(0)}, {4, 6}).value(1).value(false)); }, {2}, {0}, {}, {Shard(0)}},
      {"softmax along the sharded dim stays sharded (a communicating kernel)",
       [] { return std::move(Call("aten::_softmax", "").dt({Shard(1)}, {4, 6}).value(1).value(false)); }, {2}, {0}, {}, {Shard(1)}},
      {"softmax of a Partial reduces first",
       [] { return std::move(Call("aten::_softmax", "").dt({Partial()}, {4, 6}).value(1).value(false)); }, {2}, {0},
       {{Replicate()}}, {Replicate()}},
      {"t of S(0) -> S(1)", [] { return std::move(Call("aten::t", "").dt({Shard(0)}, {4, 6})); }, {2}, {0}, {}, {Shard(1)}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const Call call = c.call();
    const hp::OpSharding s = call.rule(c.mesh_shape, c.coordinate);
    if (!c.want_inputs.empty()) {
      ASSERT_EQ(s.input_placements.size(), c.want_inputs.size());
      for (size_t k = 0; k < c.want_inputs.size(); ++k)
        EXPECT_EQ(hp::normalize_placements(s.input_placements[k], call.specs[k]->ndim()), c.want_inputs[k])
            << hp::to_string(s.input_placements[k]);
    } else if (!s.input_placements.empty()) {
      for (size_t k = 0; k < call.specs.size(); ++k)
        EXPECT_EQ(hp::normalize_placements(s.input_placements[k], call.specs[k]->ndim()), call.specs[k]->placements)
            << "input " << k << " changed to " << hp::to_string(s.input_placements[k]);
    }
    ASSERT_FALSE(s.output_placements.empty());
    EXPECT_EQ(s.output_placements[0], c.want_output) << hp::to_string(s.output_placements[0]);
  }
}

TEST(ShardingRules, CommunicatingHandlersOnlyWhereNeeded) {
  const auto softmax = [](hp::Placement p) {
    return Call("aten::_softmax", "").dt({p}, {4, 6}).value(1).value(false).rule({2}, {0});
  };
  const hp::OpSharding whole = softmax(Shard(0)), split = softmax(Shard(1));
  EXPECT_TRUE(whole.handler.empty() && !whole.kernel) << "softmax along a whole dim runs the local op";
  // Along the sharded dim it needs the all-reduces: the registered handler, named with its
  // parameters {dim, log, the mesh dims sharding dim}.
  EXPECT_EQ(split.handler, "hp::softmax_over_shards");
  EXPECT_EQ(split.handler_params, (std::vector<int64_t>{1, 0, 0}));
  const hp::OpSharding log_split = Call("aten::_log_softmax", "").dt({Shard(1), Shard(1)}, {4, 6}).value(-1).value(false).rule({2, 2}, {1, 0});
  EXPECT_EQ(log_split.handler_params, (std::vector<int64_t>{1, 1, 0, 1}));
  // Dropout keeps its input's layout and draws each rank's piece locally; a handler, since the first
  // draw after a seeding compares the ranks' keys over the mesh (the values are compared with one
  // process in RandomDist.*). Its params: the op, the dims, the global shape, this piece's offset.
  const auto dropout = Call("aten::native_dropout", "").dt({Shard(0), Replicate()}, {4, 6}).value(0.5).value(true).rule({2, 2}, {1, 0});
  EXPECT_EQ(dropout.handler, "hp::random_draw");
  EXPECT_EQ(std::vector<int64_t>(dropout.handler_params.begin() + 1, dropout.handler_params.end()), (std::vector<int64_t>{2, 4, 6, 2, 0}));
  EXPECT_EQ(dropout.output_placements, (std::vector<Placements>{{Shard(0), Replicate()}, {Shard(0), Replicate()}}));
}

TEST(ShardingRules, ScalarsAddToAPartialOnCoordinateZeroOnly) {
  // x + 2.5 with x Partial(sum): one rank adds the scalar, the others add zero.
  const auto add_scalar = [](int64_t coord) {
    return Call("aten::add", "Scalar").dt({Partial()}, {4}).value(c10::Scalar(2.5)).value(c10::Scalar(1)).rule({2}, {coord});
  };
  const hp::OpSharding at0 = add_scalar(0), at1 = add_scalar(1);
  EXPECT_EQ(at0.output_placements[0], Placements{Partial()});
  EXPECT_EQ(at1.output_placements[0], Placements{Partial()});
  EXPECT_FALSE(at0.adjust_args);
  ASSERT_TRUE(at1.adjust_args);
  torch::jit::Stack args{at::ones({4}), c10::Scalar(2.5), c10::Scalar(1)};
  at1.adjust_args(args);
  EXPECT_EQ(args[1].toScalar().toDouble(), 0.0);
}

TEST(ShardingRules, VocabShardedEmbeddingIsPartialWithThisRanksRows) {
  // embedding(weight [10, 4] Shard(0), ids): rank 1 of 2 holds rows [5, 10).
  const auto s = Call("aten::embedding", "")
                     .dt({Shard(0)}, {10, 4})
                     .dt({Replicate()}, {3}, at::kLong)
                     .value(-1)
                     .value(false)
                     .value(false)
                     .rule({2}, {1});
  EXPECT_EQ(s.output_placements[0], Placements{Partial()});
  ASSERT_TRUE(s.kernel);
}

TEST(ShardingRules, NoRuleIsNotImplemented) {
  Call c("aten::_test_optional_floatlist", "");  // no rule (the registry test registers others)
  c.dt({Shard(0)}, {4}).value(c10::IValue());
  EXPECT_THROW(c.rule({2}, {0}), c10::NotImplementedError);
}

}  // namespace t_unit_dtensor_sharding_rules_test
