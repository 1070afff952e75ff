// Cases C1-C14: forward and backward of parallelised modules against the same module in one
// process (same seed, same weights). Gradient convention: gradients equal the
// single-device ones, Rowwise included (no division by the tp size).
#include "tp_models.h"

#include <ATen/autocast_mode.h>
#include <c10/core/InferenceMode.h>

using namespace tp_test;
using P = hp::Placements;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_tensor_parallel_numerics_test {
namespace {
hp::DeviceMesh mesh() { return hp::init_device_mesh("cpu", {tp_size()}, {"tp"}); }
at::Tensor gather_last(const at::Tensor& local) { return hp::all_gather(local, -1, hp::world_group()); }
at::Tensor grad_of(const at::Tensor& p) { return full(p.grad()); }
at::Tensor leaf(const at::Tensor& t) { return t.detach().clone().requires_grad_(true); }
}  // namespace

TEST(TensorParallelNumerics, C1_ColwiseLinearForwardBackward) {
  const int64_t n = tp_size();
  auto l = seeded<hnn::Linear>(11, 16, 8 * n);
  auto ref = seeded<hnn::Linear>(11, 16, 8 * n);
  hp::parallelize_module(*l, mesh(), hp::ColwiseParallel());
  at::Tensor x = leaf(random({4, 16}, 1)), xr = leaf(x);
  at::Tensor y = l(x);  // local: the default output is Shard(-1) as a local tensor
  EXPECT_FALSE(hp::is_dtensor(y));
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{4, 8}));
  at::Tensor yr = ref(xr);
  ASSERT_TRUE(close(gather_last(y), yr));
  at::Tensor w = random({4, 8 * n}, 2);
  (y * piece(w, -1)).sum().backward();  // each rank's share of sum(y * w)
  (yr * w).sum().backward();
  EXPECT_TRUE(close(grad_of(l->weight()), ref->weight().grad()));  // gathered on dim 0
  EXPECT_TRUE(close(grad_of(l->bias()), ref->bias().grad()));
  EXPECT_TRUE(close(x.grad(), xr.grad()));  // all-reduced by from_local's backward
}

namespace {
// Torch's CPU autocast to `dtype` in a scope, as Python's `torch.autocast("cpu", dtype)` sets it.
class CpuAutocast {
 public:
  explicit CpuAutocast(at::ScalarType dtype)
      : was_enabled_(at::autocast::is_autocast_enabled(at::kCPU)), was_dtype_(at::autocast::get_autocast_dtype(at::kCPU)) {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, dtype);
    at::autocast::increment_nesting();
  }
  ~CpuAutocast() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(at::kCPU, was_enabled_);
    at::autocast::set_autocast_dtype(at::kCPU, was_dtype_);
  }
  CpuAutocast(const CpuAutocast&) = delete;
  CpuAutocast& operator=(const CpuAutocast&) = delete;

 private:
  bool was_enabled_;
  at::ScalarType was_dtype_;
};

// Within bf16's rounding: 8 bits of mantissa.
bool close_bf16(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && at::allclose(a.to(at::kFloat), b.to(at::kFloat), 1.0 / 64, 1.0 / 64);
}
}  // namespace

