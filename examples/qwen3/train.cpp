// The main demo: trains a Qwen3 (or, with --model qwen3_5, a Qwen3.5) model with tensor parallelism (run it under hprun), then
// the same training in one process from the same seed, and compares the two loss curves. Then it
// saves the trained model as a Hugging Face checkpoint (safetensors, config.json, a byte-level
// tokenizer.json), loads it back with another TP layout, generates a continuation of a prompt, and
// does the same in one process: the tokens must be the same.
//   build/tools/hprun/hprun --nproc-per-node 2 build/examples/qwen3/qwen3_train [--steps 30] ...
// Text: byte-level tokens of --text (default: the GPL-3 text every Debian system ships).
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim.h>

#include <hyper_parallel/hyper_parallel.h>
#include <hyper_parallel/optim/lr_scheduler.h>
#include <hyper_parallel/runtime/fault_injection.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>

#include <hyper_parallel/models/tokenizer.h>

#include "families.h"
#include "train_args.h"

namespace qwen3 = hyper_parallel::qwen3;

namespace hp = hyper_parallel;
namespace hnn = hyper_parallel::nn;
using demo::Args;
using demo::usage;

namespace {

int64_t dp_degree(const Args& a) { return a.dims.dp_replicate * a.dims.dp_shard; }

// The model of the parallel run: built on meta, activation checkpointing, tensor parallelism,
// fully_shard (HSDP with dp_replicate) with mixed precision, then only this rank's shards
// allocated and drawn.
// With pipeline stages, this rank's stage holds the whole model's values for its FQNs (copied
// from the whole model, built eagerly: the demo's model is small), so that it trains from the
// weights of the one-process run; init_parameters on a stage draws other values.
template <class F>
typename F::CausalLM parallel_model(const Args& a, const typename F::Config& cfg, const hp::DeviceMesh& mesh) {
  typename F::CausalLM model{nullptr};
  const bool pipeline = a.dims.pp > 1;
  if (pipeline) {
    const typename F::CausalLM whole(cfg);
    model = F::stage(cfg, mesh.get_local_rank(0), a.dims.pp);
    at::NoGradGuard no_grad;
    auto values = whole->named_parameters();
    for (auto& p : model->named_parameters()) p.value().copy_(values[p.key()]);
  } else {
    hnn::ParameterScope meta(at::TensorOptions().device(at::kMeta));
    model = typename F::CausalLM(cfg);
  }
  hp::apply_activation_checkpointing(*model, a.ac);
  if (a.dims.tp > 1) F::parallelize_tp(*model, mesh["tp"], a.sequence_parallel, a.loss_parallel);
  if (a.dims.cp > 1) F::parallelize_cp(*model, mesh["cp"], a.cp_mode, a.cp_linear_mode);
  if (a.dims.dp_enabled()) {
    hp::FullyShardOptions o;
    if (a.mixed_precision == "bf16") o.mp_policy = {at::kBFloat16, at::kFloat, c10::nullopt, true};
    const hp::DeviceMesh dp = a.dims.dp_mesh(mesh);
    for (const auto& layer : *model->layers) hp::fully_shard(*layer, dp, o);
    if (o.mp_policy.param_dtype && model->lm_head) o.mp_policy.output_dtype = at::kFloat;  // the loss in float32
    hp::fully_shard(*model, dp, o);
  }
  if (!pipeline) hp::init_parameters(*model, at::Device(a.device));
  return model;
}

// Runs the training; with `mesh` as the job's plan, else as one process doing the same
// arithmetic: every data-parallel rank's rows in turn (with mixed precision, on a bfloat16 copy
// of the float32 weights), the gradients averaged in float32.
// Bit patterns, for records that compare runs exactly.
uint64_t bits_of(double v) {
  uint64_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
}

// FNV-1a over the bytes of every parameter and AdamW moment, gathered whole, in FQN order: each
// rank's digest of what it holds, combined in rank order (pipeline stages hold different FQNs).
uint64_t state_digest(torch::nn::Module& model, torch::optim::Optimizer& opt) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const at::Tensor& t) {
    const at::Tensor c = (hp::is_dtensor(t) ? hp::DTensor(t).full_tensor() : t).contiguous().cpu();
    const auto* p = static_cast<const uint8_t*>(c.data_ptr());
    for (int64_t i = 0; i < c.numel() * static_cast<int64_t>(c.element_size()); ++i) h = (h ^ p[i]) * 1099511628211ull;
  };
  std::set<const void*> seen;
  for (const auto& p : model.named_parameters()) {
    if (!seen.insert(p.value().unsafeGetTensorImpl()).second) continue;
    mix(p.value());
    auto it = opt.state().find(p.value().unsafeGetTensorImpl());
    if (it == opt.state().end()) continue;
    const auto& st = static_cast<const torch::optim::AdamWParamState&>(*it->second);
    mix(st.exp_avg());
    mix(st.exp_avg_sq());
    mix(at::tensor(st.step()));
  }
  at::Tensor all = at::zeros({hp::get_world_size()}, at::kLong);
  all[hp::get_rank()] = static_cast<int64_t>(h);
  hp::all_reduce_(all, hp::ReduceOp::SUM, hp::world_group());
  uint64_t out = 1469598103934665603ull;
  for (int64_t r = 0; r < all.numel(); ++r) out = (out ^ static_cast<uint64_t>(all[r].item<int64_t>())) * 1099511628211ull;
  return out;
}

