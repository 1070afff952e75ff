// Hook-capable modules, the standard layers against torch::nn, parameter replacement, FQNs.
#include <gtest/gtest.h>

#include <torch/nn.h>
#include <torch/optim.h>

#include <hyper_parallel/nn/layers.h>
#include <hyper_parallel/platform/platform.h>
#include <hyper_parallel/runtime/errors.h>

namespace hp = hyper_parallel;
namespace hnn = hyper_parallel::nn;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_unit_nn_module_test {
namespace {

// A module with two positional inputs, a named one and two outputs.
class TwoInTwoOutImpl : public hnn::ModuleBase<TwoInTwoOutImpl> {
 public:
  std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& a, const at::Tensor& b, const hnn::Kwargs& kw) {
    at::Tensor scale = at::ones({});
    for (const auto& [k, v] : kw)
      if (k == "scale") scale = v.toTensor();
    return {a + b, (a - b) * scale};
  }
};
HP_MODULE(TwoInTwoOut);

void copy_params(torch::nn::Module& from, torch::nn::Module& to) {
  at::NoGradGuard g;
  auto src = from.named_parameters();
  for (auto& p : to.named_parameters())
    if (src.contains(p.key())) p.value().copy_(src[p.key()]);
}

}  // namespace

TEST(ModuleHooks, RunInOrderReplaceAndRemove) {
  hnn::Linear lin(3, 2);
  std::vector<std::string> log;
  auto h1 = lin->register_forward_pre_hook([&](hnn::Module&, const std::vector<c10::IValue>& args) {
    log.push_back("pre1");
    return std::vector<c10::IValue>{args[0].toTensor() * 2};  // replaces the input
  });
  auto h2 = lin->register_forward_pre_hook([&](hnn::Module&, const std::vector<c10::IValue>&) {
    log.push_back("pre2");
    return c10::optional<std::vector<c10::IValue>>();
  });
  auto h3 = lin->register_forward_hook([&](hnn::Module&, const std::vector<c10::IValue>& args, const c10::IValue& out) {
    log.push_back("post");
    EXPECT_TRUE(at::equal(args[0].toTensor(), at::ones({1, 3}) * 2));  // hooks see the replaced args
    return c10::IValue(out.toTensor() + 1);
  });
  at::Tensor x = at::ones({1, 3});
  at::Tensor y = lin(x);
  EXPECT_EQ(log, (std::vector<std::string>{"pre1", "pre2", "post"}));
  EXPECT_TRUE(at::allclose(y, at::linear(x * 2, lin->weight(), lin->bias()) + 1));
  h1.remove();
  h3.remove();
  h3.remove();  // idempotent
  log.clear();
  EXPECT_TRUE(at::allclose(lin(x), at::linear(x, lin->weight(), lin->bias())));
  EXPECT_EQ(log, std::vector<std::string>{"pre2"});
  h2.remove();
  EXPECT_FALSE(lin->has_hooks());
}

TEST(ModuleHooks, KwargsAndTupleOutputs) {
  TwoInTwoOut m;
  m->register_forward_pre_hook_with_kwargs([](hnn::Module&, const std::vector<c10::IValue>& args, const hnn::Kwargs& kw)
                                               -> c10::optional<std::pair<std::vector<c10::IValue>, hnn::Kwargs>> {
    if (kw.empty()) return c10::nullopt;
    EXPECT_EQ(args.size(), 2u);
    EXPECT_EQ(kw[0].first, "scale");
    hnn::Kwargs out = kw;
    out[0].second = at::full({}, 10.0);  // replaces the named argument
    return std::make_pair(args, out);
  });
  at::Tensor seen_out;
  m->register_forward_hook([&](hnn::Module&, const std::vector<c10::IValue>&, const c10::IValue& out) {
    EXPECT_TRUE(out.isTuple());
    seen_out = out.toTupleRef().elements()[1].toTensor();
    return c10::optional<c10::IValue>();
  });
  auto [s, d] = m(at::ones({2}), at::zeros({2}), hnn::Kwargs{{"scale", at::full({}, 3.0)}});
  EXPECT_TRUE(at::equal(s, at::ones({2})));
  EXPECT_TRUE(at::equal(d, at::full({2}, 10.0)));
  EXPECT_TRUE(at::equal(seen_out, d));
  // A pre-hook that changes the number of positional arguments is refused.
  m->register_forward_pre_hook([](hnn::Module&, const std::vector<c10::IValue>& args) {
    return std::vector<c10::IValue>{args[0]};
  });
  EXPECT_THROW(m(at::ones({2}), at::zeros({2}), hnn::Kwargs{}), c10::ValueError);
}

