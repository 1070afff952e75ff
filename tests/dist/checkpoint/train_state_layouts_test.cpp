// A train state saved at one layout loads at another, moving bytes only: the parameters and AdamW
// moments of a Qwen3-MoE model, gathered whole after the load, are bitwise the state saved (read
// back whole in one process on every rank), for tp=2 -> dp x tp = 2 x 2, dp=4 -> HSDP 2 x 2,
// pp=2 -> tp=2 and ep=2 -> ep=1; and a run with experts over ep resumed from its state is bitwise
// the run that never stopped.
#include <gtest/gtest.h>

#include <hyper_parallel/checkpoint/train_state.h>

#include <cstring>
#include <filesystem>

#include "../nn/training_util.h"
#include "train_state_util.h"

#include <hyper_parallel/models/qwen3/parallelize.h>

using namespace training_test;
using train_state_test::Scratch;
using train_state_test::same_bits;
namespace hnn = hyper_parallel::nn;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_checkpoint_train_state_layouts_test {
namespace {

qwen3::Config moe_config() { return small_moe_config(); }

// A model and its optimizer at one layout of the 4 ranks.
struct Layout {
  explicit Layout(const std::string& layout, uint64_t seed = 3) {
    qwen3::Config c = moe_config();
    c.attention_dropout = 0.1;  // drawn from our generator, which the train state carries
    const int64_t r = hp::get_rank();
    hp::models::StageSpan span;
    if (layout == "pp2") {
      mesh = hp::init_device_mesh("cpu", {2, 2}, {"pp", "dp"});
      span = qwen3::pipeline_stage_span(c, r / 2, 2);
    }
    {
      hnn::ParameterScope meta(at::TensorOptions().device(at::kMeta));
      model = qwen3::CausalLM(c, span);
    }
    if (layout == "tp2" || layout == "dp2xtp2") {
      mesh = hp::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
      qwen3::parallelize_qwen3_tp(*model, (*mesh)["tp"], /*sequence_parallel=*/false);
      if (layout == "dp2xtp2") hp::fully_shard(*model, (*mesh)["dp"]);
    } else if (layout == "dp4") {
      mesh = hp::init_device_mesh("cpu", {4}, {"dp"});
      hp::fully_shard(*model, *mesh);
    } else if (layout == "hsdp") {
      mesh = hp::init_device_mesh("cpu", {2, 2}, {"dp_replicate", "dp_shard"});
      hp::fully_shard(*model, *mesh);
    } else if (layout == "ep2" || layout == "dp2xep2") {
      mesh = hp::init_device_mesh("cpu", {2, 2}, {"dp", "ep"});
      qwen3::parallelize_qwen3_experts(*model, (*mesh)["ep"]);
      if (layout == "dp2xep2") {
        // As the MoE training tests: the experts sharded over dp (their gradients summed over
        // every data rank), everything else over dp x ep.
        hp::FullyShardOptions experts;
        experts.gradient_divide_factor = 4.0;
        for (const auto& layer : *model->layers)
          if (auto moe = layer->as<qwen3::DecoderLayerImpl>()->moe) hp::fully_shard(*moe->experts, (*mesh)["dp"], experts);
        hp::fully_shard(*model, (*mesh)[{"dp", "ep"}]);
      }
    }
    hp::manual_seed(seed);
    hp::init_parameters(*model, "cpu");
    opt = std::make_unique<torch::optim::AdamW>(hp::unique_parameters(*model), torch::optim::AdamWOptions(1e-2));
    state = {model.get(), opt.get()};
  }

  // Optimizer steps on gradients that depend only on each parameter's name and global shape,
  // laid out as the parameter is; the shared expert-free router of a sparse layer gets none (no
  // state, on load too).
  void step(uint64_t salt) {
    for (const auto& p : model->named_parameters()) {
      if (p.key().find("experts.gate_proj") != std::string::npos && salt == 0) continue;  // no gradient at the first step
      const uint64_t seed = std::hash<std::string>()(p.key()) + salt;
      const at::Tensor g = hp_test::random(p.value().sizes().vec(), seed);
      at::Tensor grad = g;
      if (hp::is_dtensor(p.value())) {
        const hp::DTensor d(p.value());
        const auto [shape, offset] = d.spec().local_shape_and_offset(*d.device_mesh().get_coordinate());
        at::Tensor local = g;
        for (size_t k = 0; k < shape.size(); ++k) local = local.narrow(static_cast<int64_t>(k), offset[k], shape[k]);
        grad = hp::DTensor::from_local(local.contiguous(), d.device_mesh(), d.placements());
      }
      p.value().mutable_grad() = grad;
    }
    opt->step();
    opt->zero_grad();
    ++state.step;
  }

