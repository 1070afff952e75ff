// The main demo: trains the Qwen3-style model with tensor parallelism (run it under hprun), then
// the same training in one process from the same seed, and compares the two loss curves. Then it
// saves the trained model as a Hugging Face checkpoint (safetensors, config.json, a byte-level
// tokenizer.json), loads it back with another TP layout, generates a continuation of a prompt, and
// does the same in one process: the tokens must be the same.
//   build/tools/hprun/hprun --nproc-per-node 2 build/examples/qwen3/qwen3_train [--steps 30] ...
// Text: byte-level tokens of --text (default: the GPL-3 text every Debian system ships).
#include <ATen/ATen.h>
#include <torch/optim.h>

#include <hyper_parallel/hyper_parallel.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

#include <hyper_parallel/models/qwen3/generate.h>
#include <hyper_parallel/models/qwen3/model.h>
#include <hyper_parallel/models/qwen3/parallelize.h>
#include <hyper_parallel/models/qwen3/pretrained.h>
#include <hyper_parallel/models/qwen3/tokenizer.h>

namespace qwen3 = hyper_parallel::qwen3;

namespace hp = hyper_parallel;
namespace hnn = hyper_parallel::nn;

namespace {

struct Args {
  qwen3::Config config;
  int64_t steps = 30, batch = 4, seq = 64, seed = 1234;
  double lr = 3e-3;
  bool sequence_parallel = true, loss_parallel = false;
  std::string text = "/usr/share/common-licenses/GPL-3";
  std::string csv = "qwen3_losses.csv";
  std::string device = "cpu";
  std::string save = "qwen3_demo_model";
  std::string prompt = "This program is free software";
  int64_t new_tokens = 48;
};

[[noreturn]] void usage(const std::string& msg) {
  std::cerr << "qwen3_train: " << msg << "\n"
            << "flags: --steps N --batch N --seq N --layers N --hidden N --intermediate N --heads N --kv-heads N\n"
            << "       --head-dim N --lr X --seed N --sequence-parallel 0|1 --loss-parallel 0|1 --text FILE --csv FILE\n"
            << "       --dropout P (attention dropout while training, the same mask at every tp; default 0)\n"
            << "       --device cpu|cuda (the process group, the mesh and both runs on it; default cpu)\n"
            << "       --save DIR (the HF checkpoint; default qwen3_demo_model) --prompt TEXT --new-tokens N\n";
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; i += 2) {
    const std::string f = argv[i];
    if (i + 1 >= argc) usage("flag " + f + " needs a value");
    const std::string v = argv[i + 1];
    auto num = [&] {
      try {
        return std::stoll(v);
      } catch (...) {
        usage("flag " + f + " needs an integer, got '" + v + "'");
      }
    };
    if (f == "--steps") a.steps = num();
    else if (f == "--batch") a.batch = num();
    else if (f == "--seq") a.seq = num();
    else if (f == "--layers") a.config.num_layers = num();
    else if (f == "--hidden") a.config.hidden_size = num();
    else if (f == "--intermediate") a.config.intermediate_size = num();
    else if (f == "--heads") a.config.num_heads = num();
    else if (f == "--kv-heads") a.config.num_kv_heads = num();
    else if (f == "--head-dim") a.config.head_dim = num();
    else if (f == "--seed") a.seed = num();
    else if (f == "--lr") a.lr = std::stod(v);
    else if (f == "--dropout") {
      try {
        a.config.attention_dropout = std::stod(v);
      } catch (...) {
        usage("flag --dropout needs a number, got '" + v + "'");
      }
      if (!(a.config.attention_dropout >= 0.0 && a.config.attention_dropout < 1.0)) usage("--dropout must be in [0, 1)");
    }
    else if (f == "--sequence-parallel") a.sequence_parallel = num() != 0;
    else if (f == "--loss-parallel") a.loss_parallel = num() != 0;
    else if (f == "--text") a.text = v;
    else if (f == "--csv") a.csv = v;
    else if (f == "--device") a.device = v;
    else if (f == "--save") a.save = v;
    else if (f == "--prompt") a.prompt = v;
    else if (f == "--new-tokens") a.new_tokens = num();
    else usage("unknown flag " + f);
  }
  return a;
}

at::Tensor load_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) usage("cannot read the text file " + path);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  at::Tensor t = at::empty({static_cast<int64_t>(s.size())}, at::kLong);
  auto* p = t.data_ptr<int64_t>();
  for (size_t i = 0; i < s.size(); ++i) p[i] = static_cast<unsigned char>(s[i]);
  return t;
}

// Batch `step`: the same windows of the text on every rank and in the single-process run.
std::pair<at::Tensor, at::Tensor> batch_at(const at::Tensor& data, int64_t step, const Args& a) {
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(a.seed + step));
  at::Tensor starts = at::randint(data.numel() - a.seq - 1, {a.batch}, gen, at::kLong);
  std::vector<at::Tensor> xs, ys;
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t s = starts[b].item<int64_t>();
    xs.push_back(data.narrow(0, s, a.seq));
    ys.push_back(data.narrow(0, s + 1, a.seq));
  }
  return {at::stack(xs), at::stack(ys)};
}