TEST(ModuleHooks, AlwaysCallHooksRunWhenForwardOrAPreHookThrows) {
  hnn::Linear lin(3, 2);
  std::vector<std::string> log;
  bool fail_pre = false;
  lin->register_forward_pre_hook([&](hnn::Module&, const std::vector<c10::IValue>&) {
    log.push_back("pre");
    if (fail_pre) throw c10::ValueError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, "pre-hook failed");
    return c10::optional<std::vector<c10::IValue>>();
  });
  lin->register_forward_hook([&](hnn::Module&, const std::vector<c10::IValue>&, const c10::IValue& out) {
    log.push_back(out.isNone() ? "plain(None)" : "plain");
    return c10::optional<c10::IValue>();
  });
  lin->register_forward_hook(
      [&](hnn::Module&, const std::vector<c10::IValue>&, const c10::IValue& out) {
        log.push_back(out.isNone() ? "always(None)" : "always");
        return c10::optional<c10::IValue>();
      },
      /*always_call=*/true);
  lin(at::ones({1, 3}));
  EXPECT_EQ(log, (std::vector<std::string>{"pre", "plain", "always"}));
  // A shape error inside forward: only the always_call hook runs, then the same exception.
  log.clear();
  EXPECT_THROW(lin(at::ones({1, 4})), c10::Error);
  EXPECT_EQ(log, (std::vector<std::string>{"pre", "always(None)"}));
  // A pre-hook that throws: likewise.
  log.clear();
  fail_pre = true;
  EXPECT_THROW(lin(at::ones({1, 3})), c10::ValueError);
  EXPECT_EQ(log, (std::vector<std::string>{"pre", "always(None)"}));
  // An always_call hook that throws while handling: a warning; the first exception propagates.
  lin->register_forward_hook([](hnn::Module&, const std::vector<c10::IValue>&, const c10::IValue&) -> c10::optional<c10::IValue> {
    throw std::runtime_error("cleanup failed");
  }, true);
  EXPECT_THROW(lin(at::ones({1, 3})), c10::ValueError);
}