// Under CPU autocast to bf16 a Colwise Linear computes in bf16 as the same Linear does on plain
// tensors under the same autocast: a bf16 output of the same values, and fp32 gradients of the
// same values. The DTensor carries the autocast key its local tensor has, so autocast casts
// before our sharding rules run.
TEST(TensorParallelNumerics, AutocastColwiseLinearEqualsPlainAutocast) {
  const int64_t n = tp_size();
  auto l = seeded<hnn::Linear>(21, 16, 8 * n);
  auto ref = seeded<hnn::Linear>(21, 16, 8 * n);
  hp::parallelize_module(*l, mesh(), hp::ColwiseParallel(/*input_layouts=*/hp::Replicate(), /*output_layouts=*/hp::Replicate()));
  at::Tensor x = leaf(random({4, 16}, 1)), xr = leaf(x);
  at::Tensor w = random({4, 8 * n}, 2);
  at::Tensor y, yr;
  {
    CpuAutocast autocast(at::kBFloat16);
    y = l(x);
    yr = ref(xr);
    EXPECT_EQ(yr.scalar_type(), at::kBFloat16) << "torch's autocast did not cast the plain Linear";
    EXPECT_EQ(y.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(close_bf16(y, yr));
    (y.to(at::kFloat) * w).sum().backward();
    (yr.to(at::kFloat) * w).sum().backward();
  }
  EXPECT_EQ(l->weight().grad().scalar_type(), at::kFloat);
  EXPECT_TRUE(close_bf16(grad_of(l->weight()), ref->weight().grad()));
  EXPECT_TRUE(close_bf16(grad_of(l->bias()), ref->bias().grad()));
  EXPECT_TRUE(close_bf16(x.grad(), xr.grad()));
}

// A Colwise + Rowwise MLP's forward under c10::InferenceMode (where composite ops reach the
// DTensors undecomposed) equals its forward in grad mode and one process's, and records nothing
// for autograd.
TEST(TensorParallelNumerics, InferenceModeMlpForwardEqualsGradModeForward) {
  const int64_t n = tp_size();
  auto m = seeded<Mlp>(22, 16, 8 * n);
  auto ref = seeded<Mlp>(22, 16, 8 * n);
  hp::parallelize_module(*m, mesh(), {{"linear1", hp::ColwiseParallel()}, {"linear2", hp::RowwiseParallel()}});
  const at::Tensor x = random({2, 3, 16}, 1);
  const at::Tensor grad_mode = m(x);
  ASSERT_TRUE(grad_mode.requires_grad());
  at::Tensor inference;
  {
    c10::InferenceMode guard;
    hp::CommDebugMode comm;
    inference = m(x);
    EXPECT_EQ(comm.get_comm_count("all_reduce"), 1) << comm.summary();
  }
  EXPECT_TRUE(inference.is_inference());
  EXPECT_FALSE(inference.requires_grad());
  EXPECT_TRUE(close(inference, grad_mode.detach()));
  EXPECT_TRUE(close(inference, ref(x).detach()));
}

TEST(TensorParallelNumerics, C2_RowwiseLinearForwardBackward) {
  const int64_t n = tp_size();
  auto l = seeded<hnn::Linear>(12, 8 * n, 6);
  auto ref = seeded<hnn::Linear>(12, 8 * n, 6);
  hp::parallelize_module(*l, mesh(), hp::RowwiseParallel());
  at::Tensor xfull = random({3, 8 * n}, 1);
  at::Tensor x = leaf(piece(xfull, -1)), xr = leaf(xfull);
  at::Tensor y = l(x);  // the whole output on every rank
  at::Tensor yr = ref(xr);
  ASSERT_TRUE(close(y, yr));
  at::Tensor w = random({3, 6}, 2);
  (y * w).sum().backward();
  (yr * w).sum().backward();
  EXPECT_TRUE(close(grad_of(l->weight()), ref->weight().grad()));  // no division by tp
  EXPECT_TRUE(close(grad_of(l->bias()), ref->bias().grad()));
  EXPECT_TRUE(close(x.grad(), piece(xr.grad(), -1)));
}

TEST(TensorParallelNumerics, C3_ColwiseRowwiseMlpWithOneAllReduceEachWay) {
  const int64_t n = tp_size();
  auto m = seeded<Mlp>(13, 16, 8 * n);
  auto ref = seeded<Mlp>(13, 16, 8 * n);
  hp::parallelize_module(*m, mesh(), {{"linear1", hp::ColwiseParallel()}, {"linear2", hp::RowwiseParallel()}});
  at::Tensor x = leaf(random({2, 3, 16}, 1)), xr = leaf(x);
  hp::CommDebugMode fwd;
  at::Tensor y = m(x);
  EXPECT_EQ(fwd.get_comm_count("all_reduce"), 1) << fwd.summary();
  EXPECT_EQ(fwd.get_total_counts(), 1) << fwd.summary();
  at::Tensor yr = ref(xr);
  ASSERT_TRUE(close(y, yr));
  at::Tensor w = random({2, 3, 16}, 2);
  hp::CommDebugMode bwd;
  (y * w).sum().backward();
  EXPECT_EQ(bwd.get_comm_count("all_reduce"), 1) << bwd.summary();
  EXPECT_EQ(bwd.get_total_counts(), 1) << bwd.summary();
  (yr * w).sum().backward();
  for (const auto& p : m->named_parameters())
    EXPECT_TRUE(close(grad_of(p.value()), ref->named_parameters()[p.key()].grad())) << p.key();
  EXPECT_TRUE(close(x.grad(), xr.grad()));
}

TEST(TensorParallelNumerics, C3_MlpWithSequenceParallelUsesAllGatherAndReduceScatter) {
  const int64_t n = tp_size();
  auto m = seeded<Mlp>(13, 16, 8 * n);
  auto ref = seeded<Mlp>(13, 16, 8 * n);
  hp::parallelize_module(*m, mesh(), {{"linear1", hp::ColwiseParallel(hp::Shard(1))},
                                      {"linear2", hp::RowwiseParallel(hp::Shard(-1), hp::Shard(1))}});
  at::Tensor xfull = random({2, 2 * n, 16}, 1);
  at::Tensor x = leaf(piece(xfull, 1)), xr = leaf(xfull);
  hp::CommDebugMode fwd;
  at::Tensor y = m(x);
  EXPECT_EQ(fwd.get_comm_counts(), (std::map<std::string, int64_t>{{"all_gather", 1}, {"reduce_scatter", 1}})) << fwd.summary();
  at::Tensor yr = ref(xr);
  ASSERT_TRUE(close(y, piece(yr, 1)));
  at::Tensor w = random({2, 2 * n, 16}, 2);
  hp::CommDebugMode bwd;
  (y * piece(w, 1)).sum().backward();
  EXPECT_EQ(bwd.get_comm_counts(), (std::map<std::string, int64_t>{{"all_gather", 1}, {"reduce_scatter", 1}})) << bwd.summary();
  (yr * w).sum().backward();
  for (const auto& p : m->named_parameters())
    EXPECT_TRUE(close(grad_of(p.value()), ref->named_parameters()[p.key()].grad())) << p.key();
  EXPECT_TRUE(close(x.grad(), piece(xr.grad(), 1)));
}

TEST(TensorParallelNumerics, C4_ColwiseEmbedding) {
  const int64_t n = tp_size();
  auto e = seeded<hnn::Embedding>(14, 10, 4 * n);
  auto ref = seeded<hnn::Embedding>(14, 10, 4 * n);
  hp::parallelize_module(*e, mesh(), hp::ColwiseParallel());
  at::Tensor ids = at::tensor(std::vector<int64_t>{0, 9, 3, 3, 7, 1}, at::kLong).reshape({2, 3});
  at::Tensor y = e(ids), yr = ref(ids);
  ASSERT_TRUE(close(gather_last(y), yr));
  at::Tensor w = random({2, 3, 4 * n}, 2);
  (y * piece(w, -1)).sum().backward();
  (yr * w).sum().backward();
  EXPECT_TRUE(close(grad_of(e->weight()), ref->weight().grad()));
}

TEST(TensorParallelNumerics, C5_RowwiseEmbeddingIsExact) {
  const int64_t n = tp_size();
  at::Tensor ids = at::tensor(std::vector<int64_t>{0, 4 * n - 1, 3, 3, 2 * n, 1}, at::kLong).reshape({2, 3});
  {
    auto e = seeded<hnn::Embedding>(15, 4 * n, 6);
    auto ref = seeded<hnn::Embedding>(15, 4 * n, 6);
    // Replicated token ids, as the Qwen plan annotates them.
    hp::parallelize_module(*e, mesh(), hp::RowwiseParallel(hp::Replicate()));
    at::Tensor y = e(ids), yr = ref(ids);
    EXPECT_TRUE(at::equal(y, yr));  // a masked lookup: the sum over ranks adds exact zeros
    (y * y).sum().backward();
    (yr * yr).sum().backward();
    EXPECT_TRUE(close(grad_of(e->weight()), ref->weight().grad()));
  }
  // The default annotation, Shard(-1): each rank passes its piece of the ids, which are gathered.
  auto e = seeded<hnn::Embedding>(15, 4 * n, 6);
  auto ref = seeded<hnn::Embedding>(15, 4 * n, 6);
  hp::parallelize_module(*e, mesh(), hp::RowwiseParallel());
  at::Tensor ids_wide = at::arange(4 * n, at::kLong).reshape({1, 4 * n});
  EXPECT_TRUE(at::equal(e(piece(ids_wide, -1)), ref(ids_wide)));
  // An id outside the vocabulary: IndexError as in plain libtorch (never a row of zeros).
  auto oov = at::tensor(std::vector<int64_t>{1, 4 * n}, at::kLong).reshape({1, 2});
  EXPECT_THROW(ref(oov), c10::IndexError);
  auto er = seeded<hnn::Embedding>(15, 4 * n, 6);
  hp::parallelize_module(*er, mesh(), hp::RowwiseParallel(hp::Replicate()));
  EXPECT_THROW(er(oov), c10::IndexError);
  EXPECT_THROW(er(oov - 4 * n), c10::IndexError);
}

// A table sharded on Qwen3's vocabulary (151,936 rows): one backward makes this rank's rows of the
// gradient only (Shard(0)), never the whole vocabulary's, with the ids replicated and with the
// output sequence-sharded (SP); the padding row gets none. Against the same table in one process,
// the peak of what the backward allocates (the memory tracker the loading bar reads) within a
// margin of the local rows, and no collective in backward of the table's size.
TEST(TensorParallelNumerics, C5_RowwiseEmbeddingBackwardMakesOnlyTheLocalRows) {
  const int64_t n = tp_size(), vocab = 151936, dim = 16, seq = 4 * n;
  at::Tensor ids = at::randint(vocab, {2, seq}, at::kLong);
  ids.index_put_({0, 0}, 7);  // the padding row, looked up
  ids.index_put_({1, 1}, vocab - 1);
  const at::Tensor same_ids = hp::all_gather(ids.unsqueeze(0), 0, hp::world_group())[0];  // rank 0's on every rank
  const int64_t local_rows = hp::chunk_size(vocab, n, hp::get_rank());
  const int64_t local_bytes = local_rows * dim * 4;
  for (const bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "sequence-sharded output" : "replicated output");
    auto e = seeded<hnn::Embedding>(16, hnn::EmbeddingOptions(vocab, dim).padding_idx(7));
    auto ref = seeded<hnn::Embedding>(16, hnn::EmbeddingOptions(vocab, dim).padding_idx(7));
    hp::parallelize_module(*e, mesh(), hp::RowwiseParallel(hp::Replicate(), sp ? hp::Shard(1) : hp::Replicate()));
    const at::Tensor w = random({2, seq, dim}, 3);
    const at::Tensor y = e(same_ids);  // a local tensor (use_local_output)
    const at::Tensor loss = (y * (sp ? piece(w, 1) : w)).sum();
    hp::CommDebugMode comm;
    int64_t peak = 0;
    {
      hp::MemoryTracker mem("cpu");
      loss.backward();
      peak = mem.peak_bytes();
    }
    (ref(same_ids) * w).sum().backward();
    const at::Tensor g = e->weight().grad();
    ASSERT_TRUE(hp::is_dtensor(g));
    EXPECT_EQ(hp::DTensor(g).placements(), P{hp::Shard(0)});
    EXPECT_EQ(hp::local_tensor(g).size(0), local_rows);
    EXPECT_TRUE(close(grad_of(e->weight()), ref->weight().grad()));
    EXPECT_TRUE(at::equal(grad_of(e->weight())[7], at::zeros({dim})));
    EXPECT_LT(peak, local_bytes + local_bytes / 10 + (1 << 20)) << "local rows " << local_bytes << " B";
    int64_t moved = 0;
    for (const auto& [ranks, phases] : comm.get_comm_group_stats())
      if (phases.count("backward"))
        for (const auto& [kind, stats] : phases.at("backward")) moved = std::max<int64_t>(moved, stats.bytes);
    EXPECT_LT(moved, int64_t{vocab} * dim * 4 / n) << "a collective of the table's size";
  }
}

