// Meta construction + init_parameters / to_empty in one process: the values equal eager
// construction's bit for bit, nothing stays uninitialised, tied weights stay one tensor, and bad
// calls are refused before anything changes.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Context.h>

#include <hyper_parallel/dtensor/random.h>
#include <hyper_parallel/nn/init_parameters.h>
#include <hyper_parallel/nn/layers.h>
#include <hyper_parallel/runtime/errors.h>

#include "../../common/error_message.h"
#include "../../common/test_util.h"

namespace hp = hyper_parallel;
namespace hnn = hyper_parallel::nn;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_unit_nn_init_parameters_test {
namespace {

// Every kind of layer with parameters, a bias, a padding row and a weight tied across modules.
class SmallNetImpl : public hnn::ModuleBase<SmallNetImpl> {
 public:
  explicit SmallNetImpl(bool tied) {
    embed = register_module("embed", hnn::Embedding(hnn::EmbeddingOptions(11, 6).padding_idx(2)));
    norm = register_module("norm", hnn::LayerNorm(hnn::LayerNormOptions({6})));
    proj = register_module("proj", hnn::Linear(6, 7));
    rms = register_module("rms", hnn::RMSNorm(7));
    head = register_module("head", hnn::Linear(hnn::LinearOptions(7, 11).bias(false)));
    if (tied) out = register_module("out", hnn::Linear(hnn::LinearOptions(6, 11).bias(false)));
    if (tied) out->replace_parameter("weight", embed->weight());
  }
  at::Tensor forward(const at::Tensor& ids) { return head(rms(proj(norm(embed(ids))))); }
  hnn::Embedding embed{nullptr};
  hnn::LayerNorm norm{nullptr};
  hnn::Linear proj{nullptr}, head{nullptr}, out{nullptr};
  hnn::RMSNorm rms{nullptr};
};
HP_MODULE(SmallNet);

SmallNet meta_net(bool tied) {
  hnn::ParameterScope meta(at::TensorOptions().device(at::kMeta));
  return SmallNet(tied);
}

// A parameter holder without reset_parameters.
class NoResetImpl : public hnn::ModuleBase<NoResetImpl> {
 public:
  NoResetImpl() { register_parameter("scale", at::empty({3}, hnn::ParameterScope::current())); }
  at::Tensor forward(const at::Tensor& x) { return x * parameter("scale"); }
};
HP_MODULE(NoReset);

// Expects `call` to throw exactly `Error` with every one of `parts` in its message.
template <class Error, class F>
void expect_error(F&& call, std::initializer_list<const char*> parts) {
  bool right_type = false;
  try {
    call();
  } catch (const Error&) {
    right_type = true;
  } catch (...) {
  }
  EXPECT_TRUE(right_type) << "not the expected exception type: " << hp_test::error_message(call);
  const std::string message = hp_test::error_message(call);
  for (const char* p : parts) EXPECT_NE(message.find(p), std::string::npos) << "'" << p << "' is not in: " << message;
}

}  // namespace

TEST(InitParameters, MetaBuiltModelEqualsEagerConstructionBitwise) {
  for (const bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    hp::manual_seed(17);
    SmallNet eager(tied);
    hp::manual_seed(17);
    SmallNet net = meta_net(tied);
    for (const auto& p : net->parameters()) EXPECT_TRUE(p.is_meta());
    hp_test::FillUninitialised nan_fill;
    hp::init_parameters(*net, "cpu");
    auto expected = eager->named_parameters();
    ASSERT_EQ(net->named_parameters().size(), expected.size());
    for (const auto& p : net->named_parameters()) {
      EXPECT_EQ(p.value().device(), at::Device("cpu")) << p.key();
      EXPECT_FALSE(p.value().isnan().any().item<bool>()) << p.key() << " has an uninitialised element";
      EXPECT_TRUE(at::equal(p.value(), expected[p.key()])) << p.key();
      EXPECT_TRUE(p.value().requires_grad()) << p.key();
    }
    EXPECT_TRUE(at::equal(net->embed->weight()[2], at::zeros({6}))) << "the padding row";
    if (tied) EXPECT_TRUE(net->out->weight().is_same(net->embed->weight())) << "a tied weight stays one tensor";
    // The distributions are torch's: Linear's bound is 1/sqrt(in_features).
    EXPECT_LE(net->proj->weight().abs().max().item<double>(), 1.0 / std::sqrt(6.0));
  }
}

TEST(InitParameters, KeepsTensorIdentity) {
  SmallNet net = meta_net(true);
  const at::Tensor before = net->proj->weight();
  hp::init_parameters(*net, "cpu");
  EXPECT_TRUE(before.is_same(net->proj->weight())) << "the parameter is filled in place";
  EXPECT_FALSE(before.is_meta());
  // It trains: gradients reach the materialised parameters.
  net->forward(at::tensor({1, 2, 3}, at::kLong)).sum().backward();
  for (const auto& p : net->named_parameters()) EXPECT_TRUE(p.value().grad().defined()) << p.key();
}

TEST(InitParameters, ToEmptyAllocatesInTheModulesDtype) {
  SmallNet net{nullptr};
  {
    hnn::ParameterScope meta(at::TensorOptions().device(at::kMeta).dtype(at::kBFloat16));
    net = SmallNet(false);
  }
  hp_test::FillUninitialised nan_fill;
  hp::to_empty(*net, "cpu");
  for (const auto& p : net->named_parameters()) {
    EXPECT_EQ(p.value().scalar_type(), at::kBFloat16) << p.key();
    EXPECT_FALSE(p.value().is_meta()) << p.key();
    // Allocated, not initialised: what the NaN check of init_parameters would catch.
    EXPECT_TRUE(p.value().isnan().all().item<bool>()) << p.key();
  }
}

TEST(InitParameters, RefusesWhatItCannotMaterialiseBeforeChangingAnything) {
  {
    SmallNet net = meta_net(false);
    hp::init_parameters(*net, "cpu");
    expect_error<c10::ValueError>([&] { hp::init_parameters(*net, "cpu"); },
                                  {"hyper_parallel::init_parameters: no parameter or buffer of", "materialised already"});
    expect_error<c10::ValueError>([&] { hp::to_empty(*net, "cpu"); }, {"hyper_parallel::to_empty: no parameter or buffer of"});
  }
  {
    SmallNet net = meta_net(false);
    net->rms->replace_parameter("weight", at::ones({7}));
    expect_error<c10::ValueError>([&] { hp::init_parameters(*net, "cpu"); },
                                  {"mixes meta tensors with materialised ones", "'rms.weight' (cpu) is not on meta"});
    EXPECT_TRUE(net->proj->weight().is_meta()) << "nothing was allocated";
  }
  {
    SmallNet net = meta_net(false);
    expect_error<c10::ValueError>([&] { hp::init_parameters(*net, "meta"); }, {"the target device is meta"});
  }
  {
    hnn::Sequential seq{nullptr};
    {
      hnn::ParameterScope meta(at::TensorOptions().device(at::kMeta));
      seq = hnn::Sequential(hnn::Linear(3, 3), NoReset());
    }
    expect_error<c10::NotImplementedError>([&] { hp::init_parameters(*seq, "cpu"); },
                                           {"hyper_parallel::nn::Module::reset_parameters:", "does not override reset_parameters"});
    for (const auto& p : seq->parameters()) EXPECT_TRUE(p.is_meta()) << "nothing was allocated";
    hp::to_empty(*seq, "cpu");  // allocating without initialising needs no reset_parameters
    for (const auto& p : seq->parameters()) EXPECT_FALSE(p.is_meta());
  }
}

TEST(InitParameters, RandomFillsOfMetaTensorsTakeNoCallNumber) {
  hp::manual_seed(5);
  at::Tensor a = at::empty({4});
  hp::normal_(a);
  hp::manual_seed(5);
  at::Tensor m = at::empty({1000}, at::TensorOptions().device(at::kMeta));
  hp::uniform_(m);
  hp::normal_(m);
  at::Tensor b = at::empty({4});
  hp::normal_(b);
  EXPECT_TRUE(at::equal(a, b));
}

}  // namespace t_unit_nn_init_parameters_test