std::vector<double> train(const Args& a, const at::Tensor& data, const c10::optional<hp::DeviceMesh>& tp, bool verbose,
                          qwen3::CausalLM* trained = nullptr) {
  at::manual_seed(a.seed);
  // The weights and the dropout masks: the same draws in both runs, at any tp.
  hp::manual_seed(static_cast<uint64_t>(a.seed));
  // Shapes first, then the plan, then only this rank's shards allocated and drawn.
  qwen3::CausalLM model{nullptr};
  {
    hnn::ParameterScope meta(at::TensorOptions().device(at::kMeta));
    model = qwen3::CausalLM(a.config);
  }
  if (tp) qwen3::parallelize_qwen3_tp(*model, *tp, a.sequence_parallel, a.loss_parallel);
  const at::Device device(a.device);  // an accelerator's current device: init_process_group chose it
  hp::init_parameters(*model, device);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(a.lr).weight_decay(0.01));
  std::vector<double> losses;
  for (int64_t step = 0; step < a.steps; ++step) {
    auto [x_host, y_host] = batch_at(data, step, a);
    const at::Tensor x = x_host.to(device), y = y_host.to(device);
    hp::CommDebugMode comm;
    const auto t0 = std::chrono::steady_clock::now();
    at::Tensor loss = qwen3::causal_lm_loss(model(x), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
    const double value = loss.item<double>();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    losses.push_back(value);
    if (verbose) {
      std::printf("[%s] step %3lld  loss %.5f  %8.0f tokens/s  collectives: %s\n", tp ? "tp" : "single",
                  static_cast<long long>(step), value, a.batch * a.seq / secs, comm.summary().c_str());
      std::fflush(stdout);
    }
  }
  if (trained) *trained = model;
  return losses;
}

std::vector<int64_t> generated(const std::string& dir, const Args& a, const c10::optional<hp::DeviceMesh>& tp,
                               const std::vector<int64_t>& prompt, bool verbose) {
  auto loaded = qwen3::from_pretrained(dir, tp, at::kFloat, a.device);
  qwen3::GenerationConfig g;
  g.max_new_tokens = a.new_tokens;
  const auto r = qwen3::generate(*loaded.model, {prompt}, g);
  if (verbose)
    std::printf("[%s] read %.1f KB of the checkpoint for %.1f KB of shards; prefill %.0f tokens/s, decode %.1f tokens/s\n",
                tp ? "tp" : "single", loaded.load.bytes_read / 1e3, loaded.load.local_bytes / 1e3, r.prefill_tokens / r.prefill_seconds,
                r.decode_steps / r.decode_seconds);
  return r.tokens[0];
}

}  // namespace

int run(int argc, char** argv) {
  Args a = parse(argc, argv);
  hp::InitOptions init;
  init.device_type = a.device;
  hp::init_process_group(init);
  const bool chief = hp::get_rank() == 0;
  auto tp = hp::init_device_mesh(a.device, {hp::get_world_size()}, {"tp"});
  at::Tensor data = load_bytes(a.text);
  if (chief)
    std::printf("qwen3: %lld layers, hidden %lld, heads %lld/%lld kv, %lld parameters; text %s (%lld bytes); tp=%lld, "
                "sequence_parallel=%d, dropout=%g\n",
                static_cast<long long>(a.config.num_layers), static_cast<long long>(a.config.hidden_size),
                static_cast<long long>(a.config.num_heads), static_cast<long long>(a.config.num_kv_heads),
                static_cast<long long>([&] {
                  hnn::ParameterScope meta(at::TensorOptions().device(at::kMeta));
                  int64_t n = 0;
                  for (const auto& p : qwen3::CausalLM(a.config)->parameters()) n += p.numel();
                  return n;
                }()),
                a.text.c_str(), static_cast<long long>(data.numel()), static_cast<long long>(tp.size()), a.sequence_parallel,
                a.config.attention_dropout);
  qwen3::CausalLM tp_model{nullptr};
  const std::vector<double> tp_losses = train(a, data, tp, chief, &tp_model);
  std::vector<double> single;
  if (chief) single = train(a, data, c10::nullopt, true);
  hp::barrier(hp::world_group());
  int rc = 0;
  if (chief) {
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
    std::printf("max |loss_tp - loss_single| = %.3g\n", max_diff);
    rc = max_diff < 1e-3 ? 0 : 1;
  }
  // The trained model as an HF checkpoint, then generation from it: with TP (no sequence
  // parallelism now: decoding goes one position at a time), and in one process.
  const auto saved = qwen3::save_pretrained(*tp_model, a.save, qwen3::byte_tokenizer_json());
  const auto tok = qwen3::Tokenizer::from_file(a.save + "/tokenizer.json");
  const std::vector<int64_t> prompt = tok.encode(a.prompt);
  if (chief)
    std::printf("saved %s (%zu file(s), each rank wrote its own shards: rank 0 %.1f KB)\n", a.save.c_str(), saved.files.size(),
                saved.bytes_written / 1e3);
  const auto tp_tokens = generated(a.save, a, tp, prompt, chief);
  if (chief) {
    const auto single_tokens = generated(a.save, a, c10::nullopt, prompt, true);
    std::printf("prompt: \"%s\"\n[tp]     %s\n[single] %s\n", a.prompt.c_str(), tok.decode(tp_tokens).c_str(),
                tok.decode(single_tokens).c_str());
    const bool same = tp_tokens == single_tokens;
    std::printf("generated tokens: tp and one process %s\n", same ? "agree" : "DIFFER");
    if (!same) rc = 1;
  }
  hp::barrier(hp::world_group());
  hp::destroy_process_group();
  return rc;
}

int main(int argc, char** argv) {
  return hyper_parallel::run_program([&] { return run(argc, argv); });
}