// A dtype mismatch reads as one (not as a missing meta kernel), on every rank.
TEST(TensorParallelNumerics, DtypeMismatchIsReportedAsSuch) {
  auto lin = seeded<hnn::Linear>(16, 4, 4 * tp_size());
  hp::parallelize_module(*lin, mesh(), hp::ColwiseParallel());
  try {
    lin(at::ones({2, 4}, at::kDouble));
    ADD_FAILURE() << "a double input into a float Linear ran";
  } catch (const c10::Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find("no meta kernel"), std::string::npos) << m;
    // The compact spec names the dtype (f64) where libtorch 1.13's own message does not.
    EXPECT_TRUE(m.find("f64[2,4]") != std::string::npos) << m;
  }
}

TEST(TensorParallelNumerics, C6_SequenceParallelLayerNorm) {
  const int64_t n = tp_size();
  hnn::LayerNorm ln(std::vector<int64_t>{8}), ref(std::vector<int64_t>{8});
  {
    at::NoGradGuard g;
    for (auto* m : {&ln, &ref}) {
      (*m)->named_parameters()["weight"].copy_(random({8}, 3));
      (*m)->named_parameters()["bias"].copy_(random({8}, 4));
    }
  }
  hp::parallelize_module(*ln, mesh(), hp::SequenceParallel());
  at::Tensor xfull = random({2, 2 * n, 8}, 1);
  at::Tensor x = leaf(piece(xfull, 1)), xr = leaf(xfull);
  hp::DTensor y(ln(x));  // use_local_output defaults to false: a DTensor
  EXPECT_EQ(y.placements(), P{hp::Shard(1)});
  at::Tensor yr = ref(xr);
  EXPECT_TRUE(close(y.to_local(), piece(yr, 1)));  // the local chunk against the reference slice
  ASSERT_TRUE(close(y, yr));                       // gathered against the whole reference
  at::Tensor w = random({2, 2 * n, 8}, 2);
  (y.to_local() * piece(w, 1)).sum().backward();
  (yr * w).sum().backward();
  EXPECT_TRUE(close(x.grad(), piece(xr.grad(), 1)));
  // Each rank's weight gradient covers its rows only (Partial); it is reduced once, on its way
  // into .grad, to the parameter's own placements.
  EXPECT_EQ(hp::DTensor(ln->named_parameters()["weight"].grad()).placements(), P{hp::Replicate()});
  EXPECT_TRUE(close(grad_of(ln->named_parameters()["weight"]), ref->named_parameters()["weight"].grad()));
  EXPECT_TRUE(close(grad_of(ln->named_parameters()["bias"]), ref->named_parameters()["bias"].grad()));
}

