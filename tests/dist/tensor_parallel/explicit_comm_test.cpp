// Where every byte moves: the ExplicitRedistribution guard refuses the communication a plan did
// not ask for, and CommDebugMode's trace attributes every collective to its module and phase.
#include <hyper_parallel/dtensor/explicit_redistribution.h>

#include "tp_models.h"

using namespace tp_test;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_tensor_parallel_explicit_comm_test {
namespace {

// h * mean(h): the mean over a sharded last dim is Partial, and multiplying the Shard by it needs
// the Partial reduced first, unless the module receives h whole.
class MixerImpl : public hnn::ModuleBase<MixerImpl> {
 public:
  at::Tensor forward(const at::Tensor& h) { return h * h.mean(-1, true); }
};
HP_MODULE(Mixer);

class NetImpl : public hnn::ModuleBase<NetImpl> {
 public:
  NetImpl() {
    up = register_module("up", hnn::Linear(6, 4 * tp_size()));
    mixer = register_module("mixer", Mixer());
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = mixer(up(x));
    return hp::is_dtensor(h) ? hp::DTensor(h).full_tensor() : h;
  }
  hnn::Linear up{nullptr};
  Mixer mixer{nullptr};
};
HP_MODULE(Net);

Net parallel_net(bool prepare_mixer) {
  Net net = seeded<Net>(3);
  auto mesh = hp_test::world_mesh();
  if (prepare_mixer)
    hp::parallelize_module(*net, mesh, {{"up", hp::ColwiseParallel().use_local_output(false)},
                                        {"mixer", hp::PrepareModuleInput(hp::Layouts{hp::Shard(-1)}, hp::Layouts{hp::Replicate()})}});
  else
    hp::parallelize_module(*net, mesh, {{"up", hp::ColwiseParallel().use_local_output(false)}});
  return net;
}

}  // namespace

TEST(ExplicitRedistributionDist, APlanThatAsksForEveryCollectiveRunsCleanly) {
  Net ref = seeded<Net>(3), net = parallel_net(true);
  const at::Tensor x = random({5, 6}, 1);
  at::Tensor out;
  {
    hp::ExplicitRedistribution guard;
    out = net(x);
    out.sum().backward();
  }
  EXPECT_FALSE(hp::ExplicitRedistribution::current().has_value());
  at::Tensor expected = ref(x);
  expected.sum().backward();
  EXPECT_TRUE(close(out, expected));
  EXPECT_TRUE(close(net->up->weight().grad(), ref->up->weight().grad()));
}

TEST(ExplicitRedistributionDist, AMissingPrepareModuleInputRaisesNamingTheModuleAndTheOp) {
  if (tp_size() < 2) GTEST_SKIP() << "one rank: nothing is sharded";
  Net net = parallel_net(false);
  const at::Tensor x = random({5, 6}, 1);
  const at::Tensor expected = seeded<Net>(3)(x);
  EXPECT_TRUE(close(net(x), expected)) << "without the guard the op reduces the Partial itself";
  hp::CommDebugMode comm;
  try {
    hp::ExplicitRedistribution guard;
    net(x);
    FAIL() << "the implicit all_reduce ran";
  } catch (const c10::Error& e) {
    const std::string m = e.what_without_backtrace();
    EXPECT_EQ(m.rfind("hyper_parallel::ExplicitRedistribution: aten::mul.Tensor(self: f32[5," + std::to_string(4 * tp_size()) +
                          "] S(1), other: f32[5,1] P(avg)) on mesh(tp=" + std::to_string(tp_size()) + ") in module 'mixer' (forward)",
                      0),
              0u)
        << m;
    EXPECT_NE(m.find("other: f32 P(avg) -> R: all_reduce over tp (20 B)"), std::string::npos) << m;
    EXPECT_NE(m.find("PrepareModuleInput"), std::string::npos) << m;
  }
  EXPECT_EQ(comm.get_comm_count("all_reduce"), 0) << "the guard raised before communicating";
  // warn: once per op, module and specs, and the op runs.
  WarningCapture warnings;
  {
    c10::WarningUtils::WarningHandlerGuard capture(&warnings);
    hp::ExplicitRedistribution guard(hp::ExplicitRedistribution::Mode::warn);
    EXPECT_TRUE(close(net(x), expected));
    EXPECT_TRUE(close(net(x), expected));
  }
  size_t n = 0;
  for (const auto& w : warnings.messages) n += w.find("in module 'mixer'") != std::string::npos;
  EXPECT_EQ(n, 1u);
}

// The per-module table of collectives (PyTorch's CommDebugMode.get_comm_module_counts): the
// Megatron MLP all-reduces once forward (in linear2, Rowwise) and once backward (in linear1's
// input gradient, Colwise); with sequence parallelism an all-gather and a reduce-scatter each way.
TEST(CommTraceDist, CollectivesCountForTheirModulesAndPhases) {
  if (tp_size() < 2) GTEST_SKIP() << "one rank: no collectives";
  for (bool sp : {false, true}) {
    Mlp mlp = seeded<Mlp>(2, 8, 4 * tp_size());
    auto mesh = hp_test::world_mesh();
    if (sp)
      hp::parallelize_module(*mlp, mesh, {{"linear1", hp::ColwiseParallel(hp::Shard(0))},
                                          {"linear2", hp::RowwiseParallel(hp::Shard(-1), hp::Shard(0))}});
    else
      hp::parallelize_module(*mlp, mesh, {{"linear1", hp::ColwiseParallel()}, {"linear2", hp::RowwiseParallel()}});
    const at::Tensor x = random({2 * tp_size(), 8}, 4);
    hp::CommDebugMode comm(/*trace=*/true);
    at::Tensor in = sp ? static_cast<at::Tensor>(hp::distribute_tensor(x, mesh, {hp::Shard(0)})) : x.clone();
    in.set_requires_grad(true);
    at::Tensor y = mlp(in);
    (hp::is_dtensor(y) ? hp::DTensor(y).full_tensor() : y).sum().backward();
    const auto stats = comm.get_comm_module_stats();
    const auto count = [&](const std::string& fqn, const std::string& phase, const std::string& kind) -> int64_t {
      auto m = stats.find(fqn);
      if (m == stats.end()) return 0;
      auto p = m->second.find(phase);
      if (p == m->second.end()) return 0;
      auto k = p->second.find(kind);
      return k == p->second.end() ? 0 : k->second.count;
    };
    const int64_t dim = 8, rows = 2 * tp_size();
    if (!sp) {
      EXPECT_EQ(count("linear2", "forward", "all_reduce"), 1);
      EXPECT_EQ(count("linear1", "backward", "all_reduce"), 1);
      EXPECT_EQ(count("", "forward", "all_reduce"), 1);
      EXPECT_EQ(count("", "backward", "all_reduce"), 1);
      EXPECT_EQ(count("linear1", "forward", "all_reduce"), 0);
      // Bytes per rank: the whole [rows, dim] activation, each way.
      EXPECT_EQ(stats.at("linear2").at("forward").at("all_reduce").bytes, rows * dim * 4);
    } else {
      EXPECT_EQ(count("linear1", "forward", "all_gather"), 1);
      EXPECT_EQ(count("linear2", "forward", "reduce_scatter"), 1);
      EXPECT_EQ(count("linear1", "backward", "reduce_scatter"), 1);
      EXPECT_EQ(count("linear2", "backward", "all_gather"), 1);
      EXPECT_EQ(count("", "forward", "all_gather"), 1);
    }
    // Every op on DTensors is in the trace once, with its module and compact specs.
    const auto trace = comm.get_op_trace();
    bool mm_in_linear1 = false;
    for (const auto& line : trace) mm_in_linear1 = mm_in_linear1 || (line.rfind("linear1: aten::", 0) == 0 && line.find("R") != std::string::npos);
    EXPECT_TRUE(mm_in_linear1) << c10::Join("\n", trace);
    const std::string table = comm.generate_comm_debug_tracing_table(1);
    EXPECT_NE(table.find("  linear2"), std::string::npos) << table;
    EXPECT_NE(table.find("backward"), std::string::npos) << table;
    if (hp::get_rank() == 0 && sp) std::printf("%s", table.c_str());
  }
}

}  // namespace t_dist_tensor_parallel_explicit_comm_test
