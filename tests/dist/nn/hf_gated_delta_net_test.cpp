// The GatedDeltaNet module, with the projections and gated norm a Qwen3.5 linear-attention layer
// puts around it, against transformers' Qwen3_5GatedDeltaNet (tests/tools/hf_reference.py: every
// weight random, 70 tokens): the output, the input's and every parameter's gradient, and a cached
// prefill of 40 tokens followed by three single-token steps. HF's fused in_proj_qkv and conv1d
// rows load into our three q/k/v sections. One process (models_hf_np1).
#include <gtest/gtest.h>

#include <hyper_parallel/nn/gated_delta_net.h>
#include <hyper_parallel/nn/layers.h>

#include "../../common/hf_reference.h"

namespace hnn = hyper_parallel::nn;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_nn_hf_gated_delta_net_test {
namespace {

constexpr int64_t kHidden = 32, kNk = 2, kNv = 4, kDk = 8, kDv = 16;

// A Qwen3.5 linear-attention layer from our pieces.
struct Layer {
  static hnn::LinearOptions proj(int64_t in, int64_t out) { return hnn::LinearOptions(in, out).bias(false); }
  hnn::Linear q{proj(kHidden, kNk * kDk)}, k{proj(kHidden, kNk * kDk)}, v{proj(kHidden, kNv * kDv)}, z{proj(kHidden, kNv * kDv)},
      a{proj(kHidden, kNv)}, b{proj(kHidden, kNv)}, out{proj(kNv * kDv, kHidden)};
  hnn::GatedDeltaNet core{hnn::GatedDeltaNetOptions(kNk, kNv, kDk, kDv)};
  hnn::RMSNormGated norm{kDv};

  at::Tensor forward(const at::Tensor& x, hnn::GatedDeltaNetState* state = nullptr) {
    const int64_t bsz = x.size(0), s = x.size(1);
    const at::Tensor o = core->forward(q(x), k(x), v(x), a(x), b(x), state);
    const at::Tensor n = norm(o, z(x).view({bsz, s, kNv, kDv}));
    return out(n.reshape({bsz, s, kNv * kDv}));
  }
  // HF's name -> (our tensor, the rows of HF's tensor it holds); several of ours share a fused one.
  std::vector<std::tuple<std::string, at::Tensor, int64_t>> sections() {
    const int64_t kd = kNk * kDk;
    return {{"in_proj_qkv.weight", q->weight(), 0},        {"in_proj_qkv.weight", k->weight(), kd},
            {"in_proj_qkv.weight", v->weight(), 2 * kd},   {"conv1d.weight", core->parameter("conv_q"), 0},
            {"conv1d.weight", core->parameter("conv_k"), kd}, {"conv1d.weight", core->parameter("conv_v"), 2 * kd},
            {"in_proj_z.weight", z->weight(), 0},          {"in_proj_a.weight", a->weight(), 0},
            {"in_proj_b.weight", b->weight(), 0},          {"out_proj.weight", out->weight(), 0},
            {"A_log", core->parameter("A_log"), 0},        {"dt_bias", core->parameter("dt_bias"), 0},
            {"norm.weight", norm->parameter("weight"), 0}};
  }
};


}  // namespace

TEST(HFGatedDeltaNet, LayerMatchesTransformersOutputAndEveryGradient) {
  HP_REQUIRE_HF_REFERENCE(ref, "gated_delta_net");
  const std::string d = ref + "/gated_delta_net";
  auto t = [&](const std::string& name) { return hp_test::hf_expected(d, name.c_str()); };
  Layer layer;
  {
    at::NoGradGuard g;
    for (auto& [name, ours, row] : layer.sections()) ours.copy_(t(name).narrow(0, row, ours.size(0)));
  }
  const at::Tensor x = t("x").requires_grad_();
  const at::Tensor y = layer.forward(x);
  EXPECT_TRUE(hp_test::near_relative(y, t("y"), 1e-5));
  (y * t("wy")).sum().backward();
  EXPECT_TRUE(hp_test::near_relative(x.grad(), t("grad_x"), 1e-5));
  for (auto& [name, ours, row] : layer.sections())
    EXPECT_TRUE(hp_test::near_relative(ours.grad(), t("grad." + name).narrow(0, row, ours.size(0)), 1e-5)) << name << " rows from " << row;

  // The cached path: prefill, then the recurrence one token at a time.
  at::NoGradGuard g;
  hnn::GatedDeltaNetState state;
  std::vector<at::Tensor> steps{layer.forward(t("x").narrow(1, 0, 40), &state)};
  EXPECT_EQ(state.conv.sizes(), at::IntArrayRef({2, 2 * kNk * kDk + kNv * kDv, 4}));
  EXPECT_EQ(state.recurrent.sizes(), at::IntArrayRef({2, kNv, kDk, kDv}));
  for (int64_t i = 40; i < 43; ++i) steps.push_back(layer.forward(t("x").narrow(1, i, 1), &state));
  EXPECT_TRUE(hp_test::near_relative(at::cat(steps, 1), t("cached_y"), 1e-5));
  EXPECT_TRUE(hp_test::near_relative(at::cat(steps, 1), t("y").narrow(1, 0, 43), 1e-5)) << "the cached steps against one pass";
}

}  // namespace t_dist_nn_hf_gated_delta_net_test