TEST(TensorParallelNumerics, C7_SequenceParallelDropoutAtZeroIsIdentity) {
  const int64_t n = tp_size();
  hnn::Dropout d(0.0);
  hp::parallelize_module(*d, mesh(), hp::SequenceParallel());
  at::Tensor xfull = random({2, 2 * n, 8}, 1);
  hp::DTensor y(d(piece(xfull, 1)));
  EXPECT_TRUE(at::equal(y.full_tensor(), xfull));
}

TEST(TensorParallelNumerics, C8_NoParallelLinear) {
  auto l = seeded<hnn::Linear>(18, 6, 5);
  auto ref = seeded<hnn::Linear>(18, 6, 5);
  hp::parallelize_module(*l, mesh(), hp::NoParallel());
  at::Tensor x = leaf(random({3, 6}, 1)), xr = leaf(x);
  at::Tensor y = l(x);
  EXPECT_FALSE(hp::is_dtensor(y));
  ASSERT_TRUE(close(y, ref(xr)));  // every rank
  (y * y).sum().backward();
  (ref(xr) * ref(xr)).sum().backward();
  EXPECT_TRUE(close(grad_of(l->weight()), ref->weight().grad()));
  EXPECT_TRUE(close(x.grad(), xr.grad()));
}

TEST(TensorParallelNumerics, C9_SequenceParallelIntoNoParallel) {
  const int64_t n = tp_size();
  struct BlockImpl : hnn::ModuleBase<BlockImpl> {
    BlockImpl() {
      norm = register_module("norm", hnn::RMSNorm(8));
      proj = register_module("proj", hnn::Linear(8, 4));
    }
    at::Tensor forward(const at::Tensor& x) { return proj(norm(x)); }
    hnn::RMSNorm norm{nullptr};
    hnn::Linear proj{nullptr};
  };
  hp_test::manual_seed(19);
  auto b = std::make_shared<BlockImpl>();
  hp_test::manual_seed(19);
  auto ref = std::make_shared<BlockImpl>();
  hp::parallelize_module(*b, mesh(), {{"norm", hp::SequenceParallel()}, {"proj", hp::NoParallel()}});
  at::Tensor xfull = random({2, 2 * n, 8}, 1);
  at::Tensor x = leaf(piece(xfull, 1)), xr = leaf(xfull);
  hp::CommDebugMode comm;
  at::Tensor y = hnn::call_with_hooks(*b, x);
  EXPECT_EQ(comm.get_comm_count("all_gather"), 1);  // the sequence shards gathered for NoParallel
  at::Tensor yr = ref->forward(xr);
  ASSERT_TRUE(close(y, yr));
  (y * y).sum().backward();
  (yr * yr).sum().backward();
  EXPECT_TRUE(close(x.grad(), piece(xr.grad(), 1)));
  for (const auto& p : b->named_parameters())
    EXPECT_TRUE(close(grad_of(p.value()), ref->named_parameters()[p.key()].grad())) << p.key();
}