TEST(Layers, MatchTorchNnForwardAndBackward) {
  torch::manual_seed(0);
  at::Tensor x = at::randn({2, 3, 8}, at::requires_grad());
  auto check = [&](const char* name, torch::nn::Module& ours, torch::nn::Module& theirs,
                   const std::function<at::Tensor(const at::Tensor&)>& f_ours,
                   const std::function<at::Tensor(const at::Tensor&)>& f_theirs) {
    copy_params(theirs, ours);
    at::Tensor xa = x.detach().clone().requires_grad_(true), xb = x.detach().clone().requires_grad_(true);
    at::Tensor ya = f_ours(xa), yb = f_theirs(xb);
    EXPECT_TRUE(at::allclose(ya, yb, 1e-6, 1e-6)) << name;
    (ya * ya).sum().backward();
    (yb * yb).sum().backward();
    EXPECT_TRUE(at::allclose(xa.grad(), xb.grad(), 1e-5, 1e-6)) << name;
    auto pb = theirs.named_parameters();
    for (auto& p : ours.named_parameters())
      if (pb.contains(p.key())) EXPECT_TRUE(at::allclose(p.value().grad(), pb[p.key()].grad(), 1e-5, 1e-6)) << name << " " << p.key();
  };
  hnn::Linear l(8, 5);
  torch::nn::Linear tl(8, 5);
  check("linear", *l, *tl, [&](const at::Tensor& t) { return l(t); }, [&](const at::Tensor& t) { return tl(t); });
  hnn::Linear lnb(hnn::LinearOptions(8, 4).bias(false));
  torch::nn::Linear tlnb(torch::nn::LinearOptions(8, 4).bias(false));
  EXPECT_FALSE(lnb->bias().defined());
  check("linear no bias", *lnb, *tlnb, [&](const at::Tensor& t) { return lnb(t); }, [&](const at::Tensor& t) { return tlnb(t); });
  hnn::LayerNorm ln(std::vector<int64_t>{8});
  torch::nn::LayerNorm tln(torch::nn::LayerNormOptions({8}));
  check("layer_norm", *ln, *tln, [&](const at::Tensor& t) { return ln(t); }, [&](const at::Tensor& t) { return tln(t); });
  hnn::LayerNorm ln2(hnn::LayerNormOptions({8}).elementwise_affine(false));
  torch::nn::LayerNorm tln2(torch::nn::LayerNormOptions({8}).elementwise_affine(false));
  EXPECT_EQ(ln2->parameters().size(), 0u);
  check("layer_norm no affine", *ln2, *tln2, [&](const at::Tensor& t) { return ln2(t); }, [&](const at::Tensor& t) { return tln2(t); });
  hnn::GELU g("tanh");
  torch::nn::GELU tg(torch::nn::GELUOptions().approximate("tanh"));
  check("gelu", *g, *tg, [&](const at::Tensor& t) { return g(t); }, [&](const at::Tensor& t) { return tg(t); });
  hnn::ReLU r;
  torch::nn::ReLU tr;
  check("relu", *r, *tr, [&](const at::Tensor& t) { return r(t); }, [&](const at::Tensor& t) { return tr(t); });
  hnn::SiLU si;
  torch::nn::SiLU tsi;
  check("silu", *si, *tsi, [&](const at::Tensor& t) { return si(t); }, [&](const at::Tensor& t) { return tsi(t); });
  hnn::Dropout d(0.5);
  torch::nn::Dropout td(0.5);
  d->eval();
  td->eval();
  check("dropout eval", *d, *td, [&](const at::Tensor& t) { return d(t); }, [&](const at::Tensor& t) { return td(t); });
  hnn::RMSNorm rms(hnn::RMSNormOptions(8).eps(1e-5));
  torch::nn::Identity ti;
  check("rms_norm", *rms, *ti, [&](const at::Tensor& t) { return rms(t); }, [&](const at::Tensor& t) {
    return t * at::rsqrt(t.pow(2).mean(-1, true) + 1e-5) * rms->weight().detach();
  });
  hnn::Sequential seq(hnn::Linear(8, 6), hnn::ReLU(), hnn::Linear(6, 3));
  torch::nn::Sequential tseq(torch::nn::Linear(8, 6), torch::nn::ReLU(), torch::nn::Linear(6, 3));
  check("sequential", *seq, *tseq, [&](const at::Tensor& t) { return seq(t); }, [&](const at::Tensor& t) { return tseq->forward(t); });
}

TEST(Layers, EmbeddingMatchesTorchWithPadding) {
  hnn::Embedding e(hnn::EmbeddingOptions(10, 4).padding_idx(1));
  torch::nn::Embedding te(torch::nn::EmbeddingOptions(10, 4).padding_idx(1));
  EXPECT_TRUE(at::equal(e->weight()[1], at::zeros({4})));
  copy_params(*te, *e);
  at::Tensor ids = at::tensor(std::vector<int64_t>{1, 3, 3, 9}, at::kLong).reshape({2, 2});
  at::Tensor a = e(ids), b = te(ids);
  EXPECT_TRUE(at::equal(a, b));
  a.sum().backward();
  b.sum().backward();
  EXPECT_TRUE(at::equal(e->weight().grad(), te->weight.grad()));
  EXPECT_TRUE(at::equal(e->weight().grad()[1], at::zeros({4})));  // padding row gets no gradient
}

TEST(Layers, FullyQualifiedNames) {
  struct BlockImpl : hnn::ModuleBase<BlockImpl> {
    BlockImpl() {
      attn = register_module("attn", hnn::Sequential(hnn::Linear(4, 4), hnn::Linear(4, 4)));
      norm = register_module("norm", hnn::RMSNorm(4));
    }
    at::Tensor forward(const at::Tensor& x) { return norm(attn(x)); }
    hnn::Sequential attn{nullptr};
    hnn::RMSNorm norm{nullptr};
  };
  struct ModelImpl : hnn::ModuleBase<ModelImpl> {
    ModelImpl() {
      layers = register_module("layers", hnn::ModuleList());
      for (int i = 0; i < 2; ++i) layers->push_back(std::make_shared<BlockImpl>());
    }
    hnn::ModuleList layers;
  };
  ModelImpl m;
  std::vector<std::string> names;
  for (const auto& item : m.named_modules("", /*include_self=*/false)) names.push_back(item.key());
  EXPECT_EQ(names, (std::vector<std::string>{"layers", "layers.0", "layers.0.attn", "layers.0.attn.0", "layers.0.attn.1",
                                              "layers.0.norm", "layers.1", "layers.1.attn", "layers.1.attn.0",
                                              "layers.1.attn.1", "layers.1.norm"}));
  EXPECT_TRUE(m.named_parameters().contains("layers.1.attn.0.weight"));
  EXPECT_TRUE(m.named_parameters().contains("layers.0.norm.weight"));
}

