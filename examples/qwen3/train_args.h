#pragma once
// The demo's command line (qwen3_train --help lists it) and its data: byte-level tokens of a text
// file, the same windows on every rank and in the one-process run.
#include <ATen/ATen.h>

#include <hyper_parallel/hyper_parallel.h>
#include <hyper_parallel/optim/lr_scheduler.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

#include <hyper_parallel/models/qwen3/model.h>

namespace demo {
namespace hp = hyper_parallel;
namespace qwen3 = hyper_parallel::qwen3;

struct Args {
  std::string model = "qwen3";  // or qwen3_5: the hybrid Gated DeltaNet + gated attention family
  bool layers_given = false;
  // The sizes of either family (Qwen3_5Family::config maps them onto Qwen3.5's hybrid layers).
  qwen3::Config config;
  // Enough to learn the text's most repeated phrase in about 20 s on two CPU cores.
  int64_t steps = 300, batch = 8, seq = 128, seed = 1234;
  double lr = 1e-2;
  // The learning rate per step: constant, or torchtitan's linear warmup, stable, decay ("wsd").
  std::string lr_schedule = "constant";
  hp::WarmupStableDecayOptions wsd;
  bool sequence_parallel = true, loss_parallel = false;
  std::string text = "/usr/share/common-licenses/GPL-3";
  std::string csv = "qwen3_losses.csv";
  std::string device = "cpu";
  std::string save = "qwen3_demo_model";
  std::string prompt = "the GNU General Public";
  int64_t new_tokens = 8;
  // The canonical mesh's degrees (mesh/parallel_dims.h): tp takes the rest of the world.
  hp::ParallelDims dims;
  std::string mixed_precision = "none";  // or bf16: bf16 gathers and compute, fp32 master and reduction
  hp::ActivationCheckpointPolicy ac = hp::ActivationCheckpointPolicy::none();
  double clip_grad_norm = 0.0;  // 0: no clipping
  // Pipeline (--pp N): the schedule and how many microbatches a data-parallel rank's rows split into.
  std::string schedule = "1f1b";
  int64_t microbatches = 0;  // 0: 2 * pp
  // Context parallelism (--cp N): each sequence split over N ranks, head-tail load-balanced.
  std::string cp_mode = "ring";
  std::string cp_linear_mode = "all_gather";  // Qwen3.5's Gated DeltaNet layers: any head count
  // A training run as users run one: a token file of hp_tokenize's (else the --text bytes), its
  // tokenizer for the HF save, and train states every K steps in D, resumed from on start.
  std::string data, tokenizer, checkpoint_dir, record;
  int64_t checkpoint_every = 0, keep = 2;
  // One progress line every N steps (torchtitan's metrics.log_freq), plus the first and the last.
  int64_t log_freq = 20;
  bool reference = true;  // the one-process run the parallel losses are compared with
};

constexpr const char* kFlags =
    "flags: --model qwen3|qwen3_5 (qwen3_5: every 4th layer gated attention, the others Gated DeltaNet)\n"
    "       --steps N --batch N --seq N --layers N --hidden N --intermediate N --heads N --kv-heads N\n"
    "       --head-dim N (even) --lr X --seed N --sequence-parallel 0|1 --loss-parallel 0|1 --text FILE --csv FILE\n"
    "       --dropout P (attention dropout while training, the same mask at every tp; default 0)\n"
    "       --log-freq N (a progress line every N steps, and the first and last; default 20)\n"
    "       --device cpu|cuda (the process group, the mesh and both runs on it; default cpu)\n"
    "       --save DIR (the HF checkpoint; default qwen3_demo_model) --prompt TEXT --new-tokens N\n"
    "       --dp N (fully_shard's degree) --dp-replicate N (HSDP replicas); tp takes the rest of the world\n"
    "       --mixed-precision none|bf16 --activation-checkpointing none|selective|full|full:N --clip-grad-norm X\n"
    "       --pp N (pipeline stages) --schedule gpipe|1f1b --microbatches M (default 2 x pp)\n"
    "       --cp N (context parallelism: each sequence split over N ranks) --cp-mode ring|ulysses|allgather_kv\n"
    "       --cp-linear-mode all_gather|p2p|ulysses (Qwen3.5's Gated DeltaNet layers under --cp; default all_gather)\n"
    "       --lr-schedule constant|wsd (wsd: --warmup-steps N --decay-ratio X --decay-type linear|sqrt|cosine --lr-min X,\n"
    "       torchtitan's linear warmup, stable, decay over --steps; lr-min a factor of --lr)\n"
    "       --vocab N (the model's vocabulary; default 256, the bytes of --text)\n"
    "       --data FILE.tokens (hp_tokenize's token file, packed and shuffled by --seed, instead of --text)\n"
    "       --tokenizer FILE (the tokenizer.json saved with the model; with --data, no HF save without it)\n"
    "       --checkpoint-dir D --checkpoint-every K --keep N (train states every K steps, the newest N kept; a\n"
    "       run resumes from D's newest committed one on its own, at any parallel layout)\n"
    "       --record FILE (appends each step's loss, gradient norm and learning rate as bit patterns and the\n"
    "       final state's digest) --reference 0|1 (the one-process comparison run; default 1)\n"
    "       --help (this text)\n";

[[noreturn]] inline void usage(const std::string& msg) {
  std::cerr << "qwen3_train: " << msg << "\n" << kFlags;
  std::exit(2);
}

// The whole of `v` as an integer of at least `lo`, or the usage naming the flag.
inline int64_t integer_flag(const std::string& f, const std::string& v, int64_t lo) {
  size_t used = 0;
  int64_t x = 0;
  try {
    x = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v.size() || x < lo) usage(f + " needs an integer >= " + std::to_string(lo) + ", got '" + v + "'");
  return x;
}

// The whole of `v` as a finite number, or the usage naming the flag.
inline double number_flag(const std::string& f, const std::string& v) {
  size_t used = 0;
  double x = 0;
  try {
    x = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v.size() || !std::isfinite(x)) usage(f + " needs a number, got '" + v + "'");
  return x;
}

inline Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::cout << "qwen3_train: trains a model in parallel and in one process, compares the losses, saves and generates\n" << kFlags;
      std::exit(0);
    }
  for (int i = 1; i < argc; i += 2) {
    const std::string f = argv[i];
    if (i + 1 >= argc) usage("flag " + f + " needs a value");
    const std::string v = argv[i + 1];
    auto num = [&](int64_t lo = 1) { return integer_flag(f, v, lo); };
    if (f == "--steps") a.steps = num();
    else if (f == "--batch") a.batch = num();
    else if (f == "--seq") a.seq = num(2);  // an input and its next-token target
    else if (f == "--layers") {
      a.config.num_layers = num();
      a.layers_given = true;
    } else if (f == "--model") {
      if (v != "qwen3" && v != "qwen3_5") usage("--model is qwen3 or qwen3_5, got '" + v + "'");
      a.model = v;
    }
    else if (f == "--hidden") a.config.hidden_size = num();
    else if (f == "--intermediate") a.config.intermediate_size = num();
    else if (f == "--heads") a.config.num_heads = num();
    else if (f == "--kv-heads") a.config.num_kv_heads = num();
    else if (f == "--head-dim") a.config.head_dim = num();
    else if (f == "--seed") a.seed = num(0);
    else if (f == "--lr-schedule") {
      if (v != "constant" && v != "wsd") usage("--lr-schedule is constant or wsd, got '" + v + "'");
      a.lr_schedule = v;
    } else if (f == "--warmup-steps") a.wsd.warmup_steps = num(0);
    else if (f == "--decay-ratio") a.wsd.decay_ratio = number_flag(f, v);
    else if (f == "--decay-type") a.wsd.decay_type = v;
    else if (f == "--lr-min") a.wsd.lr_min = number_flag(f, v);
    else if (f == "--lr") {
      a.lr = number_flag(f, v);
      if (!(a.lr > 0)) usage("--lr needs a positive number, got '" + v + "'");
    }
    else if (f == "--dropout") {
      a.config.attention_dropout = number_flag(f, v);
      if (!(a.config.attention_dropout >= 0.0 && a.config.attention_dropout < 1.0)) usage("--dropout must be in [0, 1), got '" + v + "'");
    }
    else if (f == "--sequence-parallel" || f == "--loss-parallel") {
      if (v != "0" && v != "1") usage(f + " is 0 or 1, got '" + v + "'");
      (f == "--sequence-parallel" ? a.sequence_parallel : a.loss_parallel) = v == "1";
    }
    else if (f == "--text") a.text = v;
    else if (f == "--vocab") a.config.vocab_size = num();
    else if (f == "--data") a.data = v;
    else if (f == "--tokenizer") a.tokenizer = v;
    else if (f == "--checkpoint-dir") a.checkpoint_dir = v;
    else if (f == "--checkpoint-every") a.checkpoint_every = num();
    else if (f == "--log-freq") a.log_freq = num();
    else if (f == "--keep") a.keep = num();
    else if (f == "--record") a.record = v;
    else if (f == "--reference") {
      if (v != "0" && v != "1") usage("--reference is 0 or 1, got '" + v + "'");
      a.reference = v == "1";
    }
    else if (f == "--csv") a.csv = v;
    else if (f == "--device") {
      if (v != "cpu" && v != "cuda") usage("--device is cpu or cuda, got '" + v + "'");
      a.device = v;
    }
    else if (f == "--save") a.save = v;
    else if (f == "--prompt") a.prompt = v;
    else if (f == "--new-tokens") a.new_tokens = num();
    else if (f == "--dp") a.dims.dp_shard = num();
    else if (f == "--pp") a.dims.pp = num();
    else if (f == "--cp") a.dims.cp = num();
    else if (f == "--cp-linear-mode") {
      if (v != "all_gather" && v != "p2p" && v != "ulysses") usage("--cp-linear-mode is all_gather, p2p or ulysses, got '" + v + "'");
      a.cp_linear_mode = v;
    } else if (f == "--cp-mode") {
      if (v != "ring" && v != "ulysses" && v != "allgather_kv") usage("--cp-mode is ring, ulysses or allgather_kv, got '" + v + "'");
      a.cp_mode = v;
    }
    else if (f == "--microbatches") a.microbatches = num();
    else if (f == "--schedule") {
      if (v != "gpipe" && v != "1f1b") usage("--schedule is gpipe or 1f1b, got '" + v + "'");
      a.schedule = v;
    }
    else if (f == "--dp-replicate") a.dims.dp_replicate = num();
    else if (f == "--mixed-precision") {
      if (v != "none" && v != "bf16") usage("--mixed-precision is none or bf16, got '" + v + "'");
      a.mixed_precision = v;
    } else if (f == "--activation-checkpointing") {
      try {
        a.ac = hp::ActivationCheckpointPolicy::parse(v);
      } catch (const c10::ValueError&) {
        usage("--activation-checkpointing is none, selective, full or full:N, got '" + v + "'");
      }
    } else if (f == "--clip-grad-norm") {
      a.clip_grad_norm = number_flag(f, v);
      if (!(a.clip_grad_norm >= 0.0)) usage("--clip-grad-norm must be >= 0, got '" + v + "'");
    }
    else usage("unknown flag " + f);
  }
  if (a.checkpoint_every > 0 && a.checkpoint_dir.empty()) usage("--checkpoint-every needs --checkpoint-dir");
  if (!a.data.empty() && !std::ifstream(a.data)) usage("--data: cannot read " + a.data);
  if (!a.data.empty()) {
    // The token file checked now, before any work: a bad file, a vocabulary larger than the model's.
    try {
      hp::data::TokenDataset probe(a.data, {a.seq, a.batch, static_cast<uint64_t>(a.seed), a.config.vocab_size});
    } catch (const c10::ValueError& e) {
      usage("--data: " + e.msg() + (e.msg().find("larger than the model's") != std::string::npos ? " (--vocab)" : ""));
    }
  }
  if (!a.tokenizer.empty() && !std::ifstream(a.tokenizer)) usage("--tokenizer: cannot read " + a.tokenizer);
  // Qwen3.5's published schedule needs 4 layers to hold both kinds.
  if (a.model == "qwen3_5" && !a.layers_given) a.config.num_layers = 4;
  // The schedule's options, checked as the schedule will check them.
  a.wsd.training_steps = a.steps;
  if (a.lr_schedule == "wsd") {
    try {
      hp::warmup_stable_decay_factor(a.wsd, 0);
    } catch (const c10::ValueError& e) {
      usage(std::string("--lr-schedule wsd: ") + e.msg());
    }
  }
  // What the model needs of the sizes, before any work.
  if (a.config.num_heads % a.config.num_kv_heads != 0)
    usage("--heads (" + std::to_string(a.config.num_heads) + ") must be a multiple of --kv-heads (" + std::to_string(a.config.num_kv_heads) + ")");
  if (a.config.head_dim % 2 != 0) usage("--head-dim must be even (rotary embedding pairs its dims), got " + std::to_string(a.config.head_dim));
  return a;
}

inline at::Tensor load_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) usage("cannot read the text file " + path);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  at::Tensor t = at::empty({static_cast<int64_t>(s.size())}, at::kLong);
  auto* p = t.data_ptr<int64_t>();
  for (size_t i = 0; i < s.size(); ++i) p[i] = static_cast<unsigned char>(s[i]);
  return t;
}

// Batch `step`: the same windows of the text on every rank and in the single-process run.
inline std::pair<at::Tensor, at::Tensor> batch_at(const at::Tensor& data, int64_t step, const Args& a) {
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

}  // namespace demo