namespace {
struct ProjBlockImpl : hnn::ModuleBase<ProjBlockImpl> {
  ProjBlockImpl(int64_t in, int64_t out) { proj = register_module("proj", hnn::Linear(in, out)); }
  at::Tensor forward(const at::Tensor& x) { return proj(x); }
  hnn::Linear proj{nullptr};
};
}  // namespace

TEST(TensorParallelNumerics, C10_PrepareModuleInputThenColwise) {
  const int64_t n = tp_size();
  hp_test::manual_seed(20);
  auto b = std::make_shared<ProjBlockImpl>(8, 4 * n);
  hp_test::manual_seed(20);
  auto ref = std::make_shared<ProjBlockImpl>(8, 4 * n);
  auto tp = mesh();
  hp::parallelize_module(*b, tp, hp::PrepareModuleInput(hp::Layouts{hp::Shard(0)}, hp::Layouts{hp::Replicate()}));
  hp::parallelize_module(*b, tp, {{"proj", hp::ColwiseParallel()}});
  at::Tensor xfull = random({2 * n, 8}, 1);
  at::Tensor x = leaf(piece(xfull, 0)), xr = leaf(xfull);
  at::Tensor y = hnn::call_with_hooks(*b, x);
  at::Tensor yr = ref->forward(xr);
  ASSERT_TRUE(close(gather_last(y), yr));
  at::Tensor w = random({2 * n, 4 * n}, 2);
  (y * piece(w, -1)).sum().backward();
  (yr * w).sum().backward();
  EXPECT_TRUE(close(x.grad(), piece(xr.grad(), 0)));
  EXPECT_TRUE(close(grad_of(b->proj->weight()), ref->proj->weight().grad()));
}