TEST(Parameters, ReplacedParameterIsUsedAndOptimised) {
  hnn::Linear l(3, 2);
  at::Tensor w = at::ones({2, 3});
  l->replace_parameter("weight", w);
  EXPECT_TRUE(l->weight().requires_grad());  // kept
  EXPECT_EQ(l->weight().unsafeGetTensorImpl(), w.unsafeGetTensorImpl());
  at::Tensor x = at::ones({1, 3});
  EXPECT_TRUE(at::allclose(l(x), at::full({1, 2}, 3.0) + l->bias()));
  torch::optim::SGD opt(l->parameters(), torch::optim::SGDOptions(0.5));
  l(x).sum().backward();
  opt.step();
  EXPECT_TRUE(at::allclose(l->weight(), at::full({2, 3}, 0.5)));  // 1 - 0.5 * 1
  EXPECT_TRUE(at::equal(w, l->weight()));  // updated in place: the same tensor
  EXPECT_THROW(l->replace_parameter("weight", at::ones({3, 2})), c10::ValueError);
  EXPECT_THROW(l->replace_parameter("weight", at::ones({2, 3}, at::kDouble)), c10::ValueError);
  EXPECT_THROW(l->replace_parameter("nope", at::ones({2, 3})), c10::IndexError);
  struct WithBufferImpl : hnn::ModuleBase<WithBufferImpl> {
    WithBufferImpl() { register_buffer("steps", at::zeros({2})); }
  } b;
  b.replace_buffer("steps", at::ones({2}));
  EXPECT_TRUE(at::equal(b.named_buffers()["steps"], at::ones({2})));
  EXPECT_THROW(b.replace_buffer("steps", at::ones({3})), c10::ValueError);
}

TEST(Platform, KindsAndHookability) {
  hnn::Linear l(2, 2);
  hnn::Embedding e(4, 2);
  hnn::LayerNorm ln(std::vector<int64_t>{2});
  torch::nn::Linear tl(2, 2);
  EXPECT_TRUE(hp::platform::is_linear_module(*l));
  EXPECT_FALSE(hp::platform::is_linear_module(*e));
  EXPECT_TRUE(hp::platform::is_embedding_module(*e));
  EXPECT_FALSE(hp::platform::is_linear_module(*ln));
  EXPECT_FALSE(hp::platform::is_linear_module(*tl));  // not hookable, so not shardable
  EXPECT_TRUE(hp::platform::is_hookable(*ln));
  EXPECT_FALSE(hp::platform::is_hookable(*tl));
  try {
    hp::platform::hookable(*tl, "layers.0.proj");
    FAIL();
  } catch (const c10::TypeError& err) {
    EXPECT_NE(std::string(err.what()).find("layers.0.proj"), std::string::npos);
    EXPECT_NE(std::string(err.what()).find("hyper_parallel::nn::Linear"), std::string::npos);
  }
  // A user's module declares itself Linear-like.
  struct MyProjImpl : hnn::ModuleBase<MyProjImpl> {
    MyProjImpl() { register_parameter("weight", at::ones({4, 2})); }
    hnn::ModuleKind module_kind() const override { return hnn::ModuleKind::Linear; }
    at::Tensor forward(const at::Tensor& x) { return at::linear(x, parameter("weight")); }
  } mine;
  EXPECT_TRUE(hp::platform::is_linear_module(mine));
  int calls = 0;
  hp::platform::register_forward_pre_hook(*l, [&](hnn::Module&, const std::vector<c10::IValue>&, const hnn::Kwargs&) {
    ++calls;
    return c10::optional<std::pair<std::vector<c10::IValue>, hnn::Kwargs>>();
  }, /*with_kwargs=*/false);
  l(at::ones({1, 2}));
  EXPECT_EQ(calls, 1);
}

}  // namespace t_unit_nn_module_test