// Bad training data (a damaged token file): the program exits with status 2, as for a bad flag,
// so that hprun does not restart it into the same sample.
struct BadData : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The batches of the run: --data's packed, shuffled token file read from its global sample
// counter (its state goes into the train state), else windows of the --text bytes chosen by the
// step alone.
struct Batches {
  Batches(const Args& a, const at::Tensor& text) : a(a), text(text) {
    if (!a.data.empty()) dataset.emplace(a.data, hp::data::TokenDatasetOptions{a.seq, a.batch, static_cast<uint64_t>(a.seed), a.config.vocab_size});
  }
  std::pair<at::Tensor, at::Tensor> at_step(int64_t step) {
    if (!dataset) return demo::batch_at(text, step, a);
    try {
      return dataset->next_batch(0, 1);
    } catch (const c10::ValueError& e) {
      throw BadData(e.what_without_backtrace());
    }
  }
  const Args& a;
  const at::Tensor& text;
  c10::optional<hp::data::TokenDataset> dataset;
};

template <class F>
std::vector<double> train(const Args& a, const typename F::Config& cfg, const at::Tensor& data, const c10::optional<hp::DeviceMesh>& mesh,
                          bool verbose, typename F::CausalLM* trained = nullptr) {
  at::manual_seed(a.seed);
  // The weights and the dropout masks: the same draws in both runs, at any layout.
  hp::manual_seed(static_cast<uint64_t>(a.seed));
  const at::Device device(a.device);  // an accelerator's current device: init_process_group chose it
  typename F::CausalLM model{nullptr};
  if (mesh) {
    model = parallel_model<F>(a, cfg, *mesh);
  } else {
    hnn::ParameterScope meta(at::TensorOptions().device(at::kMeta));
    model = typename F::CausalLM(cfg);
  }
  if (!mesh) {
    hp::apply_activation_checkpointing(*model, a.ac);
    hp::init_parameters(*model, device);
  }
  const int64_t dp = dp_degree(a);
  int64_t dp_rank = 0;
  if (mesh) dp_rank = mesh->get_local_rank(1) * a.dims.dp_shard + mesh->get_local_rank(2);
  // A tied weight once (hp::unique_parameters), so AdamW steps it once.
  // Two groups, as torchtitan builds them: weight decay on matrices, none on norms and biases.
  std::vector<at::Tensor> decayed, plain;
  for (const at::Tensor& p : hp::unique_parameters(*model)) (p.dim() >= 2 ? decayed : plain).push_back(p);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decayed, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(a.lr).weight_decay(0.01)));
  groups.emplace_back(plain, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(a.lr).weight_decay(0)));
  torch::optim::AdamW opt(std::move(groups));
  hp::LRScheduler schedule_lr = a.lr_schedule == "wsd" ? hp::linear_warmup_stable_decay(opt, a.wsd) : hp::constant_lr(opt);
  const bool bf16 = a.mixed_precision == "bf16";
  // Pipeline stages: this rank's stage and its schedule; the loss is on the last stage's ranks.
  std::unique_ptr<hp::PipelineStage> stage;
  std::unique_ptr<hp::PipelineSchedule> schedule;
  if (mesh && a.dims.pp > 1) {
    hp::PipelineStageOptions so;
    if (a.dims.tp > 1) so.device_mesh = (*mesh)["tp"];
    stage = std::make_unique<hp::PipelineStage>(model.ptr(), mesh->get_local_rank(0), a.dims.pp, mesh->get_group(0), so);
    schedule = std::make_unique<hp::PipelineSchedule>(
        std::vector<hp::PipelineStage*>{stage.get()}, a.microbatches,
        [](const at::Tensor& out, const at::Tensor& target) { return qwen3::causal_lm_loss(out, target); }, hp::schedule_kind(a.schedule));
  }
  std::vector<double> losses;
  Batches batches(a, data);
  // The parallel run is the one a user runs: it saves its train state every --checkpoint-every
  // steps and, started again with the same command line, goes on from the newest committed one.
  std::map<std::string, at::Tensor> extra;
  hp::TrainState state{model.get(), &opt, &schedule_lr, batches.dataset ? &*batches.dataset : nullptr, &extra};
  const bool checkpointing = mesh && !a.checkpoint_dir.empty();
  if (checkpointing && hp::has_train_state(a.checkpoint_dir)) {
    // A newest generation that does not verify (a flipped byte) is skipped for the one before.
    hp::TrainStateLoadOptions load_options;
    load_options.fall_back = true;
    hp::load_train_state(a.checkpoint_dir, state, load_options);
    const at::Tensor l = extra.at("losses");
    losses.assign(l.data_ptr<double>(), l.data_ptr<double>() + l.numel());
    if (verbose) std::printf("[parallel] resumed from the train state of step %lld in %s\n", static_cast<long long>(state.step), a.checkpoint_dir.c_str());
  }
  FILE* record = mesh && !a.record.empty() && hp::get_rank() == 0 ? std::fopen(a.record.c_str(), "a") : nullptr;
  const int64_t first_step = state.step;
  for (int64_t step = state.step; step < a.steps; ++step) {
    if (mesh) hp::fault_point("forward", step);
    auto [x_host, y_host] = batches.at_step(step);
    const at::Tensor x = x_host.to(device), y = y_host.to(device);
    hp::CommDebugMode comm;
    const auto t0 = std::chrono::steady_clock::now();
    opt.zero_grad();
    double value = 0, grad_norm = 0;
    if (mesh && schedule) {
      const at::Tensor rows_x = x.chunk(dp, 0)[dp_rank], rows_y = y.chunk(dp, 0)[dp_rank];
      const at::Tensor loss = schedule->step(stage->is_first() ? rows_x : at::Tensor(), stage->is_last() ? rows_y : at::Tensor());
      hp::fault_point("backward", step);  // (the schedule ran forward and backward together)
      // The last stage's ranks hold the loss: averaged over dp, then handed to every stage.
      at::Tensor l = stage->is_last() ? loss.to(at::kFloat).reshape({1}) : at::zeros({1}, at::kFloat);
      for (int64_t d : {1, 2}) hp::all_reduce_(l, hp::ReduceOp::AVG, mesh->get_group(d));
      hp::all_reduce_(l, hp::ReduceOp::SUM, mesh->get_group(0));
      value = l.item<double>();
      if (a.clip_grad_norm > 0) grad_norm = hp::clip_grad_norm_(hp::unique_parameters(*model), a.clip_grad_norm, 2.0, false, (*mesh)["pp"]).template item<double>();
    } else if (mesh && a.dims.cp > 1) {
      // This rank's shard of each sequence (Qwen3: chunks r and 2·cp-1-r; Qwen3.5: the r-th
      // contiguous part), its positions and labels alike; the gradients averaged over cp (and by
      // fully_shard over dp).
      const hp::DeviceMesh cp = (*mesh)["cp"];
      const auto shard = [&](const at::Tensor& t) { return hp::context_parallel_shard(t.chunk(dp, 0)[dp_rank], cp, 1, F::kCpLoadBalance); };
      const hnn::Kwargs positions{{"position_ids", hp::context_parallel_positions(x.size(1), cp, F::kCpLoadBalance).unsqueeze(0).to(device)}};
      at::Tensor loss = qwen3::causal_lm_loss(model(shard(x), positions), shard(y));
      hp::fault_point("backward", step);
      loss.backward();
      hp::all_reduce_gradients(*model, cp);
      at::Tensor l = loss.detach().to(at::kFloat).reshape({1});
      for (int64_t d : {1, 2, 3}) hp::all_reduce_(l, hp::ReduceOp::AVG, mesh->get_group(d));
      value = l.item<double>();
      if (a.clip_grad_norm > 0) grad_norm = hp::clip_grad_norm_(hp::unique_parameters(*model), a.clip_grad_norm).template item<double>();
    } else if (mesh) {
      at::Tensor loss = qwen3::causal_lm_loss(model(x.chunk(dp, 0)[dp_rank]), y.chunk(dp, 0)[dp_rank]);
      hp::fault_point("backward", step);
      loss.backward();
      at::Tensor l = loss.detach().to(at::kFloat).reshape({1});
      for (int64_t d : {1, 2}) hp::all_reduce_(l, hp::ReduceOp::AVG, mesh->get_group(d));
      value = l.item<double>();
      if (a.clip_grad_norm > 0) grad_norm = hp::clip_grad_norm_(hp::unique_parameters(*model), a.clip_grad_norm).template item<double>();
    } else {
      std::map<std::string, at::Tensor> grads;
      for (int64_t r = 0; r < dp; ++r) {
        typename F::CausalLM compute = model;
        if (bf16) {
          {
            hnn::ParameterScope meta(at::TensorOptions().device(at::kMeta));
            compute = typename F::CausalLM(cfg);
          }
          hp::to_empty(*compute, device);  // no draws: the copy of the weights fills it
          at::NoGradGuard no_grad;
          auto master = model->named_parameters();
          for (auto& p : compute->named_parameters()) p.value().copy_(master[p.key()]);
          compute->to(at::kBFloat16);
          hp::apply_activation_checkpointing(*compute, a.ac);
        }
        at::Tensor loss = qwen3::causal_lm_loss(compute(x.chunk(dp, 0)[r]).to(at::kFloat), y.chunk(dp, 0)[r]);
        if (!bf16 && dp == 1) {
          loss.backward();
          value = loss.item<double>();
          break;
        }
        const auto params = compute->named_parameters();
        std::vector<at::Tensor> ps;
        for (const auto& p : params) ps.push_back(p.value());
        const auto g = torch::autograd::grad({loss}, ps, {}, false, false, true);
        for (size_t k = 0; k < ps.size(); ++k) {
          if (!g[k].defined()) continue;
          const at::Tensor gk = g[k].to(at::kFloat) / static_cast<double>(dp);
          auto& acc = grads[params[k].key()];
          acc = acc.defined() ? acc + gk : gk;
        }
        value += loss.item<double>() / static_cast<double>(dp);
      }
      auto master = model->named_parameters();
      for (auto& [name, g] : grads) master[name].mutable_grad() = g;
      if (a.clip_grad_norm > 0) torch::nn::utils::clip_grad_norm_(hp::unique_parameters(*model), a.clip_grad_norm);
    }
    if (mesh) hp::fault_point("optimizer_step", step);
    const double lr = opt.param_groups()[0].options().get_lr();
    opt.step();
    schedule_lr.step();
    if (record != nullptr) {
      std::fprintf(record, "step %lld loss %016llx grad_norm %016llx lr %016llx\n", static_cast<long long>(step),
                   static_cast<unsigned long long>(bits_of(value)), static_cast<unsigned long long>(bits_of(grad_norm)),
                   static_cast<unsigned long long>(bits_of(lr)));
      std::fflush(record);
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    losses.push_back(value);
    state.step = step + 1;
    state.tokens_seen += a.batch * a.seq;
    if (checkpointing && a.checkpoint_every > 0 && (state.step % a.checkpoint_every == 0 || state.step == a.steps)) {
      extra["losses"] = at::tensor(losses, at::kDouble);
      hp::TrainStateSaveOptions so;
      so.keep = a.keep;
      hp::save_train_state(a.checkpoint_dir, state, so);
    }
    const bool progress = step == first_step || state.step == a.steps || state.step % a.log_freq == 0;
    if (verbose && progress) {
      std::printf("[%s] step %3lld  loss %.5f  %8.0f tokens/s  collectives: %s\n", mesh ? "parallel" : "single",
                  static_cast<long long>(step), value, a.batch * a.seq / secs, comm.summary().c_str());
      std::fflush(stdout);
    }
  }
  // Replicas that drifted apart (a gradient reduced over too few ranks) are an error here, not a
  // slow divergence of the loss curves later.
  if (mesh) hp::check_replicas_equal(*model, hp::world_group());
  if (mesh && !a.record.empty()) {
    const uint64_t digest = state_digest(*model, opt);
    if (record != nullptr) std::fprintf(record, "final %016llx\n", static_cast<unsigned long long>(digest));
  }
  if (record != nullptr) std::fclose(record);
  if (trained) *trained = model;
  return losses;
}