TEST(TensorParallelNumerics, C11_RowwiseThenPrepareModuleOutput) {
  const int64_t n = tp_size();
  auto l = seeded<hnn::Linear>(21, 4 * n, 6);
  auto ref = seeded<hnn::Linear>(21, 4 * n, 6);
  auto tp = mesh();
  hp::parallelize_module(*l, tp, hp::RowwiseParallel().use_local_output(false));
  hp::parallelize_module(*l, tp, hp::PrepareModuleOutput(hp::Layouts{hp::Replicate()}, hp::Layouts{hp::Shard(0)}));
  at::Tensor xfull = random({2 * n, 4 * n}, 1);
  at::Tensor x = leaf(piece(xfull, -1)), xr = leaf(xfull);
  at::Tensor y = l(x);  // rows of the output, as a local tensor
  at::Tensor yr = ref(xr);
  ASSERT_TRUE(close(y, piece(yr, 0)));
  at::Tensor w = random({2 * n, 6}, 2);
  (y * piece(w, 0)).sum().backward();
  (yr * w).sum().backward();
  EXPECT_TRUE(close(grad_of(l->weight()), ref->weight().grad()));
  EXPECT_TRUE(close(x.grad(), piece(xr.grad(), -1)));
}

TEST(TensorParallelNumerics, C12_PrepareModuleInputOutputMlpBlock) {
  const int64_t n = tp_size();
  auto m = seeded<Mlp>(22, 8, 4 * n);
  auto ref = seeded<Mlp>(22, 8, 4 * n);
  auto tp = mesh();
  hp::parallelize_module(*m, tp, hp::PrepareModuleInputOutput(hp::Layouts{hp::Shard(1)}, hp::Layouts{hp::Replicate()},
                                                               hp::Layouts{hp::Replicate()}, hp::Layouts{hp::Shard(1)}));
  hp::parallelize_module(*m, tp, {{"linear1", hp::ColwiseParallel()}, {"linear2", hp::RowwiseParallel()}});
  at::Tensor xfull = random({2, 2 * n, 8}, 1);
  at::Tensor x = leaf(piece(xfull, 1)), xr = leaf(xfull);
  at::Tensor y = m(x);
  at::Tensor yr = ref(xr);
  ASSERT_TRUE(close(y, piece(yr, 1)));
  at::Tensor w = random({2, 2 * n, 8}, 2);
  (y * piece(w, 1)).sum().backward();
  (yr * w).sum().backward();
  EXPECT_TRUE(close(x.grad(), piece(xr.grad(), 1)));
  for (const auto& p : m->named_parameters())
    EXPECT_TRUE(close(grad_of(p.value()), ref->named_parameters()[p.key()].grad())) << p.key();
}