  // A training step on this data rank's rows (dp x ep = 2 x 2: four data ranks), with dropout
  // drawn from the generators the train state carries; the loss's bits recorded.
  void train_step(int64_t step) {
    const qwen3::Config c = moe_config();
    const int64_t data_rank = mesh->get_local_rank(0) * 2 + mesh->get_local_rank(1);
    at::Tensor tokens = token_batch(c.vocab_size, 8, 9, 500 + static_cast<uint64_t>(step));
    tokens = at::where(at::rand(tokens.sizes()) < 0.1, at::zeros_like(tokens), tokens);  // torch's generator decides
    const at::Tensor mine = dp_rows(tokens, data_rank, 4);
    const at::Tensor ce = qwen3::causal_lm_loss(model(mine.narrow(1, 0, 8)), mine.narrow(1, 1, 8));  // first: aux_loss reads its router logits
    at::Tensor loss = ce + c.router_aux_loss_coef * model->aux_loss(hp::world_group());
    loss.backward();
    const float f = loss.item<float>();
    uint32_t u;
    std::memcpy(&u, &f, 4);
    record.push_back(u);
    opt->step();
    opt->zero_grad();
    ++state.step;
  }
  std::vector<uint32_t> record;

  std::map<std::string, at::Tensor> gathered() { return train_state_test::gathered_state(*model, *opt); }

  c10::optional<hp::DeviceMesh> mesh;
  qwen3::CausalLM model{nullptr};
  std::unique_ptr<torch::optim::AdamW> opt;
  hp::TrainState state;
};

// Every entry of `part` is in `all` with the same bits (`part`: what one rank holds).
void expect_subset(const std::map<std::string, at::Tensor>& part, const std::map<std::string, at::Tensor>& all, const std::string& what) {
  EXPECT_FALSE(part.empty());
  for (const auto& [k, v] : part) {
    auto it = all.find(k);
    ASSERT_NE(it, all.end()) << what << ": " << k << " missing";
    EXPECT_TRUE(same_bits(v, it->second)) << what << ": " << k;
  }
}

void expect_resharded(const std::string& from, const std::string& to) {
  SCOPED_TRACE(from + " -> " + to);
  const Scratch dir(from + "_" + to);
  std::map<std::string, at::Tensor> source;
  {
    Layout run(from);
    run.step(0);
    run.step(1);
    hp::save_train_state(dir.path, run.state);
    source = run.gathered();
  }
  // The state read back whole: every rank loads it into one process's model.
  Layout whole_run("plain", 99);
  hp::load_train_state(dir.path, whole_run.state);
  const auto saved = whole_run.gathered();
  EXPECT_EQ(saved.count("layers.1.mlp.experts.gate_proj.exp_avg") + saved.count("layers.1.moe.experts.gate_proj.exp_avg"), 1u)
      << "the experts stepped once must have state";
  expect_subset(source, saved, "the source's own state");
  Layout target(to, 98);
  EXPECT_EQ(target.state.step, 0);
  hp::load_train_state(dir.path, target.state);
  expect_subset(target.gathered(), saved, "the target's loaded state");
  // The companion: one element off must be seen.
  auto off = target.gathered();
  off.begin()->second.view({-1})[0] += 1;
  EXPECT_FALSE(same_bits(off.begin()->second, saved.at(off.begin()->first)));
}

}  // namespace

// Experts over ep with FSDP over dp x ep: saved at step 3 and resumed in fresh objects (other
// initial values, the generators moved on), the losses of steps 3..5 and the final parameters and
// moments are bitwise those of the run that never stopped.
TEST(TrainStateLayoutsDist, ExpertParallelRunResumesBitwise) {
  ASSERT_EQ(hp::get_world_size(), 4);
  const Scratch dir("ep_resume");
  at::manual_seed(5);
  Layout reference("dp2xep2");
  for (int64_t s = 0; s < 6; ++s) reference.train_step(s);
  at::manual_seed(5);
  {
    Layout first("dp2xep2");
    for (int64_t s = 0; s < 3; ++s) first.train_step(s);
    hp::save_train_state(dir.path, first.state);
  }
  at::manual_seed(77);
  Layout resumed("dp2xep2", 41);
  hp::load_train_state(dir.path, resumed.state);
  for (int64_t s = 3; s < 6; ++s) resumed.train_step(s);
  EXPECT_EQ(resumed.record, std::vector<uint32_t>(reference.record.begin() + 3, reference.record.end()));
  const auto want = reference.gathered();
  const auto got = resumed.gathered();
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [k, v] : want) EXPECT_TRUE(same_bits(v, got.at(k))) << k;
  // The companion: resumed without torch's generator state (the masks then differ), it drifts.
  at::manual_seed(5);
  Layout again("dp2xep2", 41);
  hp::load_train_state(dir.path, again.state);
  at::manual_seed(6);
  for (int64_t s = 3; s < 6; ++s) again.train_step(s);
  EXPECT_NE(again.record, std::vector<uint32_t>(reference.record.begin() + 3, reference.record.end()));
}

TEST(TrainStateLayoutsDist, StateSavedAtOneLayoutLoadsBitwiseAtAnother) {
  ASSERT_EQ(hp::get_world_size(), 4);
  expect_resharded("tp2", "dp2xtp2");
  expect_resharded("dp4", "hsdp");
  expect_resharded("pp2", "tp2");
  expect_resharded("ep2", "plain");
}

}  // namespace t_dist_checkpoint_train_state_layouts_test