template <class F>
std::vector<int64_t> generated(const std::string& dir, const Args& a, const c10::optional<hp::DeviceMesh>& tp,
                               const std::vector<int64_t>& prompt, bool verbose) {
  hp::HFLoadReport load;
  const auto r = F::generate(dir, tp, a.device, prompt, a.new_tokens, load);
  if (verbose)
    std::printf("[%s] read %.1f KB of the checkpoint for %.1f KB of shards; prefill %.0f tokens/s, decode %.1f tokens/s\n",
                tp ? "tp" : "single", load.bytes_read / 1e3, load.local_bytes / 1e3, r.prefill_tokens / r.prefill_seconds,
                r.decode_steps / r.decode_seconds);
  return r.tokens[0];
}

}  // namespace

template <class F>
int run_family(Args a) {
  const typename F::Config cfg = F::config(a.config);
  const bool chief = hp::get_rank() == 0;
  // Every rank checks the same flags and stops the same way (none waits for another).
  try {
    a.dims = hp::ParallelDims::with_tp_rest(hp::get_world_size(), a.dims);
  } catch (const c10::ValueError& e) {
    usage(e.msg());  // the message alone: what() carries the C++ stack
  }
  if (a.model == "qwen3_5" && a.config.attention_dropout > 0) usage("--dropout: Qwen3.5's attention has no dropout");
  if (a.config.attention_dropout > 0 && dp_degree(a) > 1 && a.reference)
    usage("--dropout with data parallelism: the one-process reference cannot draw each data-parallel rank's masks (--reference 0 runs without it)");
  if (a.batch % dp_degree(a) != 0) usage("--batch must be divisible by the data-parallel degree");
  if (a.microbatches == 0) a.microbatches = 2 * a.dims.pp;
  if (a.dims.pp > 1 && (a.batch / dp_degree(a)) % a.microbatches != 0)
    usage("--batch per data-parallel rank must be divisible by --microbatches");
  if (a.dims.pp > 1 && a.config.num_layers < a.dims.pp) usage("--pp needs at least as many --layers as stages");
  if (a.model == "qwen3" && a.dims.cp > 1 && a.seq % (2 * a.dims.cp) != 0) usage("--seq must be a multiple of 2 x cp (head-tail load balancing)");
  if (a.model == "qwen3_5" && a.dims.cp > 1 && a.seq % a.dims.cp != 0) usage("--seq must be a multiple of cp");
  if (a.dims.cp > 1 && a.config.attention_dropout > 0) usage("--dropout with --cp: context parallelism does not draw attention dropout");
  if (a.dims.cp > 1 && a.dims.pp > 1) usage("--cp with --pp is not supported yet");
  auto mesh = a.dims.build_mesh(a.device);
  at::Tensor data;
  std::string source;
  if (a.data.empty()) {
    data = demo::load_bytes(a.text);
    if (data.numel() < a.seq + 2) usage("--seq " + std::to_string(a.seq) + " needs a text of more bytes than " + a.text + "'s " + std::to_string(data.numel()));
    source = "text " + a.text + " (" + std::to_string(data.numel()) + " bytes)";
  } else {
    const hp::data::TokenDataset probe(a.data, {a.seq, a.batch, static_cast<uint64_t>(a.seed), a.config.vocab_size});  // checked by parse
    source = "tokens " + a.data + " (" + std::to_string(probe.file_info().num_tokens) + " tokens in " +
             std::to_string(probe.file_info().num_documents) + " documents, " + std::to_string(probe.samples_per_epoch()) +
             " sequences per epoch)";
  }
  if (chief)
    std::printf("%s, %lld parameters; %s; %s%s, "
                "sequence_parallel=%d, dropout=%g, mixed precision %s, activation checkpointing %s, clip-grad-norm %g\n",
                F::describe(cfg).c_str(),
                static_cast<long long>([&] {
                  hnn::ParameterScope meta(at::TensorOptions().device(at::kMeta));
                  int64_t n = 0;
                  for (const auto& p : hp::unique_parameters(*typename F::CausalLM(cfg))) n += p.numel();
                  return n;
                }()),
                source.c_str(), a.dims.to_string().c_str(),
                a.dims.cp <= 1 ? ""
                : a.model == "qwen3_5" ? (" (attention " + a.cp_mode + ", linear attention " + a.cp_linear_mode + ")").c_str()
                                       : (" (" + a.cp_mode + ", load-balanced)").c_str(),
                a.sequence_parallel,
                a.config.attention_dropout, a.mixed_precision.c_str(), a.ac.to_string().c_str(), a.clip_grad_norm);
  const hp::DeviceMesh tp = mesh["tp"];
  typename F::CausalLM tp_model{nullptr};
  const std::vector<double> tp_losses = train<F>(a, cfg, data, mesh, chief, &tp_model);
  std::vector<double> single;
  if (chief && a.reference) single = train<F>(a, cfg, data, c10::nullopt, true);
  hp::barrier(hp::world_group());
  int rc = 0;
  if (chief && !a.reference) std::printf("final loss %.4f (parallel; --reference 0: no one-process run to compare with)\n", tp_losses.back());
  if (chief && a.reference) {
    std::ofstream csv(a.csv);
    csv << "step,loss_tp,loss_single\n";
    double max_diff = 0;
    for (size_t i = 0; i < tp_losses.size(); ++i) {
      csv << i << "," << tp_losses[i] << "," << single[i] << "\n";
      max_diff = std::max(max_diff, std::abs(tp_losses[i] - single[i]));
    }
    csv.close();
    std::printf("loss curves written to %s\n", a.csv.c_str());
    if (std::system("command -v gnuplot >/dev/null 2>&1") == 0) {
      const std::string png = a.csv.substr(0, a.csv.rfind('.')) + ".png";
      const std::string cmd = "gnuplot -e \"set terminal png size 800,500; set output '" + png +
                              "'; set termoption noenhanced; set datafile separator ','; set key autotitle columnhead; set xlabel 'step'; "
                              "set ylabel 'loss'; plot '" + a.csv + "' using 1:2 with lines lw 2, '' using 1:3 with "
                              "points pt 7\" 2>/dev/null";
      if (std::system(cmd.c_str()) == 0) std::printf("plot written to %s\n", png.c_str());
    }
    std::printf("final loss %.4f nats per token (parallel), %.4f (single)\n", tp_losses.back(), single.back());
    std::printf("max |loss_tp - loss_single| = %.3g\n", max_diff);
    if (a.mixed_precision == "bf16") {
      // bfloat16 rounds differently under another layout (partial sums, reduction order), and
      // the two trajectories drift apart as training goes on: the first steps agree closely, the
      // last within a few percent.
      double early = 0;
      for (size_t i = 0; i < std::min<size_t>(10, tp_losses.size()); ++i) early = std::max(early, std::abs(tp_losses[i] - single[i]));
      const double final_rel = std::abs(tp_losses.back() - single.back()) / std::abs(single.back());
      std::printf("bf16: max |loss_tp - loss_single| over the first 10 steps = %.3g, final losses differ by %.2f%%\n", early,
                  100 * final_rel);
      rc = early < 1e-2 && final_rel < 0.05 ? 0 : 1;
    } else {
      rc = max_diff < 1e-3 ? 0 : 1;
    }
  }
  if (a.dims.pp > 1 || a.dims.cp > 1) {
    // Each rank holds one stage: a consolidated HF save of every stage is not written yet.
    // Context parallelism trains on shards of whole sequences; decoding (one position at a time
    // against a cache) does not split a sequence.
    if (chief)
      std::printf("%s: the HF save and the generation that follows it are skipped\n",
                  a.dims.pp > 1 ? "pipeline stages" : "context parallelism");
    hp::barrier(hp::world_group());
    hp::destroy_process_group();
    return rc;
  }
  if (!a.data.empty() && a.tokenizer.empty()) {
    if (chief) std::printf("--data without --tokenizer: the HF save and the generation that follows it are skipped\n");
    hp::barrier(hp::world_group());
    hp::destroy_process_group();
    return rc;
  }
  // The trained model as an HF checkpoint, then generation from it: with TP (no sequence
  // parallelism now: decoding goes one position at a time), and in one process.
  std::string tokenizer_json = hyper_parallel::models::byte_tokenizer_json();
  if (!a.tokenizer.empty()) {
    std::ifstream in(a.tokenizer, std::ios::binary);
    tokenizer_json.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const auto saved = F::save(*tp_model, a.save, tokenizer_json);
  const auto tok = hyper_parallel::models::Tokenizer::from_file(a.save + "/tokenizer.json");
  const std::vector<int64_t> prompt = tok.encode(a.prompt);
  if (chief)
    std::printf("saved %s (%zu file(s), each rank wrote its own shards: rank 0 %.1f KB)\n", a.save.c_str(), saved.files.size(),
                saved.bytes_written / 1e3);
  const auto tp_tokens = generated<F>(a.save, a, tp, prompt, chief);
  if (chief) {
    const auto single_tokens = generated<F>(a.save, a, c10::nullopt, prompt, true);
    std::printf("prompt: \"%s\"\n[tp]     %s\n[single] %s\n", a.prompt.c_str(), tok.decode(tp_tokens).c_str(),
                tok.decode(single_tokens).c_str());
    // The ids as well, for a check with another library (tests/tools/demo_vs_transformers.sh).
    auto ids = [](const std::vector<int64_t>& v) {
      std::string s;
      for (int64_t t : v) s += (s.empty() ? "" : ",") + std::to_string(t);
      return s;
    };
    std::printf("prompt ids: %s\ngenerated ids: %s\n", ids(prompt).c_str(), ids(tp_tokens).c_str());
    const bool same = tp_tokens == single_tokens;
    std::printf("generated tokens: tp and one process %s\n", same ? "agree" : "DIFFER");
    if (!same) rc = 1;
  }
  hp::barrier(hp::world_group());
  hp::destroy_process_group();
  return rc;
}

int run(int argc, char** argv) {
  const Args a = demo::parse(argc, argv);
  hp::InitOptions init;
  init.device_type = a.device;
  hp::init_process_group(init);
  return a.model == "qwen3_5" ? run_family<demo::Qwen3_5Family>(a) : run_family<demo::Qwen3Family>(a);
}

int main(int argc, char** argv) {
  bool bad_data = false;
  const int status = hyper_parallel::run_program([&] {
    try {
      return run(argc, argv);
    } catch (const BadData&) {
      bad_data = true;
      throw;
    }
  });
  return bad_data ? 2 : status;
}