namespace {
// libtorch 1.13 has no float16 matmul on CPU: this Linear-like module multiplies in float32 and
// hands back float16, so its Partial output (what reduce_dtype acts on) is float16 as on a GPU.
struct HalfLinearImpl : hnn::ModuleBase<HalfLinearImpl> {
  HalfLinearImpl(const at::Tensor& w, const at::Tensor& b) {
    register_parameter("weight", w.to(at::kHalf));
    register_parameter("bias", b.to(at::kHalf));
  }
  hnn::ModuleKind module_kind() const override { return hnn::ModuleKind::Linear; }
  at::Tensor forward(const at::Tensor& x) {
    return at::linear(x.to(at::kFloat), parameter("weight").to(at::kFloat), parameter("bias").to(at::kFloat)).to(at::kHalf);
  }
};
}  // namespace

TEST(TensorParallelNumerics, C13_RowwiseReduceDtypeFloat32) {
  const int64_t n = tp_size();
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    auto ref = seeded<hnn::Linear>(23, 16 * n, 32);
    at::Tensor xfull = (random({8, 16 * n}, 1) * 0.1).to(dtype);
    // The reference: the same low-precision values, computed in float32.
    at::Tensor w32 = ref->weight().detach().to(dtype).to(at::kFloat), b32 = ref->bias().detach().to(dtype).to(at::kFloat);
    at::Tensor yr = at::linear(xfull.to(at::kFloat), w32, b32);
    double err[2];
    for (int upcast = 0; upcast < 2; ++upcast) {
      std::shared_ptr<hnn::Module> l;
      if (dtype == at::kHalf) {
        l = std::make_shared<HalfLinearImpl>(ref->weight().detach(), ref->bias().detach());
      } else {
        auto lin = seeded<hnn::Linear>(23, 16 * n, 32);
        lin->to(dtype);
        l = lin.ptr();
      }
      auto style = hp::RowwiseParallel();
      if (upcast) style.reduce_dtype(at::kFloat);
      hp::parallelize_module(*l, mesh(), style);
      at::Tensor y = l->call_tensor(piece(xfull, -1));
      EXPECT_EQ(y.scalar_type(), upcast ? at::kFloat : dtype);
      err[upcast] = (y.to(at::kFloat) - yr).abs().mean().item<double>();
      if (upcast) EXPECT_TRUE(close(y, yr, 1e-3, 1e-3)) << dtype;
      y.to(at::kFloat).sum().backward();  // the low-precision backward runs too
      EXPECT_EQ(l->named_parameters()["weight"].grad().scalar_type(), dtype);
    }
    EXPECT_LT(err[1], err[0]) << dtype << ": reducing in float32 must be closer to the float32 reference";
  }
}

TEST(TensorParallelNumerics, C14_SequenceParallelOnDim2ForQkNorms) {
  const int64_t n = tp_size();
  // q/k norms over head_dim on (B, H, S, D) with the sequence on dim 2.
  hnn::RMSNorm norm(16), ref(16);
  {
    at::NoGradGuard g;
    norm->named_parameters()["weight"].copy_(random({16}, 3));
    ref->named_parameters()["weight"].copy_(random({16}, 3));
  }
  hp::parallelize_module(*norm, mesh(), hp::SequenceParallel(2));
  at::Tensor xfull = random({2, 3, 2 * n, 16}, 1);
  at::Tensor x = leaf(piece(xfull, 2)), xr = leaf(xfull);
  hp::DTensor y(norm(x));
  EXPECT_EQ(y.placements(), P{hp::Shard(2)});
  at::Tensor yr = ref(xr);
  ASSERT_TRUE(close(y, yr));
  at::Tensor w = random({2, 3, 2 * n, 16}, 2);
  (y.to_local() * piece(w, 2)).sum().backward();
  (yr * w).sum().backward();
  EXPECT_TRUE(close(x.grad(), piece(xr.grad(), 2)));
  EXPECT_TRUE(close(grad_of(norm->weight()), ref->weight().grad()));
}

TEST(TensorParallelNumerics, C10_PrepareModuleInputNoneSlotsAndKwargs) {
  const int64_t n = tp_size();
  TwoInputs m;
  auto tp = mesh();
  // Input 0 arrives row-sharded and is gathered; input 1 passes through untouched; the named
  // input "bias" arrives row-sharded and is gathered too.
  hp::parallelize_module(*m, tp, hp::PrepareModuleInput(hp::Layouts{hp::Shard(0), c10::nullopt}, hp::Layouts{hp::Replicate(), c10::nullopt},
                                                          hp::KwargLayouts{{"bias", hp::Shard(0)}},
                                                          hp::KwargLayouts{{"bias", hp::Replicate()}}, /*use_local_output=*/true));
  at::Tensor a = random({2 * n, 3}, 1), b = random({2 * n, 3}, 2), bias = random({2 * n, 3}, 3);
  at::Tensor out = m(piece(a, 0), b, hnn::Kwargs{{"bias", piece(bias, 0)}});
  EXPECT_FALSE(hp::is_dtensor(out));  // use_local_output: forward saw local tensors
  EXPECT_TRUE(close(out, a * 2 + b + bias));
}

TEST(TensorParallelNumerics, C11_PrepareModuleOutputTupleWithNoneSlot) {
  const int64_t n = tp_size();
  TwoOutputs m;
  hp::parallelize_module(*m, mesh(), hp::PrepareModuleOutput(hp::Layouts{hp::Shard(0), c10::nullopt}, hp::Layouts{hp::Replicate(), c10::nullopt}));
  at::Tensor x = random({2 * n, 3}, 1);
  auto [first, second] = m(piece(x, 0));
  EXPECT_TRUE(close(first, x * 3));                      // gathered to the whole tensor, returned local
  EXPECT_TRUE(at::equal(second, piece(x, 0) - 1));       // the None slot passes through as it was
  EXPECT_FALSE(hp::is_dtensor(second));
}

}  // namespace t_dist_tensor_parallel_numerics_test
